"""tests/cpu_hog.py (make test-loaded's load): the command's exit status, and no hog left behind."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HOG = Path(__file__).with_name("cpu_hog.py")
# prints the pids of its parent's children (the hogs and itself), then runs its argument
SIBLINGS = ("import os, sys, time; p = os.getppid(); "
            "print(open(f'/proc/{p}/task/{p}/children').read(), flush=True); exec(sys.argv[1])")


def _gone(pids, within=60.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        if not [p for p in pids if Path(f"/proc/{p}").exists()]:
            return True
        time.sleep(0.1)
    return False


def test_the_command_runs_beside_busy_processes_and_they_are_stopped():
    proc = subprocess.run([sys.executable, str(HOG), "--cpus", "2", "--", sys.executable, "-c",
                           SIBLINGS, "sys.exit(3)"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr            # the command's own status
    pids = [int(p) for p in proc.stdout.splitlines()[1].split()]
    assert len(pids) == 3, proc.stdout                  # two hogs and the command
    assert _gone(pids), pids
    assert "2 busy processes" in proc.stdout and "exit status 3" in proc.stdout


def test_hogs_leave_when_the_script_is_killed():
    proc = subprocess.Popen([sys.executable, str(HOG), "--cpus", "1", "--", sys.executable, "-c",
                             SIBLINGS, "time.sleep(300)"], stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        proc.stdout.readline()                          # cpu_hog's own line
        pids = [int(p) for p in proc.stdout.readline().split()]
        hog = [p for p in pids if b"cpu_hog.py" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(hog) == 1 and len(pids) == 2, pids   # a fork of the script, and the command
        os.kill(proc.pid, signal.SIGKILL)               # no finally runs: the hog sees its parent go
        proc.wait(30)
        assert _gone(hog), pids
    finally:
        for p in pids:                                  # the orphaned command
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        proc.stdout.close()


def test_a_missing_command_is_refused():
    proc = subprocess.run([sys.executable, str(HOG)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "a command after --" in proc.stderr, proc.stderr
