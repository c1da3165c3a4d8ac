"""Relax-level analysis for stitching: op classes, dataflow graph, groups, dominants.

Reads a Relax module after LegalizeOps and AnnotateTIROpPattern; decides, never rewrites.
"""

from .dataflow import DataflowGraph, Node, dataflow_graphs
from .dominants import analyse, edge_scheme
from .grouping import Grouping, OpGroup, group_ops
from .ops import OpInfo, OpKind, classify
from .planner import Draft, draft_plan
from .tvm_fusion import tvm_fusion_groups

__all__ = [
    "DataflowGraph", "Node", "dataflow_graphs", "analyse", "edge_scheme", "Grouping", "OpGroup",
    "group_ops", "OpInfo", "OpKind", "classify", "Draft", "draft_plan", "tvm_fusion_groups",
]
