"""A small class made by hand for the adjustment tests (overrides, late work, LMS exports,
the report): notebook files on disk, their reports written as the judge would, and every
output written by ``outputs.write`` as ``grade`` does, without grading anything."""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from lesson10.checks import EXERCISES
from lesson10.course.grade import adjust, gradebook, outputs

ROOT = Path(__file__).resolve().parent.parent
BLANK = {nid: (ROOT / "notebooks" / f"{nid}.ipynb").read_bytes()
         for nid in ("02_ring_attention", "03_load_balance")}
DUE = "2026-03-01T23:59:00+00:00"
DUE_EPOCH = 1772409540.0                          # DUE as seconds since 1970


def entry(ex: str, status: str = "passed", points: int | None = None, message: str = "ok",
          **extra) -> dict:
    top = EXERCISES[ex].points
    got = top if points is None and status == "passed" else (points or 0)
    return {"exercise": ex, "status": status, "passed": got == top and status == "passed",
            "points": got, "max_points": top, "message": message, **extra}


def report(path: Path, student: str, nid: str, entries: list[dict]) -> dict:
    return {"notebook": str(path), "student": student, "course_notebook": nid, "ok": True,
            "error": None, "feedback": [], "sandboxed": True, "exercises": entries,
            "points": sum(e["points"] for e in entries),
            "max_points": sum(e["max_points"] for e in entries)}


def put(path: Path, nid: str, mtime: float, data: bytes | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(BLANK[nid] if data is None else data)
    os.utime(path, (mtime, mtime))
    return path


def args(tmp: Path, **kw) -> argparse.Namespace:
    """The options of ``grade`` that ``outputs.write`` reads, every output asked for."""
    base = dict(json=False, output=tmp / "report.json", csv=tmp / "grades.csv",
                classroom=None, gradescope=None, junit=tmp / "junit.xml",
                markdown=tmp / "summary.md", feedback=tmp / "feedback", save_executed=None,
                report=tmp / "report", timings=False, overrides=None, due=None,
                late_penalty=None, late_cap=None, latest_on_time=False, extensions=None,
                roster=None, export=[], export_dir=tmp / "lms", assignment="lesson10")
    base.update(kw)
    return argparse.Namespace(**base)


def write_all(a: argparse.Namespace, paths: list[Path], reports: list[dict], **plan_kw):
    """Plan the batch, apply the adjustments of ``a`` and write every output: ``(rows,
    the JSON document)``."""
    contents = {p: p.read_bytes() for p in paths}
    the_plan = gradebook.plan(paths, contents, **plan_kw)
    a.adjust = adjust.from_args(a)
    adjust.note_times(a.adjust, paths, the_plan.handins)
    for folder in ("feedback", "report", "export_dir"):
        if getattr(a, folder, None) is not None:
            Path(getattr(a, folder)).mkdir(parents=True, exist_ok=True)
    rows = outputs.write(a, the_plan, reports, 7, True)
    doc = json.loads(Path(a.output).read_text()) if a.output else {}
    return rows, doc
