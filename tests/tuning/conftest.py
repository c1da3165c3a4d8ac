"""The RPC set-up of the tuning tests: a tracker on a free port and a server registered with
it that runs the SIMT timing function."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tvm.s_tir import meta_schedule as ms

STARTUP_SEC = 60.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# An RPC server that registers the SIMT timing function: TVM's rpc_server command has no
# hook for that, tvm.rpc.Server has server_init_callback (run in its worker process, which
# forks the process serving each session).
_SERVER = """
import functools, importlib, sys
import tvm.rpc
port, tracker_port, key = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
server = tvm.rpc.Server("127.0.0.1", port, port + 1, tracker_addr=("127.0.0.1", tracker_port),
                        key=key, server_init_callback=functools.partial(
                            importlib.import_module, "tvm_stitch.tuning.measure"))
server.proc.join()
"""


def _start(args: list[str], log: Path) -> subprocess.Popen:
    """A process in a session (and process group) of its own, so that it is ended with all
    it started."""
    with log.open("wb") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def _servers(tracker_port: int, key: str) -> int:
    config = ms.runner.RPCConfig(tracker_host="127.0.0.1", tracker_port=tracker_port,
                                 tracker_key=key, session_timeout_sec=5)
    try:
        return config.count_num_servers()
    except (ValueError, OSError, RuntimeError):  # the tracker is not listening yet
        return 0


@pytest.fixture
def simt_server(tmp_path: Path) -> Iterator[tuple[int, str]]:
    """A tracker on a free port and a SIMT server registered with it: (tracker port, key)."""
    pytest.importorskip("tornado", reason="TVM's RPC tracker needs tornado")
    tracker_port, key = _free_port(), "tvm-stitch-simt"
    procs = [_start([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1",
                     "--port", str(tracker_port), "--port-end", str(tracker_port + 1)],
                    tmp_path / "tracker.log")]
    try:
        procs.append(_start([sys.executable, "-c", _SERVER, str(_free_port()),
                             str(tracker_port), key], tmp_path / "server.log"))
        deadline = time.monotonic() + STARTUP_SEC
        while _servers(tracker_port, key) == 0:
            dead = [p.args[:3] for p in procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                logs = {f.name: f.read_text()[-2000:] for f in tmp_path.glob("*.log")}
                pytest.fail(f"no server registered with the tracker (exited: {dead}): {logs}")
            time.sleep(0.5)
        yield tracker_port, key
    finally:
        for proc in reversed(procs):
            _stop(proc)


