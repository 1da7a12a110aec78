"""GitHub Classroom: the runner results that ``classroom-resources/autograding-grading-reporter``
reads, and the workflow template of the student repository.

The reporter takes a comma-separated ``runners:`` input; for each runner id it reads the
environment variable ``<ID>_RESULTS`` (the id in upper case), base64 of this JSON::

    {"version": 1, "status": "pass" | "fail" | "error", "max_score": <course maximum>,
     "tests": [{"name", "status": "pass" | "fail" | "error", "score", "max_score",
                "message", "test_code", "filename"}, ...]}

and adds the tests' scores into the points of the check run named "Autograding Tests",
which is where Classroom reads them (so the workflow's job carries that name and
``checks: write``). ``python -m lesson10 grade ... --classroom PATH`` writes it for one
student; the workflow (``classroom/.github/workflows/classroom.yml``) base64-encodes it into
its step output ``result``. ``python -m lesson10.course.grade.classroom --error MESSAGE`` writes a
runner result that says the grading itself failed (the workflow's fallback).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import gradebook

#: the runner id the template workflow gives the grading step (its env is LESSON10_RESULTS)
RUNNER_ID = "lesson10"
#: characters of a test's message kept (base64 of the whole JSON travels in one environment
#: variable, which Linux caps at 128 KiB)
MESSAGE_LIMIT = 1500
#: where the template lives in the course repository (``release`` copies it)
TEMPLATE = Path("classroom") / ".github" / "workflows" / "classroom.yml"


def _status(e: dict) -> str:
    if e["passed"]:
        return "pass"
    return "error" if e["status"] == "grader error" else "fail"


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
        body, hints = gradebook.split_message(e["message"])
        message = e["status"] + (f": {body}" if body else "")
        message += "".join(f"\nhint: {h}" for h in hints)
        if len(message) > MESSAGE_LIMIT:          # the reporter reads it from one env variable
            message = message[:MESSAGE_LIMIT] + " ..."
        tests.append({"name": f"{e['notebook']}: {e['exercise']}", "status": _status(e),
                      "score": e["points"], "max_score": e["max_points"],
                      "message": message, "filename": row["notebooks"].get(e["notebook"], ""),
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
    tests = [{"name": f"{ex.notebook}: {ex.id}", "status": "error", "score": 0,
              "max_score": ex.points, "message": f"the grader failed: {message}"}
             for ex in EXERCISES.values()]
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
