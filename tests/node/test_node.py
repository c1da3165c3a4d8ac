"""ONNX's backend node tests for the ops the flows accept, through the flow under test on the
SIMT runner (``tvm_stitch.testing.node``). CI runs a curated sample that spans the op classes,
with every kernel's resources checked; ``--runslow`` runs every selected case. A case is either
passed, skipped with its reason (printed by ``-ra``: a model the front end refuses, naming
the node, or a crash raised in TVM's code that the baseline flow meets too), or a failure:
wrong numbers fail whatever the baseline does (``frontend.repairs`` lists the TVM bugs our
front end repairs or refuses)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tvm_stitch.target import DEFAULT_TARGET
from tvm_stitch.testing.differential import default_flow
from tvm_stitch.testing.fuzz import Checker
from tvm_stitch.testing.node import ACCEPTED_OPS, case_named, node_cases, run_case

CURATED = (
    # element-wise, broadcasting, expensive ops, comparisons, casts
    "test_abs", "test_add_bcast", "test_div_bcast", "test_pow_bcast_array", "test_log",
    "test_sqrt", "test_tanh", "test_erf", "test_sigmoid", "test_sign", "test_gelu_tanh_1",
    "test_clip", "test_where_example", "test_less_bcast", "test_cast_FLOAT_to_FLOAT16",
    "test_add_uint8", "test_mul_int8", "test_div_uint64", "test_clip_default_int8_min",
    "test_mod_mixed_sign_int8",
    # reductions, with and without keepdims, negative and default axes
    "test_reduce_sum_keepdims_random", "test_reduce_mean_do_not_keepdims_random",
    "test_reduce_max_negative_axes_keepdims_random", "test_reduce_log_sum_exp_keepdims_random",
    "test_argmax_keepdims_example",
    # softmax family and normalisations
    "test_softmax_large_number", "test_logsoftmax_axis_1", "test_softmax_example_expanded",
    "test_layer_normalization_3d_axis1_epsilon", "test_rms_normalization_3d_axis2_epsilon",
    "test_group_normalization_example", "test_batchnorm_example", "test_mvn",
    "test_batchnorm_example_training_mode",
    # data movement
    "test_reshape_reordered_all_dims", "test_transpose_all_permutations_1",
    "test_expand_dim_changed", "test_flatten_axis1", "test_concat_2d_axis_0", "test_slice",
    "test_split_equal_parts_1d_opset18",
    # skipped, with the reason: a dtype the front end refuses, an attribute TVM would ignore
    "test_cast_FLOAT_to_BFLOAT16", "test_isinf_negative",
)

@pytest.fixture(scope="module")
def checkers() -> Iterator[dict[bool, Checker]]:
    """Worker processes of the flow under test, with and without resource checks, shared by
    the module: a case that kills its process fails alone."""
    made: dict[bool, Checker] = {}
    yield made
    for checker in made.values():
        checker.close()


def _check(name: str, checkers: dict[bool, Checker], resources: bool) -> None:
    flow = default_flow()
    checker = checkers.setdefault(resources, Checker(flow, DEFAULT_TARGET, resources, 300.0))
    result = run_case(case_named(name), flow, resources=resources, checker=checker)
    if result.status == "skipped":
        assert result.reason
        pytest.skip(f"{name}: {result.reason}")
    assert result.status == "passed", f"{name}: {result.reason}"


@pytest.mark.nvcc  # resources are checked in worker processes, out of the conftest's sight
@pytest.mark.parametrize("name", CURATED)
def test_curated_node_case(name: str, checkers: dict[bool, Checker]) -> None:
    _check(name, checkers, resources=True)


@pytest.mark.slow
def test_all_node_cases(all_case_name: str, checkers: dict[bool, Checker]) -> None:
    _check(all_case_name, checkers, resources=False)


def test_selection_covers_the_accepted_ops() -> None:
    """Every accepted op has node tests, and the curated sample names real cases."""
    covered = {n.op_type for c in node_cases() for n in c.model.graph.node}
    assert ACCEPTED_OPS <= covered, sorted(ACCEPTED_OPS - covered)
    names = {c.name for c in node_cases()}
    assert set(CURATED) <= names, sorted(set(CURATED) - names)
