"""A LayerNorm over rows after their column means (fuzz seed 12026 graph 88: (64, 30000),
estimated 108 us on the H200 where TVM's two kernels take 118, now 54).

A Global group's row tiles are sized for the partial sums its first phase writes (one row of
partial sums per tile), and every row phase walked them: the LayerNorm phase after the
column phase ran 8 tiles of 8 rows on 8 of the grid's 30 blocks. A rows phase after the
column phases that accumulates nothing now takes tasks of the fewest rows that keep them
within a wave (``Phase.row_steps``, ``global_stitch._rows_after_columns``), and rows of at
least as many bytes as a task stages again of what its block staged once. Owner:
schedule/decisions/global_stitch.py, schedule/emit.py (``_map_row_phase``)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from regression_models import model

from tvm_stitch import verify
from tvm_stitch.plan import PhaseKind, StitchPlan
from tvm_stitch.testing.differential import check_model
from tvm_stitch.workloads import registry


def _layer_norm_after_column_means(rows: int, width: int):
    """x (rows, width): where x <= -1 its column mean, else a constant row; LayerNorm."""
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1),
             helper.make_node("LessOrEqual", ["x", "lo"], ["le"]),
             helper.make_node("Where", ["le", "m", "c"], ["w"]),
             helper.make_node("LayerNormalization", ["w", "g", "b"], ["y"], axis=-1)]
    rng = np.random.default_rng(0)
    return model(nodes, {"x": [rows, width]}, {"y": [rows, width]},
                 {"axes": np.array([0], np.int64), "lo": np.array(-1, np.float32),
                  "c": np.linspace(-1, 0.5, width, dtype=np.float32),
                  "g": rng.random(width, np.float32), "b": rng.random(width, np.float32)})


@pytest.mark.parametrize(("rows", "tile", "steps"), [(64, 4, 1), (256, 4, 2)])
def test_the_rows_phase_after_the_column_means_fills_the_grid(rows: int, tile: int,
                                                             steps: int) -> None:
    built = _layer_norm_after_column_means(rows, 4096)
    (group,) = StitchPlan.of_module(verify.compile_model(built, "stitch")).groups
    first, columns, last = group.phases
    assert columns.kind is PhaseKind.COLUMNS and group.mapping.row_steps == tile
    assert (first.tasks, first.row_steps) == (rows // tile, 0), first
    assert (last.tasks, last.row_steps) == (rows // steps, steps), last
    assert group.launch.grid == rows // steps
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)


def test_a_task_takes_rows_of_at_least_the_bytes_it_stages_again() -> None:
    # a batch norm over 256 rows of 128: scale, shift, mean and 1 / std staged once per block
    # (2 KB), each row 512 B: tasks of 4 rows, where tiles of 8 rows ran on 32 blocks
    built = registry.get("batchnorm_train").model("ci")
    (group,) = StitchPlan.of_module(verify.compile_model(built, "stitch")).groups
    first, _, last = group.phases
    assert (first.tasks, group.mapping.row_steps) == (32, 8), first
    assert (last.tasks, last.row_steps) == (64, 4), last
    outcome = check_model(built, "stitch")
    assert outcome.kind == "ok" and not outcome.violations, (outcome.error, outcome.violations)
