"""GitHub Classroom: the runner results that ``classroom-resources/autograding-grading-reporter``
reads, and the workflow template of the student repository.

The reporter takes a comma-separated ``runners:`` input; for each runner id it reads the
environment variable ``<ID>_RESULTS`` (the id in upper case), base64 of this JSON::

    {"version": 1, "status": "pass" | "fail" | "error", "max_score": <course maximum>,
     "tests": [{"name", "status": "pass" | "fail" | "error", "score", "max_score",
                "message", "test_code", "filename"}, ...]}

and writes the total, ``Points X/Y``, into the job's check run (v1 looks up the check run
named ``run-autograding-tests`` and calls ``checks.update``: the workflow grants
``checks: write``), which is where Classroom reads the points. Its log
shows ``(tests passed / tests) x max_score``: every test here is worth one point (a part of
a multi-point exercise, see :func:`one_point_tests`), so that log and Classroom's points
agree; optional practice is no test (a 0-point test would lower that share). ``python -m
lesson10 grade ... --classroom PATH`` writes it for one
student; the workflow (``classroom/.github/workflows/classroom.yml``) base64-encodes it into
its step output ``result``. ``python -m lesson10.course.grade.classroom --error MESSAGE`` writes a
runner result that says the grading itself failed (the workflow's fallback).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ...checks.verdict import Status
from . import gradebook

#: the runner id the template workflow gives the grading step (its env is LESSON10_RESULTS)
RUNNER_ID = "lesson10"
#: characters of a test's message kept (base64 of the whole JSON travels in one environment
#: variable, which Linux caps at 128 KiB)
MESSAGE_LIMIT = 1500
#: where the template lives in the course repository (``release`` copies it)
TEMPLATE = Path("classroom") / ".github" / "workflows" / "classroom.yml"


def _status(e: dict) -> str:
    """The reporter's word (``pass``, ``fail``, ``error``) for an entry: ``error`` only where
    the grader failed (:attr:`Status.grader_error`)."""
    if e["passed"]:
        return "pass"
    return "error" if Status.of(e["status"]).grader_error else "fail"


def _optional(exercise: str) -> bool:
    from ...checks import EXERCISES
    ex = EXERCISES.get(exercise)
    return ex is not None and ex.optional


def one_point_tests(e: dict) -> list[tuple[str, dict]]:
    """``(test name, verdict)`` of one exercise's tests, one point each: a test per part of
    an exercise with parts (``e["parts"]``, or the course's parts of an exercise not handed
    in), a test per point otherwise. The reporter logs ``(tests passed / tests) x max``, so
    with one point per test its log and Classroom's points agree."""
    from ...checks import EXERCISES
    base = f"{e['notebook']}: {e['exercise']}"
    parts = e.get("parts")
    if not parts:
        ex = EXERCISES.get(e["exercise"])
        names = [name for name, _ in ex.parts] if ex is not None and ex.parts else []
        if not names and e["max_points"] > 1:
            names = [f"point {i + 1}" for i in range(e["max_points"])]
        if not names:
            return [(base, e)]
        parts = [{"part": n, "status": e["status"] if i >= e["points"] else "passed",
                  "passed": i < e["points"], "points": int(i < e["points"]), "max_points": 1,
                  "message": e["message"]} for i, n in enumerate(names)]
    return [test for p in parts for test in _points_of(f"{base} ({p['part']})", p)]


def _points_of(name: str, part: dict) -> list[tuple[str, dict]]:
    """A part worth more than a point (the course file doubled its exercise) as one test per
    point, those it won first."""
    top = part["max_points"]
    if top <= 1:
        return [(name, part)]
    return [(f"{name[:-1]}, point {i + 1})", {**part, "status": part["status"] if i >= part["points"]
                                              else "passed", "passed": i < part["points"],
                                              "points": int(i < part["points"]), "max_points": 1})
            for i in range(top)]


def runner_results(reports: list[dict], students: list[dict] | None = None, *,
                   seed=None, sandboxed=None) -> dict:
    """The runner JSON for ONE student (ValueError for more): a test per course exercise,
    ``max_score`` the course's maximum."""
    rows = gradebook.rows(reports) if students is None else students
    if len(rows) != 1:
        raise ValueError(f"GitHub Classroom's runner results are one student's; this batch has "
                         f"{len(rows)} students")
    row = rows[0]
    tests = []
    for e in row["exercises"]:
        if _optional(e["exercise"]):
            continue          # the reporter scores (tests passed / tests) x max: practice is no test
        for name, part in one_point_tests(e):
            body, hints = gradebook.split_message(part["message"])
            message = part["status"] + (f": {body}" if body else "")
            message += "".join(f"\nhint: {h}" for h in hints)
            if len(message) > MESSAGE_LIMIT:      # the reporter reads it from one env variable
                message = message[:MESSAGE_LIMIT] + " ..."
            tests.append({"name": name, "status": _status(part), "score": part["points"],
                          "max_score": part["max_points"], "message": message,
                          "filename": row["notebooks"].get(e["notebook"], ""),
                          "test_code": f"checks.check_{e['exercise']}(...)", "line_no": 0})
    if not row["ok"] or any(t["status"] == "error" for t in tests):
        status = "error"
    elif all(t["status"] == "pass" for t in tests):
        status = "pass"
    else:
        status = "fail"
    doc = {"version": 1, "status": status, "max_score": row["max_points"], "tests": tests,
           "student": row["student"], "missing": row["missing"]}
    if seed is not None:
        doc["seed"] = seed
    if sandboxed is not None:
        doc["sandboxed"] = sandboxed
    return doc


def error_results(message: str) -> dict:
    """A runner result that says the grading failed: every exercise at 0 with status
    ``error`` and the message (never a silent 0)."""
    from ...checks import EXERCISES
    tests = [{"name": name, "status": "error", "score": 0, "max_score": 1,
              "message": f"the grader failed: {message}"}
             for ex in EXERCISES.values() if not ex.optional
             for name, _ in one_point_tests({"notebook": ex.notebook, "exercise": ex.id,
                                             "status": Status.GRADER_ERROR.value, "passed": False,
                                             "points": 0, "max_points": ex.points,
                                             "message": ""})]
    return {"version": 1, "status": "error", "max_score": gradebook.course_max(), "tests": tests}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lesson10.course.grade.classroom",
                                description="Write a GitHub Classroom runner result that says "
                                            "the grading failed (the workflow's fallback).")
    p.add_argument("--error", required=True, help="what failed")
    p.add_argument("--output", type=Path, help="file to write (default: stdout)")
    args = p.parse_args(argv)
    text = json.dumps(error_results(args.error), indent=1) + "\n"
    if args.output:
        args.output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
