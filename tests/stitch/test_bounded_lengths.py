"""Rows of symbolic length with a declared upper bound (``--dim-max``): staged on chip sized
for the bound, with a run-time check that runs a re-reading body beyond it. One compile
serves lengths below, at and past the bound on the SIMT runner, matching onnxruntime; within
the bound it moves fewer bytes than the unbounded kernel, beyond it as many; never more
kernels or bytes than TVM's fusion."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
import tvm_ffi
from stitch_helpers import compile_cuda, spills, stack_frames, stitched_functions
from test_symbolic_lengths import CASES, named_dims
from tvm import tirx

import tvm_stitch.frontend.onnx as frontend
from tvm_stitch import pipeline, verify
from tvm_stitch.cli import main as cli_main
from tvm_stitch.frontend.onnx import ModelError, import_model
from tvm_stitch.lowering import lower
from tvm_stitch.plan import StitchPlan, StorageLevel
from tvm_stitch.schedule.decisions.choosing import choosing
from tvm_stitch.symbolic import BOUNDS_ATTR, declared_bounds, upper_bound
from tvm_stitch.target import cuda_target
from tvm_stitch.tuning.space import Sampling

BOUNDED = {
    # name: (model, declared bounds, sizes within, at and beyond the bound)
    "softmax": (CASES["softmax"][0], {"length": 512},
                [{"length": n} for n in (1, 7, 300, 512, 513, 5003)]),
    "attention": (CASES["attention"][0], {"seq": 64},
                  [{"batch": 1, "seq": 1}, {"batch": 2, "seq": 13}, {"batch": 3, "seq": 64},
                   {"batch": 1, "seq": 65}, {"batch": 2, "seq": 200}]),
}


@functools.cache
def _compiled(case: str, flow: str, bounded: bool):
    model, bounds, _ = BOUNDED[case]
    mod = import_model(model(), dim_max=bounds if bounded else None)
    return pipeline.lower(mod, cuda_target(), flow)


def _within(case: str, dims: dict[str, int]) -> bool:
    return all(dims[name] <= bound for name, bound in BOUNDED[case][1].items())


@pytest.mark.parametrize("case", sorted(BOUNDED))
def test_rows_are_staged_for_the_bound_with_a_rereading_body_beyond(case: str) -> None:
    plan = StitchPlan.of_module(_compiled(case, "stitch", True))
    assert not plan.fallbacks and len(plan.groups) == 1, str(plan)
    (group,) = plan.groups
    bound = next(iter(BOUNDED[case][1].values()))
    assert group.mapping.length_bound == bound and group.mapping.mapped_length == bound
    staged = {b.name for b in group.buffers if b.level is StorageLevel.SHARED}
    assert staged, str(plan)
    beyond = group.beyond_bound
    assert beyond is not None and beyond.mapping == group.mapping, str(plan)
    assert not {b.name for b in beyond.buffers if b.level is StorageLevel.SHARED} & staged
    assert f"at most {bound} declared" in str(plan) and "second body" in str(plan)
    assert StitchPlan.from_json(plan.to_json()) == plan


@pytest.mark.parametrize("case", sorted(BOUNDED))
def test_one_bounded_compile_serves_lengths_within_and_beyond_the_bound(case: str) -> None:
    model = BOUNDED[case][0]()
    bounded = _compiled(case, "stitch", True)
    unbounded = _compiled(case, "stitch", False)
    baseline = _compiled(case, "baseline", False)
    for dims in BOUNDED[case][2]:
        ours = verify.summarize(bounded, model, dims=dims)
        plain = verify.summarize(unbounded, model, dims=dims)
        tvms = verify.summarize(baseline, model, dims=dims)
        assert ours["ok"], (dims, ours)
        assert ours["kernels"] <= tvms["kernels"], (dims, ours, tvms)
        assert ours["global_bytes"] <= tvms["global_bytes"], (dims, ours, tvms)
        if _within(case, dims):
            assert ours["global_bytes"] < plain["global_bytes"], (dims, ours, plain)
        else:  # the re-reading body: as the unbounded kernel
            assert ours["global_bytes"] == plain["global_bytes"], (dims, ours, plain)


def test_the_kernel_checks_the_bound_once_under_its_block_loop() -> None:
    (func,) = stitched_functions(_compiled("softmax", "stitch", True)).values()
    found: list[tirx.IfThenElse] = []
    tvm_ffi.structural_walk(func.body, [(tirx.IfThenElse, found.append)])
    checks = [str(f.condition) for f in found if "tvm_thread_invariant" in str(f.condition)]
    assert checks == ["T.tvm_thread_invariant(length <= 512)"], checks


def test_a_bound_too_large_to_stage_keeps_one_rereading_body() -> None:
    """Rows of up to 10^6 floats cannot be staged in a block's shared memory: the plan
    demotes them, and one body serves every length."""
    mod = import_model(CASES["softmax"][0](), dim_max={"length": 1_000_000})
    scheduled = pipeline.lower(mod, cuda_target(), "stitch")
    (group,) = StitchPlan.of_module(scheduled).groups
    assert group.beyond_bound is None
    assert not any(b.level is StorageLevel.SHARED for b in group.buffers)
    for n in (3, 2000):
        assert verify.run_simt(scheduled, CASES["softmax"][0](), dims={"length": n}).ok


@pytest.mark.nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("case", sorted(BOUNDED))
def test_bounded_kernels_compile_without_spills(case: str, arch: str) -> None:
    for name, func in stitched_functions(_compiled(case, "stitch", True)).items():
        report = compile_cuda(lower(func, name, cuda_target(arch)).source(), arch)
        found = spills(report)
        assert found and all(s == (0, 0) for s in found), report
        assert all(frame == 0 for frame in stack_frames(report)), report


def test_the_bound_comes_from_the_models_metadata_too() -> None:
    model = frontend.with_dim_max(CASES["softmax"][0](), {"length": 128, "batch": 9})
    assert frontend.declared_dim_max(model) == {"length": 128}, "no batch in this model"
    assert declared_bounds(import_model(model)["main"].attrs) == {"length": 128}
    assert declared_bounds(import_model(model, dim_max={"length": 64})["main"].attrs) \
        == {"length": 64}


@pytest.mark.parametrize("props,bounds,message", [
    ({frontend.DIM_MAX_KEY + "length": "lots"}, None, "positive integer"),
    ({}, {"nope": 8}, "no input has a symbolic dimension named 'nope'"),
])
def test_a_bad_bound_is_refused_with_its_name(props, bounds, message) -> None:
    model = CASES["softmax"][0]()
    onnx.helper.set_model_props(model, props)
    with pytest.raises(ModelError, match=message):
        import_model(model, dim_max=bounds)


def test_inspect_takes_dim_max(tmp_path, capsys) -> None:
    path = tmp_path / "softmax.onnx"
    onnx.save(named_dims(CASES["softmax"][0](), {}), path)
    code = cli_main(["inspect", str(path), "--pipeline", "stitch", "--dim", "length=300",
                     "--dim-max", "length=512"])
    assert code == 0
    assert "at most 512 declared" in capsys.readouterr().out


def test_upper_bounds_of_extents() -> None:
    seq, past = tirx.Var("seq", "int64"), tirx.Var("past", "int64")
    bounds = {"seq": 64, "past": 2000}
    assert upper_bound(seq * 2 + 1, bounds) == 129
    assert upper_bound(past + 1, bounds) == 2001
    assert upper_bound(tirx.floordiv(seq + 7, 8), bounds) == 8
    assert upper_bound(seq, {}) is None
    assert upper_bound(past - seq, bounds) is None  # not monotone: no bound claimed


def test_tvms_own_upper_bound_attribute_is_read_too() -> None:
    mod = import_model(CASES["softmax"][0]())
    main = mod["main"].with_attr("tir_var_upper_bound", {"length": 256}) \
        .with_attr(BOUNDS_ATTR, {"length": 512})
    assert declared_bounds(main.attrs) == {"length": 256}


@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_random_candidate_of_a_bounded_group_serves_every_length(seed: int) -> None:
    """The candidate space offers the bounded group's threads and staging like any other;
    each candidate keeps its re-reading body past the bound."""
    model, bounds, sizes = BOUNDED["attention"]
    sampling = Sampling(seed=seed)
    with choosing(sampling):
        scheduled = pipeline.lower(import_model(model(), dim_max=bounds), cuda_target(),
                                   "stitch")
    assert [c for c in sampling.drawn.values() if c is not None], "no candidate drawn"
    (group,) = StitchPlan.of_module(scheduled).groups
    assert group.mapping.length_bound == 64, str(group)
    for dims in sizes:
        assert verify.run_simt(scheduled, model(), dims=dims).ok, (seed, dims, group)


def _row_op(kind: str, dtype: int) -> onnx.ModelProto:
    """A normalisation (mean, variance, divide), softmax or log-softmax over the last axis
    of (n, 4, d), both ``n`` and ``d`` symbolic."""
    vi = onnx.helper.make_tensor_value_info
    make = onnx.helper.make_node
    if kind == "norm":
        eps = onnx.numpy_helper.from_array(
            np.array(1e-5, np.float16 if dtype == onnx.TensorProto.FLOAT16 else np.float32), "eps")
        nodes = [make("ReduceMean", ["x"], ["m"], axes=[-1]), make("Sub", ["x", "m"], ["c"]),
                 make("Mul", ["c", "c"], ["sq"]), make("ReduceMean", ["sq"], ["v"], axes=[-1]),
                 make("Add", ["v", "eps"], ["ve"]), make("Sqrt", ["ve"], ["s"]),
                 make("Div", ["c", "s"], ["y"])]
        inits, opset = [eps], 13
    else:
        nodes = [make("LogSoftmax" if kind == "log_softmax" else "Softmax", ["x"], ["y"],
                      axis=-1)]
        inits, opset = [], 17
    graph = onnx.helper.make_graph(nodes, kind, [vi("x", dtype, ["n", 4, "d"])],
                                   [vi("y", dtype, ["n", 4, "d"])], inits)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("kind,dtype,bound", [
    ("norm", onnx.TensorProto.FLOAT, 20),  # a warp per row, rows packed
    ("softmax", onnx.TensorProto.FLOAT16, 300),  # a block per row
    ("log_softmax", onnx.TensorProto.FLOAT, 300),
])
def test_rows_on_either_side_of_the_bound_match(kind: str, dtype: int, bound: int) -> None:
    model = _row_op(kind, dtype)
    scheduled = pipeline.lower(import_model(model, dim_max={"d": bound}), cuda_target(),
                               "stitch")
    plan = StitchPlan.of_module(scheduled)
    assert not plan.fallbacks and all(g.beyond_bound is not None for g in plan.groups), \
        str(plan)
    for d in (1, 7, bound - 1, bound, bound + 1, 3 * bound + 1):
        assert verify.run_simt(scheduled, model, dims={"n": 3, "d": d}).ok, (kind, d)
