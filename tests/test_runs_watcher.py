"""lesson10.runs.watcher: it ends the process it watches only while that is the same process
(its start time matches) and still running."""
import subprocess
import sys
from pathlib import Path

import pytest

from lesson10.runs import watcher

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


def _start_time(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


@pytest.fixture
def child():
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.stdin.close()
    proc.wait()


def test_same_knows_the_process_by_its_start_time(child):
    start = _start_time(child.pid)
    assert watcher.same(child.pid, start)
    assert not watcher.same(child.pid, str(int(start) + 1))          # a reused pid
    assert not watcher.same(2 ** 22 + 1, start)                        # beyond pid_max: none


def test_a_process_still_there_after_the_grace_is_killed_and_named(child, capsys):
    assert watcher.main([str(child.pid), _start_time(child.pid), "3", "0", "after the exit barrier"]) == 0
    assert child.wait() == -9
    err = capsys.readouterr().err
    assert f"rank 3: its torchrun agent (pid {child.pid})" in err and "after the exit barrier" in err


def test_another_process_with_the_same_pid_is_spared(child, capsys):
    wrong = str(int(_start_time(child.pid)) + 1)
    assert watcher.main([str(child.pid), wrong, "0", "0", "x"]) == 0
    assert child.poll() is None and capsys.readouterr().err == ""
