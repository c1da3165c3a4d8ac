"""verify.compare: gaps found while differential testing (tvm_stitch.testing.differential
.compare works around them). Owner: verify.py."""

from __future__ import annotations

import numpy as np

from tvm_stitch.verify import compare


def test_scalar_outputs_compare() -> None:
    assert compare([np.array(1.0, np.float32)], [np.array(1.0, np.float32)]).ok


def test_wrong_value_against_inf_is_caught() -> None:
    ref = np.array([1.0, np.inf], np.float32)
    assert not compare([np.array([1.0, -np.inf], np.float32)], [ref]).ok
    assert not compare([np.array([1.0, 0.0], np.float32)], [ref]).ok


def test_nan_matches_nan() -> None:
    ref = np.array([1.0, np.nan], np.float32)
    assert compare([ref.copy()], [ref]).ok
