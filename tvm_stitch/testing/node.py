"""ONNX's backend node tests for the ops the compile flows accept, on the SIMT runner.

The onnx wheel no longer ships ``onnx/backend/test/data/node``; the same cases (model, inputs,
expected outputs) are generated in memory by ``onnx.backend.test.case.node.collect_testcases``.
A case is selected when every node of its model is an op of :data:`ACCEPTED_OPS` (the
memory-intensive ops: element-wise, broadcast, reductions, softmax, normalisations, data
movement), which includes the ``_expanded`` variants that spell a function op out in them.

Integer inputs that only feed shape-like operands (axes, shapes, repeats, slice bounds) become
initializers holding the test's value: the flows compile static shapes, and these values decide
shapes. Every output of a case is checked, LayerNormalization's Mean and InvStdDev included
(the front end computes them, ``frontend.outputs``).

Each case is then checked like a fuzzed graph (``differential.check_model``) against
the expected outputs, and gets one of three statuses:

- ``passed``;
- ``skipped``, always with the reason: the front end refuses the model (an unsupported dtype
  or op version, with its ``ModelError`` naming the node), or a crash raised in TVM's code
  that the baseline flow (TVM's default pipeline) meets the same way (``differential``);
- ``failed``: wrong numbers (whatever the baseline flow does: an op TVM imports wrongly is
  fixed or refused by our front end) or any other crash.

``python -m tvm_stitch.testing.node [--flow stitch] [--only substring] [--json out.json]``
runs them, each in a worker process (a case that kills its process fails alone), and prints
one line per case and a summary.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
import warnings
from dataclasses import asdict, dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from ..target import DEFAULT_TARGET
from .differential import check_model, default_flow
from .fuzz import Checker

ELEMENTWISE_OPS = frozenset({
    "Abs", "Acos", "Acosh", "Add", "And", "Asin", "Asinh", "Atan", "Atanh", "BitwiseAnd",
    "BitwiseNot", "BitwiseOr", "BitwiseXor", "Cast", "CastLike", "Ceil", "Clip", "Cos", "Cosh",
    "Div", "Elu", "Equal", "Erf", "Exp", "Floor", "Gelu", "Greater", "GreaterOrEqual",
    "HardSigmoid", "HardSwish", "Identity", "IsInf", "IsNaN", "LeakyRelu", "Less",
    "LessOrEqual", "Log", "Max", "Mean", "Min", "Mish", "Mod", "Mul", "Neg", "Not", "Or",
    "PRelu", "Pow", "Reciprocal", "Relu", "Round", "Selu", "Shrink", "Sigmoid", "Sign", "Sin",
    "Sinh", "Softplus", "Softsign", "Sqrt", "Sub", "Sum", "Tan", "Tanh", "ThresholdedRelu",
    "Where", "Xor",
})
REDUCTION_OPS = frozenset({
    "ArgMax", "ArgMin", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax",
    "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare",
})
NORMALISATION_OPS = frozenset({
    "BatchNormalization", "GroupNormalization", "Hardmax", "InstanceNormalization",
    "LayerNormalization", "LogSoftmax", "MeanVarianceNormalization", "RMSNormalization",
    "Softmax",
})
DATA_MOVEMENT_OPS = frozenset({
    "Concat", "Expand", "Flatten", "Reshape", "Slice", "Split", "Squeeze", "Tile", "Transpose",
    "Unsqueeze",
})
ACCEPTED_OPS = ELEMENTWISE_OPS | REDUCTION_OPS | NORMALISATION_OPS | DATA_MOVEMENT_OPS
"""ONNX ops the flows accept as memory-intensive (``Constant`` may appear beside them)."""

# Operand positions that hold shapes, axes or bounds rather than data.
_SHAPE_OPERANDS = {
    "Reshape": {1}, "Expand": {1}, "Tile": {1}, "Squeeze": {1}, "Unsqueeze": {1},
    "Split": {1}, "Slice": {1, 2, 3, 4}, "TopK": {1}, **{op: {1} for op in REDUCTION_OPS},
}



@dataclass
class NodeResult:
    """The outcome of one node test."""

    name: str
    status: str  # passed | failed | skipped
    reason: str = ""
    max_abs_err: float | None = None
    seconds: float = 0.0


@functools.cache
def _all_cases() -> tuple:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the case generators divide by zero on purpose
        return tuple(collect_testcases())


def node_cases(ops: frozenset[str] = ACCEPTED_OPS) -> list:
    """ONNX's node test cases (``onnx.backend.test.case.test_case.TestCase``) whose models use
    only ``ops`` (and ``Constant``), sorted by name."""
    allowed = ops | {"Constant"}
    cases = [c for c in _all_cases()
             if c.model is not None and all(n.op_type in allowed for n in c.model.graph.node)]
    return sorted(cases, key=lambda c: c.name)


def case_named(name: str):
    """The node test case called ``name``."""
    for case in _all_cases():
        if case.name == name:
            return case
    raise KeyError(f"no ONNX node test named {name!r}")


def prepare(case) -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray]]:
    """The case's model with shape-like integer inputs folded into initializers, its remaining
    inputs by name, and its expected outputs."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    inputs, expected = (list(map(_array, values)) for values in case.data_sets[0])
    graph = model.graph
    names = [v.name for v in graph.input]
    values = dict(zip(names, inputs, strict=False))
    shape_like = {node.input[i] for node in graph.node
                  for i in _SHAPE_OPERANDS.get(node.op_type, ()) if i < len(node.input)}
    keep = []
    for value in graph.input:
        array = values.get(value.name)
        if (value.name in shape_like and isinstance(array, np.ndarray)
                and np.issubdtype(array.dtype, np.integer)):
            graph.initializer.append(numpy_helper.from_array(array, value.name))
        else:
            keep.append(value)
    del graph.input[:]
    graph.input.extend(keep)
    feeds = {v.name: values[v.name] for v in keep}
    return model, feeds, expected


def _array(value: object) -> object:
    """Tensors as numpy arrays (numpy scalars and TensorProtos included); other values (the
    lists of sequence inputs) unchanged."""
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, np.ndarray | np.generic):
        return np.asarray(value)
    return value


def run_case(case, flow: str, target: str = DEFAULT_TARGET, resources: bool = False,
             checker: Checker | None = None) -> NodeResult:
    """Run one node test with ``flow`` and classify it; through ``checker`` (a worker process
    of the same flow, target and resources) when given, so that a crash of the process itself
    fails this case alone."""
    start = time.time()
    model, feeds, expected = prepare(case)
    kinds = {type(v).__name__ for v in [*feeds.values(), *expected]
             if not isinstance(v, np.ndarray)}
    if kinds:
        return NodeResult(case.name, "skipped", f"values that are not tensors: {sorted(kinds)} "
                                                "(sequence or optional types)")
    if checker is None:
        outcome = check_model(model, flow, target, resources=resources, feeds=feeds,
                              expected=expected).to_dict()
    else:
        outcome = checker(model, feeds=feeds, expected=expected)
    result = NodeResult(case.name, "passed", max_abs_err=outcome["max_abs_err"])
    error, kind = outcome["error"], outcome["kind"]
    if kind == "crash" and outcome["stage"] == "import" and error.startswith("ModelError"):
        result.status, result.reason = "skipped", f"front end: {error}"
    elif kind == "tvm_crash":
        result.status = "skipped"
        result.reason = (f"TVM's crash at {outcome['stage']}, raised at {outcome['raised_at']} "
                         f"and met by the baseline too: {error}")
    elif kind != "ok" or outcome["violations"]:
        result.status = "failed"
        result.reason = "; ".join(filter(None, [
            f"{kind} {outcome['stage']}: {error}" if kind != "ok" else "",
            f"(baseline: {outcome['baseline']})" if outcome["baseline"] else "",
            *outcome["violations"]]))
    result.reason = result.reason[:500]
    result.seconds = round(time.time() - start, 2)
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line: run the selected node tests and print a table; exit 1 on failures."""
    from ..pipeline import available_flows

    parser = argparse.ArgumentParser(prog="python -m tvm_stitch.testing.node",
                                     description="ONNX node tests on the SIMT runner")
    parser.add_argument("--flow", default=default_flow(), choices=available_flows())
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    parser.add_argument("--resources", action="store_true", help="also check kernel resources")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds per case in the worker process (0: run in this process)")
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args(argv)
    results = []
    checker = Checker(args.flow, args.target, args.resources, args.timeout)
    try:
        for case in node_cases():
            if args.only in case.name:
                result = run_case(case, args.flow, args.target, args.resources, checker)
                results.append(result)
                print(f"{result.status:8} {result.name} {result.reason}", flush=True)
    finally:
        checker.close()
    counts = {s: sum(r.status == s for r in results) for s in ("passed", "skipped", "failed")}
    print(" ".join(f"{k}={v}" for k, v in counts.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in results], f, indent=1)
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
