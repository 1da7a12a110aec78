"""The watcher of a torchrun agent: a small program a rank starts beside itself.

``python watcher.py PID START RANK GRACE WHY``: waits up to ``GRACE`` seconds while the
process ``PID`` (the same one: its start time, field 22 of ``/proc/PID/stat``, is ``START``)
is alive and not a zombie; if it is still there then, it says so on stderr (``WHY``: the
moment it was left behind in) and ends it with SIGKILL. It runs as a script file with the
standard library only (:func:`lesson10.runs.agent.stop_agent_later` starts it), so it
outlives the rank without importing the package.
"""
from __future__ import annotations

import os
import signal
import sys
import time


def same(pid: int, start: str) -> bool:
    """Whether ``pid`` is still the process that started at ``start`` and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return len(fields) > 19 and fields[19] == start and fields[0] != "Z"


def main(argv: list[str]) -> int:
    pid, start, rank, grace, why = int(argv[0]), argv[1], argv[2], float(argv[3]), argv[4]
    end = time.monotonic() + grace
    while time.monotonic() < end and same(pid, start):
        time.sleep(0.2)
    if same(pid, start):
        print(f"rank {rank}: its torchrun agent (pid {pid}) was still running {grace:g} s {why}: "
              "ending it with SIGKILL", file=sys.stderr, flush=True)
        os.kill(pid, signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
