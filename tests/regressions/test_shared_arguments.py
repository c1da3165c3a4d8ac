"""A kernel passed one tensor as two of its inputs reads it once.

Fuzz graph 12038:187: ``x + Cast(x)`` with a same-type cast. ``IdentityViews`` removes the
cast, and TVM legalizes the ``add(x, x)`` left into a PrimFunc of two input buffers, both
loaded: 391,680 B where TVM's fusion of the cast into the add moves 261,120 B. Owner:
transform/shared_arguments.py."""

from __future__ import annotations

import numpy as np
import tvm
from onnx import TensorProto, helper
from regression_models import global_bytes, model, needs_stitch
from tvm import relax, tirx

from tvm_stitch import verify
from tvm_stitch.analysis import analyze
from tvm_stitch.testing.differential import check_model
from tvm_stitch.transform.shared_arguments import SharedArguments

pytestmark = needs_stitch


def test_a_tensor_added_to_its_same_type_cast_is_read_once() -> None:
    built = model([helper.make_node("Cast", ["x"], ["c"], to=TensorProto.FLOAT),
                   helper.make_node("Add", ["x", "c"], ["y"])],
                  {"x": [128, 255]}, {"y": [128, 255]})
    (kernel,) = analyze(verify.compile_model(built, "stitch")).kernels
    (read,) = [b for b in kernel.traffic.buffers.values() if b.read_bytes]
    assert read.read_bytes == read.size_bytes == 128 * 255 * 4
    assert global_bytes(built, "stitch") == global_bytes(built, "baseline") == 261120
    outcome = check_model(built, "stitch", triage=False)
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_calls_that_repeat_an_input_and_calls_that_do_not_get_their_own_kernels() -> None:
    # LegalizeOps makes one multiply PrimFunc for both calls: the square calls a copy
    # specialized to read x through one parameter, the product of x and y the original
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64, 1024), "float32"))
    y = relax.Var("y", relax.TensorType((64, 1024), "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            square = bb.emit(relax.op.multiply(x, x))
            product = bb.emit(relax.op.multiply(x, y))
            out = bb.emit_output(relax.Tuple([square, product]))
        bb.emit_func_output(out)
    legalized = relax.transform.LegalizeOps()(bb.get())
    assert len(_prim_funcs(legalized)) == 1
    shared = SharedArguments()(legalized)
    assert sorted(len(call.args[1].fields) for call in _call_tirs(shared)) == [1, 2]
    assert sorted(len(f.params) for f in _prim_funcs(shared)) == [2, 3]
    rng = np.random.default_rng(0)
    feeds = [rng.standard_normal((64, 1024), dtype=np.float32) for _ in range(2)]
    vm = relax.VirtualMachine(tvm.compile(shared, "llvm"), tvm.cpu())
    got = [r.numpy() for r in vm["main"](*[tvm.runtime.tensor(f) for f in feeds])]
    np.testing.assert_array_equal(got[0], feeds[0] * feeds[0])
    np.testing.assert_array_equal(got[1], feeds[0] * feeds[1])


def _prim_funcs(mod: tvm.IRModule) -> list[tirx.PrimFunc]:
    return [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]


def _call_tirs(mod: tvm.IRModule) -> list[relax.Call]:
    found = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found.append(e) if isinstance(
        e, relax.Call) and getattr(e.op, "name", "") == "relax.call_tir" else None)
    return found
