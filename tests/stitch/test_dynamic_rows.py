"""Dynamic row counts: a model whose batch is symbolic compiles once into stitched kernels
whose grid follows the batch at run time (a symbolic row length: ``test_symbolic_lengths``)."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
import stitch_patterns as patterns
import tvm
from stitch_helpers import (
    assert_matches,
    compile_cuda,
    lower_stitch,
    reference,
    run_simt,
    spills,
    stitched_functions,
)

from tvm_stitch.lowering import lower
from tvm_stitch.plan import MappingKind, StitchPlan
from tvm_stitch.simt import SimtModule
from tvm_stitch.symbolic import SYMBOLIC, dim_value, is_symbolic, stand_in
from tvm_stitch.target import cuda_target

SIZES = (1, 7, 64, 300)
"""Row counts each compiled module runs with: one row, a partial block, several blocks."""


def symbolic_batch(model: onnx.ModelProto, name: str = "batch") -> onnx.ModelProto:
    """``model`` with the leading dimension of every graph input and output named ``name``
    (an ONNX dim_param) instead of its size."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for value in (*out.graph.input, *out.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = name
    onnx.checker.check_model(out)
    return out


CASES = {
    # name: (builder, row length): long rows get a block per row, short ones packed warps
    "softmax-768": (patterns.softmax, 768),
    "layer_norm-64": (patterns.layer_norm, 64),
    "add_layer_norm-64": (patterns.add_layer_norm, 64),
    "rms_norm-256": (patterns.rms_norm, 256),
}


@functools.cache
def _compiled(case: str) -> tuple[onnx.ModelProto, object, StitchPlan]:
    build, d = CASES[case]
    model = symbolic_batch(build(16, d)[0])
    scheduled, plan = lower_stitch(model)
    return model, scheduled, plan


def _inputs(model: onnx.ModelProto, n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = {}
    for value in model.graph.input:
        dims = [n] + [d.dim_value for d in value.type.tensor_type.shape.dim[1:]]
        arrays[value.name] = rng.standard_normal(dims).astype("float32")
    return arrays


@pytest.mark.parametrize("case", sorted(CASES))
def test_symbolic_batch_is_one_group_with_a_run_time_grid(case: str) -> None:
    _, scheduled, plan = _compiled(case)
    assert not plan.fallbacks, str(plan)
    (group,) = plan.groups
    mapping = group.mapping
    assert mapping.rows_expr == "batch" and is_symbolic(mapping.rows)
    assert mapping.row_steps == 1, "no vertical packing without a row count"
    assert group.launch.grid == 0 and not group.phases
    assert "ceil(batch /" in str(plan) and "at run time" in str(plan)
    (func,) = stitched_functions(scheduled).values()
    assert len(lower(func, group.function, cuda_target()).launches) == 1


def test_long_rows_get_a_block_each_and_short_rows_are_packed() -> None:
    long_rows = _compiled("softmax-768")[2].groups[0].mapping
    short_rows = _compiled("layer_norm-64")[2].groups[0].mapping
    assert long_rows.kind is MappingKind.BLOCK_PER_ROW and long_rows.rows_per_block == 1
    assert short_rows.kind is MappingKind.WARP_PER_ROW and short_rows.rows_per_block > 1


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_module_runs_every_batch_size(case: str) -> None:
    model, scheduled, _ = _compiled(case)
    runner = SimtModule(scheduled)
    for seed, n in enumerate(SIZES):
        inputs = _inputs(model, n, seed)
        args = [inputs[i.name] for i in model.graph.input]
        assert_matches(runner(*args), reference(model, inputs))


def test_batch_times_sequence_rows() -> None:
    """Rows over two dimensions, the outer one symbolic: (batch, 8, 64) -> batch * 8 rows."""
    base, _ = patterns.ln_softmax_add(16, 64)
    model = symbolic_batch(_three_dims(base, 8))
    scheduled, plan = lower_stitch(model)
    assert not plan.fallbacks and len(plan.groups) == 1, str(plan)
    assert plan.groups[0].mapping.rows_expr == "batch * 8"
    for seed, n in enumerate((1, 3)):
        inputs = _inputs(model, n, seed)
        assert_matches(run_simt(model, scheduled, inputs), reference(model, inputs))


def _three_dims(model: onnx.ModelProto, seq: int) -> onnx.ModelProto:
    """``model`` (2-D inputs and outputs) with inputs and outputs of shape (n, seq, d)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for value in (*out.graph.input, *out.graph.output):
        dims = value.type.tensor_type.shape.dim
        d = dims[1].dim_value
        del dims[:]
        for size in (1, seq, d):
            dims.add().dim_value = size
    return out


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("case", ["softmax-768", "add_layer_norm-64"])
def test_symbolic_kernels_compile_without_spills(case: str, arch: str) -> None:
    _, scheduled, _ = _compiled(case)
    for name, func in stitched_functions(scheduled).items():
        report = compile_cuda(lower(func, name, cuda_target(arch)).source(), arch)
        found = spills(report)
        assert found and all(s == (0, 0) for s in found), report


def test_stand_ins() -> None:
    n, m = tvm.tirx.Var("n", "int64"), tvm.tirx.Var("m", "int64")
    assert dim_value(n) == stand_in("n") == dim_value(tvm.tirx.Var("n", "int32"))
    assert dim_value(n * m) == stand_in("n") * stand_in("m") != dim_value(n * n)
    assert dim_value(tvm.tirx.IntImm("int64", 8)) == 8
    # a sum is a symbol of its own, the same for the same expression however it is built
    assert dim_value(n + 1) == dim_value(1 + n) == stand_in("n + T.int64(1)") != dim_value(n)
    assert dim_value(tvm.tirx.FloatImm("float32", 1.0)) is None
    assert is_symbolic(stand_in("n")) and not is_symbolic(SYMBOLIC - 1)
    assert stand_in("n") % 2 == 1
