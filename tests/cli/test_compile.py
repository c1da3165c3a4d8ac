"""tvm-stitch compile and run: the library and sidecar written for a model, targets in every
form, and what run checks before it needs a GPU.

A library exported for CUDA does not load on a machine without the CUDA driver (TVM's CUDA
runtime is not there to read its CUDA module), so without a GPU these tests check the written
files, the sidecar against the model, and run's errors; with one, run's outputs too.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import tvm

import tvm_stitch
from tvm_stitch import cli, workloads
from tvm_stitch.deploy import DeviceError, compile_onnx, run_library
from tvm_stitch.plan import StitchPlan
from tvm_stitch.sidecar import Sidecar, SidecarError, TensorSpec
from tvm_stitch.target import parse_target
from tvm_stitch.verify import reference_outputs

ROWS, WIDTH = 64, 256  # layer_norm at ci size
HAS_GPU = tvm.cuda(0).exist


def _save(model: onnx.ModelProto, path: Path) -> str:
    onnx.save(model, path)
    return str(path)


def _symbolic_batch(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with the leading dimension of its inputs and outputs named ``batch``."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for value in (*out.graph.input, *out.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("models")
    model = workloads.get("layer_norm").model("ci")
    return {"static": _save(model, folder / "layer_norm.onnx"),
            "batch": _save(_symbolic_batch(model), folder / "layer_norm_batch.onnx")}


@pytest.fixture(scope="module")
def compiled(models, tmp_path_factory) -> Path:
    """layer_norm compiled by the command with the defaults: the library's path."""
    library = tmp_path_factory.mktemp("lib") / "out" / "layer_norm.so"
    assert cli.main(["compile", models["static"], "-o", str(library)]) == 0
    return library


def test_compile_writes_the_library_and_a_sidecar_that_describes_the_model(compiled) -> None:
    data = compiled.read_bytes()
    assert data[:4] == b"\x7fELF"
    assert b"__tvm_ffi__library_bin" in data  # the VM executable and its modules
    sidecar = json.loads(compiled.with_suffix(".json").read_text())
    plan = StitchPlan.from_dict(sidecar["plan"])
    (group,) = plan.groups
    assert group.function.encode() in data, "the stitched kernel's CUDA source is in it"
    assert sidecar["format"] == 1 and sidecar["model"] == "layer_norm.onnx"
    assert sidecar["flow"] == "stitch"
    assert sidecar["inputs"] == [{"name": "x", "shape": [ROWS, WIDTH], "dtype": "float32"}]
    assert sidecar["outputs"] == [{"name": "y", "shape": [ROWS, WIDTH], "dtype": "float32"}]
    assert sidecar["target"]["kind"] == "cuda" and sidecar["target"]["arch"] == "sm_90"
    assert sidecar["dims"] == {} and sidecar["database"] is None and not plan.fallbacks
    assert sidecar["versions"] == {"tvm_stitch": tvm_stitch.__version__,
                                   "tvm": tvm.__version__,
                                   "tvm_ffi": sidecar["versions"]["tvm_ffi"]}
    assert Sidecar.load(compiled.with_suffix(".json")).inputs == (
        TensorSpec("x", (ROWS, WIDTH), "float32"),)


def test_a_symbolic_model_compiles_symbolic_with_its_size_hint(models, tmp_path,
                                                               capsys) -> None:
    library = tmp_path / "batch.so"
    assert cli.main(["compile", models["batch"], "-o", str(library), "--dim",
                     "batch=4096"]) == 0
    assert "symbolic batch (hint 4096)" in capsys.readouterr().out
    sidecar = Sidecar.load(tmp_path / "batch.json")
    assert sidecar.inputs == (TensorSpec("x", ("batch", WIDTH), "float32"),)
    assert sidecar.outputs == (TensorSpec("y", ("batch", WIDTH), "float32"),)
    assert sidecar.dims == {"batch": 4096}
    (group,) = StitchPlan.from_dict(sidecar.plan).groups
    assert group.mapping.rows_expr == "batch", "the grid follows the batch at run time"
    assert cli.main(["compile", models["batch"], "-o", str(tmp_path / "nohint.so")]) == 0
    assert Sidecar.load(tmp_path / "nohint.json").dims == {"batch": None}


def test_the_sidecar_records_the_declared_upper_bounds(models, tmp_path) -> None:
    """A bound of a symbolic dimension is no size limit of the library (larger sizes run the
    re-reading body), so it is recorded apart from the size hints."""
    assert cli.main(["compile", models["batch"], "-o", str(tmp_path / "bounded.so"),
                     "--dim-max", "batch=8192"]) == 0
    sidecar = Sidecar.load(tmp_path / "bounded.json")
    assert sidecar.dim_max == {"batch": 8192} and sidecar.dims == {"batch": None}
    assert Sidecar.load(tmp_path / "bounded.json") == Sidecar.from_dict(sidecar.to_dict())


def test_compile_onnx_takes_a_model_proto_the_json_target_and_the_baseline_flow(
        tmp_path) -> None:
    model = workloads.get("layer_norm").model("ci")
    result = compile_onnx(model, {"kind": "cuda", "arch": "sm_80"}, flow="baseline")
    assert result.plan is None and result.sidecar.plan is None
    assert result.sidecar.arch == "sm_80" and result.sidecar.flow == "baseline"
    assert result.sidecar.model == model.graph.name
    written = result.export(tmp_path / "baseline.so")
    assert written == tmp_path / "baseline.json"
    assert Sidecar.load(written) == result.sidecar
    assert (tmp_path / "baseline.so").stat().st_size > 0


def test_compile_records_the_tuning_database_and_refuses_a_file_for_one(models, tmp_path,
                                                                        capsys) -> None:
    database = tmp_path / "db"
    assert cli.main(["compile", models["static"], "-o", str(tmp_path / "m.so"),
                     "--db", str(database)]) == 0
    assert Sidecar.load(tmp_path / "m.json").database == str(database)
    assert cli.main(["compile", models["static"], "-o", str(tmp_path / "c.so"),
                     "--model", "h200"]) == 0
    sidecar = Sidecar.load(tmp_path / "c.json")
    assert sidecar.cost_model == "h200" and sidecar.database is None
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    assert cli.main(["compile", models["static"], "-o", str(tmp_path / "n.so"),
                     "--db", str(not_a_folder)]) == 2
    assert "a tuning database is a directory" in capsys.readouterr().err


def test_targets_in_json_form_and_the_shorthand_are_the_same() -> None:
    shorthand = parse_target("cuda:sm_80")
    assert str(parse_target({"kind": "cuda", "arch": "sm_80"})) == str(shorthand)
    assert str(parse_target('{"kind": "cuda", "arch": "sm_80"}')) == str(shorthand)
    own = parse_target({"kind": "cuda", "arch": "sm_90", "max_threads_per_block": 512})
    assert int(own.attrs["max_threads_per_block"]) == 512, "the dict's own values win"
    with pytest.raises(ValueError, match="kind 'llvm' is not supported"):
        parse_target({"kind": "llvm"})


@pytest.mark.parametrize("spec, shown", [
    ("cuda -arch=sm_90", ['{"kind": "cuda", "arch": "sm_90"}', "'cuda:sm_90'"]),
    ("cuda -arch=sm_80 -max_num_threads=512",
     ['{"kind": "cuda", "arch": "sm_80", "max_num_threads": 512}']),
])
def test_the_old_string_form_of_a_target_shows_the_form_to_use(spec, shown) -> None:
    with pytest.raises(ValueError, match="old string form") as err:
        parse_target(spec)
    for form in shown:
        assert form in str(err.value)
    assert ("shorthand" in str(err.value)) == (len(shown) == 2)


def test_compile_refusals_exit_2_with_the_reason(models, tmp_path, capsys) -> None:
    out = str(tmp_path / "x.so")
    with pytest.raises(SystemExit) as usage:
        cli.main(["compile", models["static"], "-o", out, "--target", "cuda -arch=sm_90"])
    assert usage.value.code == 2
    err = capsys.readouterr().err
    assert "old string form" in err and '{"kind": "cuda", "arch": "sm_90"}' in err
    assert cli.main(["compile", models["static"], "-o", str(tmp_path / "x.bin")]) == 2
    assert "must end in .so" in capsys.readouterr().err
    assert cli.main(["compile", models["static"], "-o", out, "--dim", "batch=8"]) == 2
    assert "no input has a symbolic dimension named 'batch'" in capsys.readouterr().err
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"garbage")
    assert cli.main(["compile", str(bad), "-o", out]) == 2
    assert "bad.onnx" in capsys.readouterr().err
    assert not Path(out).exists()


def _sidecar(*inputs: TensorSpec) -> Sidecar:
    return Sidecar(model="m.onnx", flow="stitch", target={"kind": "cuda", "arch": "sm_90"},
                   inputs=inputs, outputs=(TensorSpec("y", ("batch", 4), "float32"),),
                   dims={"batch": None}, plan=None, database=None, versions={})


def test_run_checks_the_arrays_against_the_sidecar() -> None:
    sidecar = _sidecar(TensorSpec("x", ("batch", 4), "float32"),
                       TensorSpec("mask", ("batch", 4), "bool"))
    x, mask = np.ones((3, 4), np.float32), np.ones((3, 4), bool)
    args = sidecar.arguments({"mask": mask, "x": x})
    assert [a.dtype for a in args] == [np.float32, np.bool_], "main's order, not the file's"
    cases = {
        "missing mask": {"x": x},
        "not an input z": {"x": x, "mask": mask, "z": x},
        "dtype float64, expected float32": {"x": x.astype(np.float64), "mask": mask},
        "expected rank 2": {"x": x[0], "mask": mask},
        r"shape \(3, 5\), expected \(batch, 4\)": {"x": np.ones((3, 5), np.float32),
                                                   "mask": mask},
        "batch is 3 in input x and 2 in input mask": {"x": x, "mask": mask[:2]},
    }
    for message, arrays in cases.items():
        with pytest.raises(SidecarError, match=message):
            sidecar.arguments(arrays)


def test_run_argument_errors_exit_2(compiled, tmp_path, capsys) -> None:
    inputs = tmp_path / "x.npz"
    np.savez(inputs, x=np.ones((ROWS, WIDTH), np.float32))
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, y=np.ones((ROWS, WIDTH), np.float32))
    one_array = tmp_path / "x.npy"
    np.save(one_array, np.ones(3))
    (tmp_path / "gone.json").write_text(compiled.with_suffix(".json").read_text())
    cases = {
        "no library": [str(tmp_path / "gone.so"), "--inputs", str(inputs)],
        "missing x; not an input y": [str(compiled), "--inputs", str(wrong)],
        "holds one array": [str(compiled), "--inputs", str(one_array)],
        "no input file": [str(compiled), "--inputs", str(tmp_path / "none.npz")],
        "no sidecar": [str(tmp_path / "other.so"), "--inputs", str(inputs)],
        "must end in .so": [str(compiled.with_suffix(".json")), "--inputs", str(inputs)],
    }
    for message, argv in cases.items():
        assert cli.main(["run", *argv]) == 2, message
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["run", str(compiled)])  # --inputs is required
    assert "--inputs" in capsys.readouterr().err


def test_a_malformed_sidecar_is_named(tmp_path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": 1, "model": "m"}')
    with pytest.raises(SidecarError, match="broken.json: malformed sidecar"):
        Sidecar.load(broken)
    broken.write_text('{"format": 7}')
    with pytest.raises(SidecarError, match="format 7"):
        Sidecar.load(broken)


@pytest.mark.skipif(HAS_GPU, reason="checks the error of a machine without a GPU")
def test_run_without_a_gpu_exits_2_saying_so(compiled, tmp_path, capsys) -> None:
    inputs = tmp_path / "x.npz"
    np.savez(inputs, x=np.ones((ROWS, WIDTH), np.float32))
    assert cli.main(["run", str(compiled), "--inputs", str(inputs)]) == 2
    assert "NVIDIA GPU" in capsys.readouterr().err
    with pytest.raises(DeviceError):
        run_library(compiled, {"x": np.ones((ROWS, WIDTH), np.float32)})


@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
def test_run_on_the_gpu_matches_onnxruntime(models, tmp_path) -> None:
    dev = tvm.cuda(0)
    arch = "sm_" + str(dev.compute_version).replace(".", "")
    library = tmp_path / "gpu.so"
    assert cli.main(["compile", models["batch"], "-o", str(library), "--target",
                     f"cuda:{arch}"]) == 0
    x = np.random.default_rng(0).standard_normal((5, WIDTH), dtype=np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    assert cli.main(["run", str(library), "--inputs", str(tmp_path / "x.npz"),
                     "--outputs", str(tmp_path / "y.npz")]) == 0
    y = np.load(tmp_path / "y.npz")["y"]
    (expected,) = reference_outputs(onnx.load(models["batch"]), {"x": x})
    np.testing.assert_allclose(y, expected, rtol=1e-3, atol=1e-3)  # nvcc's fast math
