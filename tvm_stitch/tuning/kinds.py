"""The kinds of the tuning machinery, apart from it, so that a database can be read without
importing runners or models."""

from __future__ import annotations

from enum import StrEnum


class RunnerKind(StrEnum):
    """Where candidates are measured."""

    LOCAL = "local"  # a CUDA GPU of this machine, through MetaSchedule's LocalRunner
    RPC = "rpc"  # a GPU behind TVM's RPC tracker, through MetaSchedule's RPCRunner
    SIMT = "simt"  # the CPU SIMT runner: CPU times, which test the machinery only


class ModelKind(StrEnum):
    """The cost models there are."""

    ANALYTIC = "analytic"  # the roofline estimate of the candidate's counted traffic
    XGBOOST = "xgboost"  # learned from measured records
