"""Time limits for the grader's batch tests that follow the machine (issue 36).

A limit that must let honest work through (a cell's, an exercise's, a notebook's) is only
right for one machine's speed; these suites measure the machine first: :func:`unit` grades
one honest notebook 03 (the whole command: Python, the sandbox, the kernel, its checks) and
:func:`scaled` multiplies a limit chosen on an idle two-core machine (where that took about
``IDLE_UNIT`` s) by how much slower this one is now, times ``MARGIN`` (the load may change
while a batch runs). A limit that must *cut* something is cut by a cell that never ends
(``while True: pass``, ``time.sleep(3600)``), so any value of it works.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import build as B

IDLE_UNIT = 6.0          # s: `grade` of one reduced notebook 03 on the idle reference machine
MARGIN = 2.0             # the load may double between the calibration and the batch


@functools.cache
def unit() -> float:
    """Seconds one ``python -m lesson10 grade`` of the honest reduced notebook 03 takes here
    and now (measured once per process; graded with ``--no-sandbox`` where there is none)."""
    from lesson10.course.grade import sandbox
    with tempfile.TemporaryDirectory(prefix="lesson10-clock-") as tmp:
        path = B.write(Path(tmp) / "calibration", "03_load_balance.ipynb", B.reduced("03_load_balance"))
        cmd = [sys.executable, "-m", "lesson10", "grade", str(path), "--json",
               *([] if sandbox.probe() is None else ["--no-sandbox"])]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(B.ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
            MPLBACKEND="Agg")
        t0 = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env=env, timeout=1800)
        took = time.monotonic() - t0
    rep = json.loads(proc.stdout)["notebooks"][0] if proc.stdout.startswith("{") else None
    if rep is None or rep["points"] != rep["max_points"]:
        raise RuntimeError(f"the calibration notebook did not grade in full (exit "
                           f"{proc.returncode}): {proc.stderr[-2000:]}")
    return took


def slowdown() -> float:
    """How many times slower than the reference this machine grades now (at least 1), times
    ``MARGIN``."""
    return MARGIN * max(1.0, unit() / IDLE_UNIT)


def scaled(seconds: float) -> int:
    """``seconds`` (right on the idle reference machine) for this machine, now."""
    return int(round(seconds * slowdown()))


def limits(cell: float, exercise: float, notebook: float) -> list[str]:
    """The grader's ``--timeout``, ``--exercise-timeout`` and ``--notebook-timeout``, scaled."""
    return ["--timeout", str(scaled(cell)), "--exercise-timeout", str(scaled(exercise)),
            "--notebook-timeout", str(scaled(notebook))]
