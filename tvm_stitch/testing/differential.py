"""One differential check: compile a model with a flow, run it on the SIMT runner, compare with
onnxruntime, and say what went wrong in terms a fuzzer can count.

Stages: ``import`` (our front end, TVM's ONNX importer), ``compile`` (the flow's pipeline),
``plan`` (the stitch plan did not give up), ``inputs``, ``simt`` (our SIMT runner),
``reference`` (onnxruntime), ``compare`` and ``resources`` (our resource checker). Every stage
that can run does, and ``Outcome.stages`` holds each one's result.

Outcome kinds:

- ``ok``: the outputs match (``verify.compare``: float32 within rtol = atol = 1e-4, float16
  within ``verify.RTOL/ATOL["float16"]`` = 1e-2, integers and booleans exactly).
- ``mismatch``: the outputs are wrong. Nothing later (a crash of the resource checker) and
  nothing the baseline does changes that.
- ``crash``: an exception, ours unless shown to be TVM's.
- ``tvm_crash``: an exception raised in TVM's code (``raised_at``: the innermost frame of
  ours or TVM's) while importing or compiling, which the baseline flow (TVM's default
  pipeline) meets too: same stage, same exception type and message (numbers aside), raised
  by the same function of TVM's. With ``flow="baseline"`` a crash raised in TVM's code while
  importing or compiling counts here. Failures in our front end, in a stitch plan, in the
  SIMT runner, in the resource checker and in the harness (inputs, onnxruntime) are always
  ``crash``.

Independently of the kind, ``fallbacks`` lists the regions the stitch plan left to TVM (with
the reason), ``violations`` the per-kernel resource limits broken by kernels the stitch flow
scheduled and ``tvm_violations`` those broken by kernels TVM scheduled (``resources``).

float16 references: onnxruntime's CPU provider lacks float16 kernels for many ops, so the
reference for a model with float16 tensors is onnxruntime on its float32 twin (every float16
type, constant and cast made float32), rounded to float16 at the outputs. The SIMT runner
rounds every float16 result of a kernel to half, as the GPU computes it
(``tvm_stitch.simt.retype``), so half-precision error shows against that reference.
"""

from __future__ import annotations

import contextlib
import re
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import onnx
import tvm
import tvm_ffi
from onnx import TensorProto, helper, numpy_helper
from tvm.ir import IRModule

from .. import pipeline, verify
from ..frontend.onnx import import_model
from ..plan import StitchPlan
from ..target import DEFAULT_TARGET
from ..workloads import inputs as make_inputs

if TYPE_CHECKING:
    from ..analysis import ModuleReport

STAGES = ("import", "compile", "plan", "inputs", "simt", "reference", "compare", "resources")
TVM_STAGES = ("import", "compile")
"""The stages where a crash can be TVM's: the others run our code (or the harness's) only."""
T = TypeVar("T")


@dataclass
class Outcome:
    """What one model did under one flow."""

    flow: str
    kind: str = "ok"  # ok | mismatch | crash | tvm_crash
    stage: str = ""  # where a crash happened (one of STAGES); "" for ok and mismatch
    error: str = ""  # exception type and message, or the worst error of a mismatch
    raised_at: str = ""  # of a crash: the innermost frame of ours or TVM's (``raised_at``)
    stages: dict[str, str] = field(default_factory=dict)  # stage -> "ok" or what failed
    max_abs_err: float | None = None
    functions: int = 0  # GPU PrimFuncs main calls
    fallbacks: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)  # in kernels the stitch flow made
    tvm_violations: list[str] = field(default_factory=list)  # in kernels TVM scheduled
    costlier: str = ""  # more kernels or global bytes than TVM's flow: how many of each
    baseline: str = ""  # the baseline flow's kind, when it was run for comparison
    trace: str = ""

    @property
    def failed(self) -> bool:
        """True for wrong numbers, crashes (ours or TVM's) and resource violations."""
        return self.kind != "ok" or bool(self.violations)

    def to_dict(self) -> dict[str, object]:
        """Plain-data form for JSON reports."""
        return asdict(self)


class StitchGaveUp(Exception):
    """The stitch pass met an unexpected error and left the whole module to TVM's fusion:
    the numbers are right, but it is a bug of ours, counted as a crash at stage "plan"."""


def default_flow() -> str:
    """The flow under test: "stitch" when that flow is available, else "baseline"."""
    from ..pipeline import available_flows

    return "stitch" if "stitch" in available_flows() else "baseline"


def float32_twin(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` computing in float32 wherever it computes in float16."""
    return widened(model, TensorProto.FLOAT16, TensorProto.FLOAT)


def widened(model: onnx.ModelProto, narrow: int, wide: int,
            stepwise: bool = False) -> onnx.ModelProto:
    """A copy of ``model`` computing in element type ``wide`` wherever it computes in
    ``narrow`` (inputs, outputs, initializers, casts and constants); ``stepwise``, rounding
    every result of a node that is ``narrow`` in ``model`` to ``narrow`` (``_stepwise``)."""
    wide_np = helper.tensor_dtype_to_np_dtype(wide)
    twin = onnx.ModelProto()
    twin.CopyFrom(model)
    graph = twin.graph
    del graph.value_info[:]
    for value in list(graph.input) + list(graph.output):
        if value.type.tensor_type.elem_type == narrow:
            value.type.tensor_type.elem_type = wide
    for i, tensor in enumerate(graph.initializer):
        if tensor.data_type == narrow:
            array = numpy_helper.to_array(tensor).astype(wide_np)
            graph.initializer[i].CopyFrom(numpy_helper.from_array(array, tensor.name))
    for node in graph.node:
        for attr in node.attribute:
            if attr.name == "to" and attr.i == narrow:
                attr.i = wide
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == narrow:
                array = numpy_helper.to_array(attr.t).astype(wide_np)
                attr.t.CopyFrom(numpy_helper.from_array(array, attr.t.name))
    _rounded_before_casts(model, graph, narrow)
    if stepwise:
        _stepwise(model, graph, narrow, wide)
    return twin


def _value_types(model: onnx.ModelProto) -> dict[str, int]:
    """The element type of every value of ``model`` (inferred)."""
    inferred = onnx.shape_inference.infer_shapes(model).graph
    types = {v.name: v.type.tensor_type.elem_type
             for v in [*inferred.input, *inferred.value_info, *inferred.output]}
    types.update({t.name: t.data_type for t in inferred.initializer})
    return types


def _stepwise(model: onnx.ModelProto, graph: onnx.GraphProto, narrow: int, wide: int) -> None:
    """Make the twin's ``graph`` round every result that is ``narrow`` in ``model`` to
    ``narrow`` and back: a narrow run that computes each op wide and stores its result
    narrow, as a GPU kernel does, where onnxruntime's CPU provider has no float16 kernel for
    many ops."""
    types = _value_types(model)
    nodes = []
    for i, node in enumerate(graph.node):
        nodes.append(node)
        for j, out in enumerate(node.output):
            if out and types.get(out) == narrow:
                unrounded, rounded = f"{out}__wide_{i}", f"{out}__narrow_{i}"
                node.output[j] = unrounded
                nodes += [helper.make_node("Cast", [unrounded], [rounded], to=narrow),
                          helper.make_node("Cast", [rounded], [out], to=wide)]
    del graph.node[:]
    graph.node.extend(nodes)


def _rounded_before_casts(model: onnx.ModelProto, graph: onnx.GraphProto, narrow: int) -> None:
    """Where ``model`` casts a ``narrow`` value to another type, make the twin's ``graph``
    round that value to ``narrow`` first: the original's value is rounded there, and a float16
    LayerNorm output cast to float32 was 1.7e-3 from a twin that never rounded it."""
    types = _value_types(model)
    nodes = []
    for i, node in enumerate(graph.node):
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        if node.op_type == "Cast" and types.get(node.input[0]) == narrow and to != narrow:
            rounded = f"{node.input[0]}__rounded_{i}"
            nodes.append(helper.make_node("Cast", [node.input[0]], [rounded], to=narrow))
            node.input[0] = rounded
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)


LONG_REDUCTION = 100_000
"""Above this many elements in a tensor, a float32 model's reference is its float64 twin,
rounded: onnxruntime's own float32 sum over 300,000 rows differs from a tree-ordered one by
3e-3 (fuzz seed 2026, large mode, graph 1), more than the tolerance, in both flows."""


def has_float16(model: onnx.ModelProto) -> bool:
    """True if any graph input, output, initializer, constant or cast of ``model`` is
    float16."""
    graph = model.graph
    types = [v.type.tensor_type.elem_type for v in list(graph.input) + list(graph.output)]
    types += [t.data_type for t in graph.initializer]
    for attr in (a for n in graph.node for a in n.attribute):
        types += [attr.i] if attr.name == "to" else []
        types += [attr.t.data_type] if attr.type == onnx.AttributeProto.TENSOR else []
    return TensorProto.FLOAT16 in types


def reference_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]
                      ) -> list[np.ndarray]:
    """onnxruntime's outputs; for float16 models, those of the float32 twin rounded back; for
    float32 models with a tensor of over ``LONG_REDUCTION`` elements, those of the float64
    twin rounded back (where onnxruntime has float64 kernels for its ops)."""
    if has_float16(model):
        return _rounded_twin_outputs(model, feeds, np.float16, TensorProto.FLOAT16,
                                     TensorProto.FLOAT)
    if max((v.size for v in feeds.values()), default=0) > LONG_REDUCTION:
        try:
            return _rounded_twin_outputs(model, feeds, np.float32, TensorProto.FLOAT,
                                         TensorProto.DOUBLE)
        except Exception:  # noqa: BLE001 - an op without a float64 kernel in onnxruntime
            pass
    return verify.reference_outputs(model, feeds)


def _rounded_twin_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                          narrow_np: type, narrow: int, wide: int,
                          stepwise: bool = False) -> list[np.ndarray]:
    wide_np = helper.tensor_dtype_to_np_dtype(wide)
    widened_feeds = {k: v.astype(wide_np) if v.dtype == narrow_np else v
                     for k, v in feeds.items()}
    outputs = verify.reference_outputs(widened(model, narrow, wide, stepwise), widened_feeds)
    dtypes = [helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)
              for v in model.graph.output]
    return [np.asarray(o).astype(d) for o, d in zip(outputs, dtypes, strict=True)]


ERROR_FACTOR = 4.0
"""A result that fails the tolerance against onnxruntime passes when it is as close to the
wider twin's result as onnxruntime's own result, within this factor (plus the usual
tolerance): an ill-conditioned graph amplifies rounding beyond any fixed tolerance (fuzz seed
2027, graph 62: a LayerNorm over the two row means of 30,000-long log-softmaxes, where both
flows were 1.7e-4 from float64 and onnxruntime 4.3e-5)."""


def as_accurate_as_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                               outputs: list[np.ndarray]) -> bool:
    """Whether every output that fails the tolerance against a run of ``model`` in its own
    type is within tolerance of the wider twin's result (float64 for a float32 model,
    float32 for one with float16) plus ``ERROR_FACTOR`` times that run's own error there;
    False where no such run or no twin's run has kernels for an op that output needs. The
    runs in the model's own type (``_narrow_runs``): onnxruntime's, and for a float16 model
    the float32 twin that rounds every float16 result to float16. Fuzz seed 1228, graph 18:
    a LayerNorm over one row of 8.4M elements, 3.6e-6 from float64 where onnxruntime's
    float32 was 6.6e-3, next to an ``Erf`` of another output. Fuzz seed 7321, graph 1185: a
    float16 LayerNorm of ``x @ w + 1.5``, whose float16 sum rounds the matmul's results of
    about 0.005 to steps of 0.001, 0.134 from the float32 twin, which does not round them,
    where onnxruntime's float16 run was 0.236 from it. Fuzz seed 604489, graph 16: a float16
    LayerNorm over the two probabilities of a softmax, which amplifies their rounding where
    they are near 1/2: 0.027 from the float32 twin after a tanh, as far as the twin that
    rounds every float16 result (0.027), where onnxruntime's float16 run stays closer."""
    narrow, wide = ((TensorProto.FLOAT16, TensorProto.FLOAT) if has_float16(model)
                    else (TensorProto.FLOAT, TensorProto.DOUBLE))
    narrow_np = helper.tensor_dtype_to_np_dtype(narrow)
    half = narrow_np == np.float16
    runs = _narrow_runs(model, feeds, narrow, wide)
    if not runs:
        return False
    for index, out in enumerate(outputs):
        theirs = [np.asarray(run[index]) for run in runs]
        if any(compare([out], [r], half=half).ok for r in theirs):
            continue
        if out.dtype != narrow_np:
            return False
        exact = _twin_output(model, feeds, index, narrow, wide)
        if exact is None or not any(r.dtype == narrow_np and _as_close(out, r, exact)
                                    for r in theirs):
            return False
    return True


def _as_close(out: np.ndarray, theirs: np.ndarray, exact: np.ndarray) -> bool:
    """Whether ``out`` is within tolerance of ``exact`` plus ``ERROR_FACTOR`` times the
    error of ``theirs``, a run in the same type, and matches it where ``exact`` is not
    finite."""
    dtype = str(out.dtype)
    allowed = (verify.ATOL[dtype] + verify.RTOL[dtype] * np.abs(exact)
               + ERROR_FACTOR * np.abs(theirs.astype(np.float64) - exact))
    error = np.abs(out.astype(np.float64) - exact)
    finite = np.isfinite(exact)
    return bool(np.all(error[finite] <= allowed[finite])
                and compare([out[~finite]], [theirs[~finite]]).ok)


def _narrow_runs(model: onnx.ModelProto, feeds: dict[str, np.ndarray], narrow: int,
                 wide: int) -> list[list[np.ndarray]]:
    """The runs of ``model`` in its own type that onnxruntime has kernels for: its own, and
    for float16 its float32 twin rounding every float16 result (``widened(stepwise=True)``),
    which onnxruntime's CPU provider can run where it lacks float16 kernels."""
    runs = []
    with contextlib.suppress(Exception):  # an op without a kernel of the type
        runs.append(verify.reference_outputs(model, feeds))
    if narrow == TensorProto.FLOAT16:
        with contextlib.suppress(Exception):
            runs.append(_rounded_twin_outputs(model, feeds, np.float16, narrow, wide,
                                              stepwise=True))
    return runs


def _twin_output(model: onnx.ModelProto, feeds: dict[str, np.ndarray], index: int,
                 narrow: int, wide: int) -> np.ndarray | None:
    """Output ``index`` of ``model``'s twin computing in ``wide`` where it computes in
    ``narrow`` (``widened``), from the nodes that output needs alone: another output's op
    may have no float64 kernel in onnxruntime (``Erf``) where this one's all do; None where
    one of them has none."""
    narrow_np = helper.tensor_dtype_to_np_dtype(narrow)
    wide_np = helper.tensor_dtype_to_np_dtype(wide)
    twin_feeds = {k: v.astype(wide_np) if v.dtype == narrow_np else v
                  for k, v in feeds.items()}
    try:
        (exact,) = verify.reference_outputs(
            widened(_one_output(model, index), narrow, wide), twin_feeds)
    except Exception:  # noqa: BLE001 - an op without a float64 kernel in onnxruntime
        return None
    return np.asarray(exact, np.float64)


def _one_output(model: onnx.ModelProto, index: int) -> onnx.ModelProto:
    """A copy of ``model`` with output ``index`` alone and the nodes it needs (every input
    kept, so the same feeds serve)."""
    single = onnx.ModelProto()
    single.CopyFrom(model)
    graph = single.graph
    keep = graph.output[index]
    needed, kept = {keep.name}, []
    for node in reversed(graph.node):
        if needed & set(node.output):
            kept.append(node)
            needed |= set(node.input)
    del graph.output[:]
    graph.output.append(keep)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    return single


def compare(outputs: list[np.ndarray], expected: list[np.ndarray],
            half: bool = False) -> verify.Check:
    """``verify.compare`` with dtypes checked and non-finite values compared exactly (an inf
    must be the same inf, a NaN a NaN), and 0-d outputs handled: ``verify.compare`` crashes
    on 0-d arrays, rejects NaN against NaN and accepts anything against an inf (see
    tests/regressions/test_verify_compare.py). With ``half`` (a model that computes in
    float16), float32 outputs are held to float16's tolerance: they are no more precise than
    the halves they were computed from (a float16 LayerNorm cast to float32 differed from the
    twin by one half ulp, 2e-3)."""
    if len(outputs) != len(expected):
        return verify.Check(float("inf"), False)
    pairs = [_comparable(out, np.asarray(ref)) for out, ref in zip(outputs, expected, strict=True)]
    if any(out.dtype != ref.dtype for out, ref in pairs):
        return verify.Check(float("inf"), False)
    if half:
        checks = [_within_half(out.astype(np.float64), ref.astype(np.float64))
                  if out.dtype == np.float32 else verify.compare([out], [ref])
                  for out, ref in pairs]
        return verify.Check(max((c.max_abs_err for c in checks), default=0.0),
                            all(c.ok for c in checks))
    return verify.compare([out for out, _ in pairs], [ref for _, ref in pairs])


def _within_half(out: np.ndarray, ref: np.ndarray) -> verify.Check:
    error = np.where(out == ref, 0.0, np.abs(out - ref))
    allowed = verify.ATOL["float16"] + verify.RTOL["float16"] * np.abs(ref)
    worst = float(error.max()) if error.size else 0.0
    return verify.Check(worst, bool(np.all(error <= allowed)))


def _comparable(out: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """At least 1-d copies where matching non-finite values become 0 and mismatching ones
    NaN in ``out`` against 0 in ``ref`` (which ``verify.compare`` reports as an error)."""
    out, ref = np.atleast_1d(out), np.atleast_1d(ref)
    if out.shape != ref.shape or out.dtype.kind != "f" or ref.dtype.kind != "f":
        return out, ref
    special = ~(np.isfinite(out) & np.isfinite(ref))
    agree = (out == ref) | (np.isnan(out) & np.isnan(ref))
    out = np.where(special, np.where(agree, 0.0, np.nan), out).astype(out.dtype)
    ref = np.where(special, 0.0, ref).astype(ref.dtype)
    return out, ref


def difference(outputs: list[np.ndarray], expected: list[np.ndarray],
               half: bool = False) -> str:
    """Where ``outputs`` first differ from ``expected``, in words."""
    if len(outputs) != len(expected):
        return f"{len(outputs)} output(s), expected {len(expected)}"
    for i, (out, ref) in enumerate(zip(outputs, expected, strict=True)):
        ref = np.asarray(ref)
        if out.shape != ref.shape or out.dtype != ref.dtype:
            return (f"output {i} is {out.dtype}{list(out.shape)}, "
                    f"expected {ref.dtype}{list(ref.shape)}")
        check = compare([out], [ref], half)
        if not check.ok and ref.dtype.kind != "f":  # compared exactly: no error to size
            return f"output {i}: {int(np.sum(out != ref))} of {ref.size} elements differ"
        if not check.ok:
            return f"output {i}: max abs error {check.max_abs_err:.3g}"
    return "outputs match"


def _stage(outcome: Outcome, stage: str, fn: Callable[..., T], *args: object
           ) -> tuple[bool, T | None]:
    """Run one stage, recording its result in ``outcome.stages``; ``(True, value)``, or
    ``(False, None)`` after recording the exception (the first crash decides ``kind``,
    ``stage`` and ``error``; a later one is kept in ``stages`` only)."""
    try:
        value = fn(*args)
    except Exception as err:  # every failure is counted, whatever raised it
        message = f"{type(err).__name__}: {err}"
        outcome.stages[stage] = message[:2000]
        if outcome.kind == "ok":
            outcome.kind, outcome.stage, outcome.error = "crash", stage, message[:2000]
            outcome.raised_at = raised_at(err)
            outcome.trace = "".join(traceback.format_exception(err))[-6000:]
        return False, None
    outcome.stages[stage] = "ok"
    return True, value


def check_model(model: onnx.ModelProto, flow: str, target: str = DEFAULT_TARGET, seed: int = 0,
                resources: bool = True, triage: bool = True,
                feeds: dict[str, np.ndarray] | None = None,
                expected: list[np.ndarray] | None = None, cost: bool = False) -> Outcome:
    """Import ``model``, compile it with ``flow``, run it on the SIMT runner, compare and
    (``resources``) check every kernel's resources; every stage that can run does, and its
    result is in ``Outcome.stages``. Inputs are ``feeds``, else seeded random values; the
    reference is ``expected``, else onnxruntime's outputs. ``triage`` runs the baseline flow
    on a failure, to show what TVM's default pipeline does with the model and to excuse a
    crash that is TVM's (``_triage``). ``cost`` compiles the baseline flow too and records
    in ``Outcome.costlier`` whether ``flow`` needs more kernels or global bytes (counted
    from the TIR) than TVM's flow: never a failure, since Global groups buy parallelism with
    partial sums through global memory."""
    from ..simt import SimtModule
    from .resources import check_resources

    outcome = Outcome(flow)
    ok, imported = _stage(outcome, "import", import_model, model)
    ok, scheduled = _stage(outcome, "compile", pipeline.lower, imported, target, flow
                           ) if ok else (False, None)
    if not ok:
        return _finish(outcome, triage, model, target, seed, feeds, expected)
    _, plan = _stage(outcome, "plan", _plan, scheduled, outcome)
    if cost and flow != "baseline":
        # our traffic counter failing on our kernel is our crash, recorded as such
        counted, ours = _stage(outcome, "cost", _analyze, scheduled, target)
        if counted:
            outcome.costlier = _costlier(imported, ours, target, outcome)
    if feeds is None:
        _, feeds = _stage(outcome, "inputs", make_inputs, model, seed)
    ran = feeds is not None
    ran, simt = _stage(outcome, "simt", SimtModule, scheduled) if ran else (False, None)
    ran, outputs = _stage(outcome, "simt", simt, *feeds.values()) if ran else (False, None)
    if ran:
        outcome.functions = len(simt.functions)
        onnxruntime = expected is None
        if onnxruntime:
            _, expected = _stage(outcome, "reference", reference_outputs, model, feeds)
    if ran and expected is not None:
        check = compare(outputs, expected, half=has_float16(model))
        outcome.max_abs_err = check.max_abs_err
        outcome.stages["compare"] = "ok" if check.ok else difference(
            outputs, expected, has_float16(model))
        if not check.ok and onnxruntime and as_accurate_as_onnxruntime(model, feeds, outputs):
            check = verify.Check(check.max_abs_err, True)
            outcome.stages["compare"] = (f"ok: {outcome.stages['compare']} from onnxruntime, "
                                         "as close to the wider twin's result as a run in "
                                         "the model's own type")
        if not check.ok:  # wrong numbers outrank any crash: never excused, never overwritten
            outcome.kind, outcome.stage = "mismatch", ""
            outcome.error, outcome.raised_at = outcome.stages["compare"], ""
    if resources:
        checked, report = _stage(outcome, "resources", check_resources, scheduled, plan)
        if checked:
            outcome.violations = report.violations
            outcome.tvm_violations = report.tvm_violations
    return _finish(outcome, triage, model, target, seed, feeds, expected)


def _analyze(scheduled: IRModule, target: str) -> ModuleReport:
    from ..analysis import analyze

    return analyze(scheduled, target=target)


def _costlier(imported: IRModule, ours: ModuleReport, target: str, outcome: Outcome) -> str:
    """How the module ``ours`` counts needs more kernels or global bytes than TVM's flow
    compiles ``imported`` in, or ""; "" too when TVM's flow does not compile it (in
    ``outcome.stages["cost"]``)."""
    try:
        tvms = _analyze(pipeline.lower(imported, target, "baseline"), target)
    except Exception as err:  # noqa: BLE001 - TVM's failure; the triage names it
        outcome.stages["cost"] = f"TVM's flow: {type(err).__name__}: {err}"[:2000]
        return ""
    counts = (len(ours.kernels), ours.global_bytes, len(tvms.kernels), tvms.global_bytes)
    if None in counts or (counts[0] <= counts[2] and counts[1] <= counts[3]):
        return ""
    return f"{counts[0]} kernels, {counts[1]} B; TVM's flow {counts[2]} kernels, {counts[3]} B"


def _plan(scheduled: IRModule, outcome: Outcome) -> StitchPlan | None:
    """The module's stitch plan, its fallbacks recorded in ``outcome``; raises StitchGaveUp
    when the stitch pass gave up."""
    plan = StitchPlan.of_module(scheduled)
    if plan is not None:
        outcome.fallbacks = [f"{', '.join(f.ops)}: {f.reason}" for f in plan.fallbacks]
        gave_up = [n for n in plan.notes if n.startswith("stitching gave up")]
        if gave_up:
            raise StitchGaveUp(gave_up[0])
    return plan


def _finish(outcome: Outcome, triage: bool, model: onnx.ModelProto, target: str, seed: int,
            feeds: dict[str, np.ndarray] | None, expected: list[np.ndarray] | None) -> Outcome:
    if outcome.flow == "baseline":
        # TVM's default pipeline: a crash raised in TVM's code while importing or compiling
        # is TVM's; anything in our front end, runner or checks is ours
        if outcome.kind == "crash" and _tvms(outcome):
            outcome.kind = "tvm_crash"
    elif triage and outcome.kind != "ok":
        _triage(outcome, model, target, seed, feeds, expected)
    return outcome


def _tvms(outcome: Outcome) -> bool:
    """True for a crash raised in TVM's code at a stage that runs TVM's code only."""
    return outcome.stage in TVM_STAGES and outcome.raised_at.startswith(("tvm/", "tvm_ffi/",
                                                                           "c++:"))


def _triage(outcome: Outcome, model: onnx.ModelProto, target: str, seed: int,
            feeds: dict[str, np.ndarray] | None, expected: list[np.ndarray] | None) -> None:
    """Run the baseline flow on a failing model (its kind goes into ``outcome.baseline``); a
    crash becomes TVM's only when it was raised in TVM's code while importing or compiling
    and the baseline fails with the same error: exception type, message with its numbers
    left out, and the function of TVM's that raised it."""
    base = check_model(model, "baseline", target, seed, False, False, feeds, expected)
    outcome.baseline = base.kind if not base.stage else f"{base.kind} at {base.stage}"
    if (outcome.kind == "crash" and _tvms(outcome) and base.kind == "tvm_crash"
            and (base.stage, base.raised_at, normalised(base.error))
            == (outcome.stage, outcome.raised_at, normalised(outcome.error))):
        outcome.kind = "tvm_crash"


_NATIVE = ("src/", "include/", "3rdparty/", "python/tvm_ffi/")  # tvm_ffi's frames of C++, Cython
_PACKAGES = {"tvm_stitch": Path(__file__).parents[1], "tvm": Path(tvm.__file__).parent,
             "tvm_ffi": Path(tvm_ffi.__file__).parent}


def raised_at(error: BaseException) -> str:
    """Where ``error`` was raised, as ``package/path.py:function`` of the innermost frame in
    our code (``tvm_stitch/...``) or TVM's (``tvm/...``, ``tvm_ffi/...``, or a C++ frame of
    TVM's as ``c++:file:function``); frames of other libraries (numpy, the standard library)
    are passed over, so an error numpy raises for our code is ours."""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        path = Path(frame.filename)
        if not path.is_absolute():
            if frame.filename.startswith(_NATIVE) or "tvm::" in frame.name:
                return f"c++:{frame.filename}:{frame.name}"
            continue
        for name, root in _PACKAGES.items():
            if path.is_relative_to(root):
                return f"{name}/{path.relative_to(root).as_posix()}:{frame.name}"
    return ""


def normalised(message: str) -> str:
    """``message`` without its numbers and addresses (and only its first line): the same
    error met in another model or kernel reads the same."""
    first = message.splitlines()[0] if message else ""
    return re.sub(r"0x[0-9a-f]+|\d+", "#", first)
