"""``python -m lesson10 bench class``: what grading a class costs.

Generates a class of ``--students N`` (default 4) folders, each with the five exercise
notebooks in the shapes a class hands in: solved (the solution notebook), blank (the
exercise notebook), one wrong answer, and a notebook in a nested GitHub download
(``<student>/lesson10-main/notebooks/``), chosen per student and notebook from a fixed
seed. Grades it once, as an instructor would (``python -m lesson10 grade CLASS -j J --csv
... --timings``, a subprocess, a fresh results folder), and reports:

* notebooks graded per minute (wall clock), and CPU seconds per notebook (user + sys of the
  grader and its children, plus what each sandbox's runner reports of itself: the PID
  namespace hides it from the grader's rusage, see :mod:`.grade`);
* the estimate for a class of ``--estimate 200`` students at five notebooks each, at the
  measured rate.

Writes ``class.md`` (the table and the estimate) beside the other results. A benchmark,
not a test: on a shared machine the rate follows the load (say so with the number).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from lesson10.bench.paths import RESULTS_DIR

from .grade import measure

_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ("01_sequence_parallel", "02_ring_attention", "03_load_balance", "04_ulysses",
             "05_moe_dispatch")


def _wrong() -> dict:
    """One wrong answer per notebook: (text in the solution, what replaces it). A function,
    not a module constant: the grader's stand-in keeps a module's literals, and these quote
    a solution."""
    return {"03_load_balance": ("return np.asarray(work).max(axis=1).sum()",
                                "return np.asarray(work).sum(axis=0).max()"),
            "02_ring_attention": ("positions[r], k_pos, causal)", "positions[r], k_pos, False)")}


def make_class(folder: Path, students: int, seed: int = 0) -> int:
    """Write ``students`` folders of five notebooks each under ``folder``; returns the
    number of notebooks written. Each ends with a line of its student's own, so no two are
    the same bytes, as real hand-ins are: the grader grades identical files once, and a
    class of copies would time nothing."""
    rng = np.random.default_rng(seed)
    wrong = _wrong()
    n = 0
    for s in range(students):
        who = folder / f"student{s:03d}"
        for nid in NOTEBOOKS:
            kind = rng.choice(["solved", "solved", "blank", "wrong", "nested"])
            source = _ROOT / ("notebooks" if kind == "blank" else "solutions") / f"{nid}.ipynb"
            text = source.read_text(encoding="utf-8")
            if kind == "wrong" and nid in wrong:
                old, new = (json.dumps(w)[1:-1] for w in wrong[nid])
                text = text.replace(old, new)
            nb = json.loads(text)
            nb["cells"].append({"cell_type": "markdown", "metadata": {},
                                "source": f"Handed in by {who.name}."})
            target = who / ("lesson10-main/notebooks" if kind == "nested" else "") / f"{nid}.ipynb"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(nb, indent=1), encoding="utf-8")
            n += 1
    return n


def run(students: int, jobs: int, timeout: float, extra=()) -> dict:
    """Grade a generated class once; the measurements."""
    with tempfile.TemporaryDirectory(prefix="bench-class-") as tmp:
        cls = Path(tmp) / "class"
        n = make_class(cls, students)
        out = Path(tmp) / "out"
        cmd = [sys.executable, "-m", "lesson10", "grade", str(cls), "-j", str(jobs), "--timings",
               "--csv", str(out / "grades.csv"), "--output", str(out / "report.json"),
               "--resume", str(out / "results"), *extra]
        env = dict(os.environ, MPLBACKEND="Agg")
        got = measure(cmd, env, Path(tmp), timeout)
        if got["rc"] not in (0, 1):
            raise RuntimeError(f"the grader failed (exit status {got['rc']}):\n"
                               f"{got['stderr'][-2000:]}")
        doc = json.loads((out / "report.json").read_text(encoding="utf-8"))
        sandbox = sum(float(nb.get("sandbox_cpu_seconds") or 0) for nb in doc["notebooks"])
        graded = len(doc["notebooks"])
    cpu = got["cpu"] + sandbox
    return {"students": students, "notebooks": n, "graded": graded, "jobs": jobs,
            "wall_s": got["wall"], "cpu_s": cpu, "per_minute": 60.0 * graded / got["wall"],
            "cpu_per_notebook": cpu / graded, "cores": os.cpu_count(),
            "load": os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")}


def estimate(m: dict, students: int, per_student: int = len(NOTEBOOKS)) -> float:
    """Minutes to grade ``students`` x ``per_student`` notebooks at the measured rate."""
    return students * per_student / m["per_minute"]


def table(m: dict, target: int) -> str:
    minutes = estimate(m, target)
    return "\n".join([
        "# Grading a class", "",
        f"Generated class: {m['students']} students, {m['notebooks']} notebooks (solved, blank, "
        f"wrong and nested downloads), graded with `-j {m['jobs']}` on {m['cores']} cores "
        f"(load average {m['load']:.1f} at the end: a shared machine's rate follows its load).",
        "", "| notebooks | wall s | notebooks / min | CPU s | CPU s / notebook |",
        "|---|---|---|---|---|",
        f"| {m['graded']} | {m['wall_s']:.1f} | {m['per_minute']:.1f} | {m['cpu_s']:.1f} | "
        f"{m['cpu_per_notebook']:.2f} |", "",
        f"Estimate for {target} students x {len(NOTEBOOKS)} notebooks at this rate: "
        f"**{minutes:.0f} min** ({target * len(NOTEBOOKS)} notebooks; CPU "
        f"{target * len(NOTEBOOKS) * m['cpu_per_notebook'] / 60:.0f} CPU-min, so more cores "
        f"and -j divide the wall time).", ""])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lesson10 bench class",
                                description="Grade a generated class of N students; notebooks "
                                            "per minute, CPU per notebook, and the estimate "
                                            "for a class of 200.")
    p.add_argument("--students", type=int, default=4, help="students generated (default 4)")
    p.add_argument("-j", "--jobs", type=int, default=2, help="the grader's -j (default 2)")
    p.add_argument("--estimate", type=int, default=200, help="class size to estimate for")
    p.add_argument("--timeout", type=float, default=3600, help="seconds allowed")
    p.add_argument("--no-sandbox", action="store_true", help="grade with --no-sandbox")
    p.add_argument("--out", default=str(RESULTS_DIR), help="folder for class.md")
    args = p.parse_args(argv)
    if args.students < 1 or args.jobs < 1 or args.estimate < 1 or args.timeout <= 0:
        p.error("--students, -j, --estimate and --timeout must be positive")
    if not args.no_sandbox and shutil.which("bwrap") is None:
        p.error("no bubblewrap (bwrap): install it, or measure with --no-sandbox")
    start = time.time()
    try:
        m = run(args.students, args.jobs, args.timeout,
                ["--no-sandbox"] if args.no_sandbox else [])
    except RuntimeError as exc:
        print(f"bench class: {exc}", file=sys.stderr)
        return 2
    text = table(m, args.estimate)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "class.md").write_text(text, encoding="utf-8")
    print(text)
    print(f"wrote {out / 'class.md'} ({time.time() - start:.0f} s)")
    return 0
