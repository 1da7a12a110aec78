"""``make lab``, the README's first command, starts JupyterLab as root and as a user."""
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_lab_target_passes_allow_root_only_to_root():
    if shutil.which("make") is None:
        pytest.skip("no make")
    out = subprocess.run(["make", "-n", "-o", ".venv/.installed", "lab"], cwd=ROOT,
                         capture_output=True, text=True).stdout
    line = [ln for ln in out.splitlines() if "jupyter lab" in ln]
    assert line, out
    assert ("--allow-root" in line[0]) == (os.geteuid() == 0), line


def test_make_lab_serves_the_notebooks(tmp_path):
    """The lab target's own command (``make lab``, without reinstalling ``.venv``) answers HTTP
    on a free port, as this user (root here and in CI); then it is stopped."""
    if shutil.which("make") is None or not (ROOT / ".venv" / "bin" / "jupyter").exists():
        pytest.skip("needs make and .venv/bin/jupyter (make lab sets them up)")
    port = _free_port()
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path), JUPYTER_DATA_DIR=str(tmp_path),
               BROWSER="true")
    args = f"--no-browser --port={port} --ServerApp.token= --ServerApp.ip=127.0.0.1"
    proc = subprocess.Popen(["make", "-o", ".venv/.installed", "lab", f"LAB_ARGS={args}"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        body, end = None, time.monotonic() + 120
        while body is None and time.monotonic() < end and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=5) as r:
                    body = r.read().decode()
            except OSError:
                time.sleep(0.5)
        if body is None:
            proc.kill()
            pytest.fail(f"no answer on port {port} (make exited {proc.poll()}):\n"
                        f"{proc.communicate(timeout=30)[0][-3000:]}")
        assert "started" in body or "kernels" in body, body
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert proc.returncode is not None
