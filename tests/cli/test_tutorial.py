"""docs/tutorial.md runs as written: every ``python`` and ``sh`` block, in order, in one empty
folder (Python in one namespace, shell through bash with the environment's ``tvm-stitch`` on
the PATH). A block marked ``gpu`` runs where there is a GPU; elsewhere it must fail for want of
one. A ``text`` block right after a shell block is that block's output: each of its lines but
the elisions (``...``) must be a line of what the block printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import tvm

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"
HAS_GPU = tvm.cuda(0).exist
ELISION = "..."


@dataclass(frozen=True)
class Block:
    """A fenced block of the tutorial: its first line's number, language and tags, and code."""

    line: int
    language: str
    tags: tuple[str, ...]
    code: str

    @property
    def where(self) -> str:
        """Where the block is, for failure messages."""
        return f"{TUTORIAL.name}:{self.line}"


def blocks(text: str) -> list[Block]:
    """The fenced blocks of a Markdown text, in order."""
    found: list[Block] = []
    opened: tuple[int, list[str]] | None = None
    body: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("```"):
            body.append(line)
        elif opened is None:
            opened, body = (number, line[3:].split() or ["text"]), []
        else:
            language, *tags = opened[1]
            found.append(Block(opened[0], language, tuple(tags), "\n".join(body) + "\n"))
            opened = None
    assert opened is None, f"unclosed block at {TUTORIAL.name}:{opened[0]}"
    return found


def _run_shell(block: Block, folder: Path) -> str:
    """Run a shell block; returns its output, checked as the block's tags say."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], cwd=folder,
                          env={**os.environ, "PATH": path}, capture_output=True, text=True,
                          timeout=300)
    if "gpu" in block.tags and not HAS_GPU:
        assert done.returncode == 2, f"{block.where}: exit {done.returncode}\n{done.stderr}"
        assert "NVIDIA GPU" in done.stderr, f"{block.where}: {done.stderr}"
    else:
        assert done.returncode == 0, f"{block.where}: exit {done.returncode}\n{done.stderr}"
    return done.stdout


def _run_python(block: Block, namespace: dict[str, object]) -> None:
    code = compile(block.code, block.where, "exec")
    if "gpu" in block.tags and not HAS_GPU:
        with pytest.raises(RuntimeError, match="cuda"):  # no loader for the CUDA module
            exec(code, namespace)
    else:
        exec(code, namespace)


def test_every_snippet_of_the_tutorial_runs(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    if HAS_GPU and "TVM_CUDA_COMPILE_MODE" not in os.environ:
        try:  # TVM compiles the library's CUDA source when loading it: NVRTC or nvcc
            import cuda.bindings  # noqa: F401
        except ImportError:
            monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "nvcc")
    namespace: dict[str, object] = {"__name__": "tutorial"}
    ran: list[str] = []
    last_output: str | None = None
    for block in blocks(TUTORIAL.read_text()):
        if block.language == "python":
            _run_python(block, namespace)
            last_output = None
        elif block.language == "sh":
            last_output = _run_shell(block, tmp_path)
        elif block.language == "text" and last_output is not None:
            printed = last_output.splitlines()
            for line in block.code.splitlines():
                if line.strip() != ELISION:
                    assert line in printed, f"{block.where}: {line!r} not printed:\n" \
                                            f"{last_output}"
            last_output = None
        else:
            continue
        ran.append(block.language)
    assert ran.count("python") >= 5 and ran.count("sh") >= 3 and "text" in ran
    for name in ("layer_norm.so", "layer_norm.json", "layer_norm_api.so", "layer_norm_api.json",
                 "layer_norm_tvm.so", "layer_norm_batch.so"):
        assert (tmp_path / name).is_file(), name
    sidecar = json.loads((tmp_path / "layer_norm_batch.json").read_text())
    assert sidecar["dims"] == {"batch": 4096}
    assert sidecar["inputs"] == [{"name": "x", "shape": ["batch", 256], "dtype": "float32"}]
    assert (tmp_path / "y.npz").is_file() == HAS_GPU
