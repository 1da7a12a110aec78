"""The cell runner's judged fork (:mod:`lesson10.course.grade.runner`), run as the sandbox
runs it: a copy of the file beside its two companions, in a process of its own.

A thread pool that a cell made keeps working in the judged child: the child gets new
workers *and* a new work queue. The case below is the one CI met under load: the parent's
worker had just been woken inside the queue's ``get`` (it holds the queue's lock, but has
not yet got the GIL to mark itself as the holder) when the fork happened. The child's new
worker then waited on that lock for ever, and ``put`` saw nothing to release.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import os, sys, time
import runner
from concurrent.futures import ThreadPoolExecutor

forker = runner.Forker()
pool = ThreadPoolExecutor(max_workers=1)
pool.submit(int).result()
time.sleep(0.3)                       # the worker now waits inside the queue's get
sys.setswitchinterval(1000.0)         # this thread keeps the GIL while it computes
pool.submit(int)                      # wakes the worker, which then waits for the GIL
end = time.perf_counter() + 0.1
while time.perf_counter() < end:      # ... holding the queue's lock, not yet marked
    pass
sys.setswitchinterval(0.005)


def job():
    runner._restart_thread_pools()
    for _ in range(5):
        pool.submit(sum, [1, 2]).result()
    os._exit(0)


print(runner._wait(forker.fork(job), float(sys.argv[1])))
"""


def _runner_folder(tmp: Path) -> Path:
    """The runner as the sandbox ships it: beside ``_lesson10_returns`` and ``_lesson10_wire``."""
    shutil.copy(ROOT / "lesson10" / "course" / "grade" / "runner.py", tmp / "runner.py")
    shutil.copy(ROOT / "lesson10" / "checks" / "returns.py", tmp / "_lesson10_returns.py")
    shutil.copy(ROOT / "lesson10" / "course" / "grade" / "wire.py", tmp / "_lesson10_wire.py")
    return tmp


def test_a_pool_woken_at_the_fork_still_serves_the_judged_child(tmp_path):
    folder = _runner_folder(tmp_path)
    # a hang is what fails here: 30 s is a limit no working child comes near
    proc = subprocess.run([sys.executable, "-c", CHILD, "30"], cwd=folder, capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": str(folder), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "exit 0", (proc.stdout, proc.stderr[-2000:])


def test_the_judged_child_gets_the_parents_switch_interval(tmp_path):
    """fork() holds the GIL with a 1000 s switch interval; the child must not keep it (two
    threads of the judged function would each run to the end before the other starts)."""
    folder = _runner_folder(tmp_path)
    code = ("import os, sys, runner\n"
            "sys.setswitchinterval(0.002)\n"
            "f = runner.Forker()\n"
            "def job():\n"
            "    os._exit(0 if abs(sys.getswitchinterval() - 0.002) < 1e-9 else 3)\n"
            "print(runner._wait(f.fork(job), 30.0))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(folder), "PATH": "/usr/bin:/bin"})
    assert proc.stdout.strip() == "exit 0", (proc.stdout, proc.stderr[-2000:])


HARMLESS = r"""
import json, runner


class Conn:
    sent = []

    def send(self, msg, blobs=()):
        self.sent.append(msg)


r = runner.Runner(Conn(), [])
r.setup({"files": []})
r.run_cells([(0, "%matplotlib inline\nimport numpy as np\nx = 6 * 7"), (1, "%time y = x + 1"),
             (2, "%timeit -n1 -r1 z = 1"), (3, "%config InlineBackend.figure_format = 'retina'"),
             (4, "%load_ext autoreload\n%autoreload 2"), (5, "%matplotlib widget\nw = 1"),
             (6, "print(x, y, w, np.__name__)"), (7, "%pylab inline\nv = 1"), (8, "print(v)")])
print(json.dumps([m for m in Conn.sent if m.get("op") == "done"]))
"""


def test_harmless_magics_run_or_are_skipped_with_a_note_and_others_keep_their_rule(tmp_path):
    """``%matplotlib inline`` at the top of the imports cell: the plain IPython shell of the
    sandbox raised NotImplementedError there, so nothing after it (``checks``) was imported.
    ``%pylab``, not on the harmless list, still fails as it did."""
    import json
    folder = _runner_folder(tmp_path)
    proc = subprocess.run([sys.executable, "-c", HARMLESS], cwd=folder, capture_output=True,
                          text=True, timeout=300,
                          env={"PYTHONPATH": f"{folder}:{ROOT}", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    done = {m["index"]: m for m in json.loads(proc.stdout.strip().splitlines()[-1])}
    assert [i for i in range(7) if done[i]["error"]] == [], {i: done[i]["error"] for i in done}
    said = "".join(o["text"] for o in done[0]["outputs"])
    assert "[grader: %matplotlib inline skipped" in said
    assert "42 43 1 numpy" in "".join(o["text"] for o in done[6]["outputs"])
    assert done[7]["error"]["ename"] == "NotImplementedError" and done[8]["error"]["ename"] == "NameError"
