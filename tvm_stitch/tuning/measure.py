"""Measuring candidate kernels: the time of one launch of a GPU-scheduled PrimFunc.

Three runners, one interface (``Runner.measure``):

- ``SimtRunner`` runs the kernel on the CPU SIMT runner (PoCL) in a worker process: it needs
  no GPU, and its times are CPU times, for tests and dry runs of the tuner, never a GPU speed;
- ``LocalRunner`` builds with MetaSchedule's ``LocalBuilder`` and times with its
  ``LocalRunner`` on the local CUDA GPU;
- ``RPCRunner`` builds the same way and times with MetaSchedule's ``RPCRunner`` on a server
  that TVM's RPC tracker hands out: a remote GPU, or with ``simt=True`` a server that times
  on its SIMT runner through the global function ``SIMT_FUNCTION`` registered by importing
  this module (``tvm.rpc.Server(..., server_init_callback=...)`` must import it).

Every buffer parameter gets random values, except the grid-barrier state of a Global-stitched
kernel (``zeroed_params``), which must be zero when the first launch starts; every completed
barrier leaves it at zero again, so repeated launches need no reset.
"""

from __future__ import annotations

import abc
import functools
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Self

import numpy as np
import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir import IRModule
from tvm.s_tir import meta_schedule as ms
from tvm.support.popen_pool import PopenPoolExecutor, StatusKind
from tvm.target import Target

from ..lowering import LoweringError, lower
from ..schedule.grid_barrier import is_grid_sync
from ..simt import SimtFunction
from .kinds import RunnerKind

SIMT_FUNCTION = "tvm_stitch.tuning.simt_seconds"
"""Global function timing a kernel on the SIMT runner: ``(artifact path, runs, *tensors) ->
mean seconds of one run``; registered by importing this module."""

SEED = 0
"""Seed of the random inputs: every candidate of a task sees the same values."""


@dataclass(frozen=True)
class MeasureInput:
    """One candidate kernel: the caller's ``key`` for it, its GPU-scheduled PrimFunc (thread
    bindings in place, static shapes) and the CUDA target it was scheduled for."""

    key: str
    func: tirx.PrimFunc
    target: Target


@dataclass(frozen=True)
class MeasureResult:
    """The time of one run of the candidate ``key`` (a mean over runs; the SIMT runner's
    fastest such mean), or None and why it failed."""

    key: str
    seconds: float | None
    error: str = ""


@dataclass(frozen=True)
class BuildResult:
    """A candidate built for a MetaSchedule runner: the path of its artifact, or None and
    why it failed."""

    key: str
    artifact: str | None
    error: str = ""


class Runner(abc.ABC):
    """Times candidate kernels; never raises for a candidate that fails, but reports it in
    its ``MeasureResult``. Use it as a context manager, or call ``close``, to stop its worker
    processes."""

    kind: ClassVar[RunnerKind]

    @abc.abstractmethod
    def measure(self, inputs: Sequence[MeasureInput]) -> list[MeasureResult]:
        """One result per input, in order."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop the runner's worker processes."""

    def __enter__(self) -> Self:
        """The runner itself."""
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        """``close``."""
        self.close()


def zeroed_params(func: tirx.PrimFunc) -> tuple[str, ...]:
    """Names of the parameters of ``func`` that must be all zeros before its first launch:
    the state buffers its grid barriers synchronise on."""
    synced: list[tvm.ir.Var] = []

    def on_evaluate(stmt: tirx.Evaluate) -> None:
        if is_grid_sync(stmt):
            tvm_ffi.structural_walk(stmt.value, [(tvm.ir.Var, synced.append)])

    tvm_ffi.structural_walk(func.body, [(tirx.Evaluate, on_evaluate)])
    return tuple(p.name for p in func.params if any(p.same_as(v) for v in synced))


def zeroed_indices(func: tirx.PrimFunc) -> tuple[int, ...]:
    """Positions of the ``zeroed_params`` among the parameters of ``func``."""
    zeroed = set(zeroed_params(func))
    return tuple(i for i, p in enumerate(func.params) if p.name in zeroed)


def random_array(dtype: str, shape: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    """Random values for an input buffer: floats uniform in [-1, 1), integers 0 or 1 (valid
    indices of any non-empty axis), booleans either."""
    kind = np.dtype(dtype)
    if kind == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(kind, np.integer):
        return rng.integers(0, 2, shape).astype(kind)
    return rng.uniform(-1.0, 1.0, shape).astype(kind)


def arguments(func: tirx.PrimFunc, seed: int = SEED) -> list[np.ndarray]:
    """One array per buffer parameter of ``func``: random (``random_array``), zeros for the
    ``zeroed_params``."""
    return _arrays([(str(p.dtype), [int(d) for d in p.shape]) for p in func.params],
                   zeroed_indices(func), np.random.default_rng(seed))


def _arrays(specs: Sequence[tuple[str, Sequence[int]]], zeroed: Sequence[int],
            rng: np.random.Generator) -> list[np.ndarray]:
    return [np.zeros(shape, dtype) if i in zeroed else random_array(dtype, shape, rng)
            for i, (dtype, shape) in enumerate(specs)]


def serialize(func: tirx.PrimFunc) -> str:
    """``func`` as text that ``deserialize`` reads back. TVM's JSON, not TVMScript: printed
    and parsed again, a stitched kernel's buffer types come back different."""
    return tvm.ir.save_json(func)


def deserialize(text: str) -> tirx.PrimFunc:
    """The PrimFunc ``serialize`` wrote."""
    return tvm.ir.load_json(text)


def _mean_seconds(simt: SimtFunction, arrays: Sequence[np.ndarray], runs: int) -> float:
    """Mean CPU seconds of this process (PoCL's threads included) of ``runs`` calls, after
    one call that PoCL spends compiling the kernels for their work-group sizes. CPU time, not
    wall-clock: with other processes on the cores the wall-clock time of a candidate depends
    on when it ran, and two timings of the same candidates ranked them alike by a Kendall tau
    of 0.3-0.6 against 0.5-0.8 for CPU time (2 cores, 72 candidates)."""
    simt(*arrays)
    start = time.process_time()
    for _ in range(runs):
        simt(*arrays)
    return (time.process_time() - start) / runs


@functools.lru_cache(maxsize=128)
def _simt_function(text: str) -> SimtFunction:
    """The kernel ``serialize`` wrote, built once for the calls of one session or of one
    SimtRunner worker's rounds (a measured batch up to the cache's size)."""
    return SimtFunction.from_primfunc(deserialize(text))


@tvm_ffi.register_global_func(SIMT_FUNCTION)
def simt_seconds(artifact: str, runs: int, *tensors: tvm.runtime.Tensor) -> float:
    """Mean seconds of one run on the SIMT runner (CPU time, not a GPU's) of the kernel that
    ``serialize`` wrote to the file ``artifact``, on ``tensors`` (one per buffer parameter,
    on the CPU; outputs are overwritten in copies)."""
    simt = _simt_function(Path(artifact).read_text())
    return _mean_seconds(simt, [t.numpy() for t in tensors], runs)


def _simt_cost(text: str, runs: int, seed: int) -> float:
    """The mean of ``runs`` SIMT runs of the serialised kernel ``text`` on its ``arguments``;
    SimtRunner's worker task."""
    func = deserialize(text)
    specs = tuple((str(p.dtype), tuple(int(d) for d in p.shape)) for p in func.params)
    return _mean_seconds(_simt_function(text),
                         _cached_arrays(specs, tuple(zeroed_indices(func)), seed), runs)


@functools.lru_cache(maxsize=1)
def _cached_arrays(specs: tuple[tuple[str, tuple[int, ...]], ...], zeroed: tuple[int, ...],
                   seed: int) -> list[np.ndarray]:
    """``arguments`` by their shapes: the candidates of one task take the same arrays, made
    once for all of them and their rounds. A kernel's outputs overwrite them, which timing
    does not mind."""
    return _arrays(specs, zeroed, np.random.default_rng(seed))


class SimtRunner(Runner):
    """Times kernels on the CPU SIMT runner (PoCL), in one worker process that is killed when
    a kernel runs longer than ``timeout_sec``. The times are CPU times, to rank candidates
    when there is no GPU and to test the tuner: never a GPU speed.

    The batch is timed in ``repeat`` rounds, each kernel once per round: a warm-up run
    (PoCL compiles at the first launch) and then ``runs`` runs. A kernel's result is the
    fastest of its rounds: CPU times are disturbed by whatever else runs, and the fastest is
    the least disturbed; rounds over the whole batch spread a burst of other work over all
    its candidates instead of the few timed during it. A kernel that fails or times out is
    not timed again. A run is a whole call of the SIMT runner, its copies to and from PoCL's
    buffers included.
    """

    kind = RunnerKind.SIMT

    def __init__(self, *, runs: int = 1, repeat: int = 3, timeout_sec: float = 120.0,
                 seed: int = SEED) -> None:
        if runs < 1 or repeat < 1:
            raise ValueError(f"SimtRunner needs runs and repeat of at least 1, not {runs} and "
                             f"{repeat}")
        self.runs = runs
        self.repeat = repeat
        self.timeout_sec = timeout_sec
        self.seed = seed
        self._pool = PopenPoolExecutor(max_workers=1, timeout=timeout_sec)

    def measure(self, inputs: Sequence[MeasureInput]) -> list[MeasureResult]:
        """Time the inputs on the SIMT runner, in ``repeat`` rounds over all of them."""
        texts = [serialize(inp.func) for inp in inputs]
        seconds: list[list[float]] = [[] for _ in inputs]
        errors: dict[int, str] = {}
        for _ in range(self.repeat):
            timed = [i for i in range(len(inputs)) if i not in errors]
            outcomes = self._pool.map_with_error_catching(
                lambda task: _simt_cost(*task), [(texts[i], self.runs, self.seed) for i in timed])
            for i, outcome in zip(timed, outcomes, strict=True):
                if outcome.status == StatusKind.COMPLETE:
                    seconds[i].append(outcome.value)
                elif outcome.status == StatusKind.TIMEOUT:
                    errors[i] = f"SimtRunner: timeout, killed after {self.timeout_sec} s"
                else:
                    errors[i] = f"SimtRunner: {outcome.value}"
        return [MeasureResult(inp.key, None, errors[i]) if i in errors
                else MeasureResult(inp.key, min(seconds[i])) for i, inp in enumerate(inputs)]

    def close(self) -> None:
        """Stop the worker process."""
        self._pool.shutdown()


def kernel_module(func: tirx.PrimFunc) -> IRModule:
    """The module MetaSchedule builds (and ``build_cuda`` takes): ``func`` as its public
    ``main``."""
    return IRModule({"main": func.with_attr("global_symbol", "main")})


# The builder and runner hooks below run in MetaSchedule's worker processes, which import
# only TVM: passed as functions of this module, they are unpickled there by importing it,
# which imports tvm_stitch and registers its CUDA post-processing hook (the grid barrier's
# definition, ``schedule.grid_barrier``) before anything is built.

def _check_scheduled(mod: IRModule, target: Target) -> None:
    """Raise ValueError unless ``mod``'s main is GPU-scheduled: its host code only launches
    kernels. TVM builds a PrimFunc without thread bindings for a CUDA target too, as host
    code, which would then be timed on the CPU on device buffers."""
    try:
        lower(mod["main"], "main", target)
    except LoweringError as err:
        raise ValueError(f"not a GPU-scheduled kernel: {err}") from err


def build_cuda(mod: IRModule, target: Target, _params: dict[str, Any] | None = None
               ) -> tvm.runtime.Module:
    """TVM's build of the scheduled kernel ``mod`` (``kernel_module``) for ``target``; a
    ValueError unless it is GPU-scheduled. LocalBuilder's f_build, also what a tuning pack
    exports (``pack``): MetaSchedule's default build first imports
    ``tvm.s_tir.tensor_intrin``, which takes most of a minute, for tensor intrinsics that our
    kernels never use. Without TVM's CUDA runtime library loaded, the CUDA module keeps the
    source, which the CUDA runtime compiles when the module is loaded on a GPU."""
    _check_scheduled(mod, target)
    return tvm.tirx.build(mod, target=target)


def _build_text(mod: IRModule, target: Target, _params: dict[str, Any] | None) -> str:
    """LocalBuilder's f_build for a SIMT server: the kernel serialised (``serialize``)."""
    _check_scheduled(mod, target)
    return serialize(mod["main"])


def _export_text(text: str) -> str:
    """LocalBuilder's f_export for ``_build_text``: the text in a file of a new directory."""
    path = Path(tempfile.mkdtemp()) / "kernel.json"
    path.write_text(text)
    return str(path)


@dataclass(frozen=True)
class _Arguments:
    """The runners' f_alloc_argument: ``arguments``' values copied to the device, with the
    parameters at ``zeroed`` (indices) all zeros."""

    zeroed: tuple[int, ...]
    seed: int

    def local(self, device: tvm.runtime.Device, args_info: Sequence[list[Any]],
              alloc_repeat: int) -> list[list[tvm.runtime.Tensor]]:
        """The LocalRunner's hook."""
        rng = np.random.default_rng(self.seed)
        specs = [(dtype, shape) for _, dtype, shape in args_info]
        return [[tvm.runtime.tensor(a, device) for a in _arrays(specs, self.zeroed, rng)]
                for _ in range(alloc_repeat)]

    def remote(self, _session: tvm.rpc.RPCSession, device: tvm.runtime.Device,
               args_info: Sequence[list[Any]], alloc_repeat: int
               ) -> list[list[tvm.runtime.Tensor]]:
        """The RPCRunner's hook: the same on the server's device."""
        return self.local(device, args_info, alloc_repeat)


def _upload_text(session: tvm.rpc.RPCSession, local_path: str, remote_path: str) -> str:
    """RPCRunner's f_upload_module for a SIMT server: the serialised kernel uploaded, and
    its path on the server, which the evaluator passes to ``SIMT_FUNCTION``."""
    session.upload(local_path, remote_path)
    return str(session.get_function("tvm.rpc.server.workpath")(remote_path))


def _evaluate_simt(session: tvm.rpc.RPCSession, artifact: str, _device: tvm.runtime.Device,
                   config: ms.runner.EvaluatorConfig,
                   repeated_args: Sequence[Sequence[tvm.runtime.Tensor]]) -> list[float]:
    """RPCRunner's f_run_evaluator for a SIMT server: ``config.repeat`` means of
    ``config.number`` runs per argument set (``min_repeat_ms`` does not apply)."""
    seconds = session.get_function(SIMT_FUNCTION)
    return [float(seconds(artifact, config.number, *args))
            for args in repeated_args for _ in range(config.repeat)]


def _cleanup_text(session: tvm.rpc.RPCSession | None, remote_path: str | None) -> None:
    """RPCRunner's f_cleanup for a SIMT server: remove the uploaded kernel."""
    if session is not None and remote_path is not None:
        session.remove(remote_path)


class _MetaScheduleRunner(Runner):
    """Builds with MetaSchedule's LocalBuilder and times with one of its runners."""

    device_type: str

    def __init__(self, builder: ms.builder.LocalBuilder, runner: Any, seed: int) -> None:
        self._builder = builder
        self._runner = runner
        self.seed = seed

    def _alloc_hook(self, arguments: _Arguments) -> Any:
        """The f_alloc_argument of this runner's MetaSchedule runner."""
        return arguments.local

    def build(self, inputs: Sequence[MeasureInput]) -> list[BuildResult]:
        """Build every input with the LocalBuilder (in parallel worker processes). Each
        artifact is a file in a directory of its own, which the caller removes."""
        built = self._builder.build([ms.builder.BuilderInput(kernel_module(i.func),
                                                             i.target) for i in inputs])
        return [BuildResult(i.key, None if b.error_msg else str(b.artifact_path),
                            str(b.error_msg or "")) for i, b in zip(inputs, built, strict=True)]

    def measure(self, inputs: Sequence[MeasureInput]) -> list[MeasureResult]:
        """Build every input, then time them one after another."""
        results = []
        for inp, built in zip(inputs, self.build(inputs), strict=True):
            if built.artifact is None:
                results.append(MeasureResult(inp.key, None, built.error))
                continue
            try:
                results.append(self._run(inp, built.artifact))
            finally:
                shutil.rmtree(Path(built.artifact).parent, ignore_errors=True)
        return results

    def _run(self, inp: MeasureInput, artifact: str) -> MeasureResult:
        # MetaSchedule's f_alloc_argument sees each argument's dtype and shape only, not
        # which is a barrier state; its runners read the hook when an input is submitted,
        # so each input is submitted alone, with a hook that knows its zeroed parameters.
        self._runner.f_alloc_argument = self._alloc_hook(
            _Arguments(zeroed_indices(inp.func), self.seed))
        args_info = ms.arg_info.ArgInfo.from_prim_func(inp.func)
        (future,) = self._runner.run([ms.runner.RunnerInput(artifact, self.device_type,
                                                            args_info)])
        why = self._wait(future)
        if why:
            return MeasureResult(inp.key, None, why)
        result = future.result()
        if result.error_msg:
            return MeasureResult(inp.key, None, str(result.error_msg))
        return MeasureResult(inp.key, statistics.fmean(float(s) for s in result.run_secs))

    def _wait(self, _future: ms.runner.RunnerFuture) -> str:
        """Wait for ``future``; why it was given up, or "" when it is done."""
        return ""  # MetaSchedule's LocalRunner returns finished futures

    def close(self) -> None:
        """Stop the MetaSchedule runner's worker processes."""
        self._runner.pool.shutdown()


def _evaluator(number: int, repeat: int, min_repeat_ms: int) -> ms.runner.EvaluatorConfig:
    return ms.runner.EvaluatorConfig(number=number, repeat=repeat, min_repeat_ms=min_repeat_ms)


class LocalRunner(_MetaScheduleRunner):
    """Times kernels on the local CUDA GPU: MetaSchedule's LocalBuilder (TVM's CUDA build,
    ``max_workers`` processes) and LocalRunner (TVM's time evaluator: ``repeat`` times the
    mean of at least ``number`` runs, more to last ``min_repeat_ms``; the result is the mean
    of the ``repeat`` means). Building needs no GPU (``build``); measuring does. Both start
    worker processes when constructed."""

    kind = RunnerKind.LOCAL
    device_type = "cuda"

    def __init__(self, *, number: int = 3, repeat: int = 1, min_repeat_ms: int = 100,
                 build_timeout_sec: float = 120.0, run_timeout_sec: float = 30.0,
                 max_workers: int | None = None, seed: int = SEED) -> None:
        builder = ms.builder.LocalBuilder(max_workers=max_workers, timeout_sec=build_timeout_sec,
                                          f_build=build_cuda)
        runner = ms.runner.LocalRunner(timeout_sec=run_timeout_sec,
                                       evaluator_config=_evaluator(number, repeat,
                                                                   min_repeat_ms))
        super().__init__(builder, runner, seed)


class RPCRunner(_MetaScheduleRunner):
    """Times kernels on a server that TVM's RPC tracker at ``tracker_host:tracker_port``
    hands out for ``key``: MetaSchedule's LocalBuilder here and RPCRunner there. The server
    times on its CUDA GPU as ``LocalRunner`` does; with ``simt=True`` it times on its SIMT
    runner instead (CPU times, as ``SimtRunner``; ``min_repeat_ms`` does not apply; the
    server must have imported this module), the artifact being the serialised kernel. A
    session, and so one measurement, is cut off after ``session_timeout_sec``; one waiting
    for a free server is given up after ``queue_timeout_sec``."""

    kind = RunnerKind.RPC

    def __init__(self, tracker_host: str, tracker_port: int, key: str, *, simt: bool = False,
                 number: int = 3, repeat: int = 1, min_repeat_ms: int = 100,
                 build_timeout_sec: float = 120.0, session_timeout_sec: int = 60,
                 queue_timeout_sec: float = 600.0, priority: int = 1,
                 max_workers: int | None = None, seed: int = SEED) -> None:
        self.simt = simt
        self.queue_timeout_sec = queue_timeout_sec
        self.device_type = "cpu" if simt else "cuda"
        hooks: dict[str, Any] = {}
        if simt:
            hooks = {"f_upload_module": _upload_text, "f_run_evaluator": _evaluate_simt,
                     "f_cleanup": _cleanup_text}
        self._config = ms.runner.RPCConfig(tracker_host=tracker_host, tracker_port=tracker_port,
                                           tracker_key=key, session_priority=priority,
                                           session_timeout_sec=session_timeout_sec)
        builder = ms.builder.LocalBuilder(
            max_workers=max_workers, timeout_sec=build_timeout_sec,
            f_build=_build_text if simt else build_cuda,
            f_export=_export_text if simt else None)
        runner = ms.runner.RPCRunner(rpc_config=self._config,
                                     evaluator_config=_evaluator(number, repeat, min_repeat_ms),
                                     **hooks)
        super().__init__(builder, runner, seed)

    def _alloc_hook(self, arguments: _Arguments) -> Any:
        return arguments.remote

    def _wait(self, future: ms.runner.RunnerFuture) -> str:
        # MetaSchedule's RPCRunner waits for a free server without a time limit: give up
        # here instead (its worker thread is left waiting in the tracker's queue)
        deadline = time.monotonic() + self.queue_timeout_sec + self._config.session_timeout_sec
        while not future.done():
            if time.monotonic() > deadline:
                return (f"RPCRunner: no result within {self.queue_timeout_sec} s of waiting "
                        f"for a server and {self._config.session_timeout_sec} s of session")
            time.sleep(0.05)
        return ""


def runner_of(kind: RunnerKind, **options: Any) -> Runner:
    """A runner of ``kind`` with ``options`` (its constructor's arguments)."""
    runners: dict[RunnerKind, type[Runner]] = {
        RunnerKind.SIMT: SimtRunner, RunnerKind.LOCAL: LocalRunner, RunnerKind.RPC: RPCRunner}
    return runners[RunnerKind(kind)](**options)


__all__ = ["SIMT_FUNCTION", "RunnerKind", "MeasureInput", "MeasureResult", "BuildResult",
           "Runner", "SimtRunner", "LocalRunner", "RPCRunner", "runner_of", "zeroed_params",
           "zeroed_indices", "arguments", "random_array", "serialize", "deserialize",
           "simt_seconds", "kernel_module", "build_cuda"]
