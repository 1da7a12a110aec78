"""Outputs of a graded batch: the table, JSON, a class CSV, Gradescope's results.json,
JUnit XML and a Markdown table (for a CI job summary)."""
from __future__ import annotations

import csv
import io
import json
import re
from xml.sax.saxutils import quoteattr, escape


def summary(reports: list[dict]) -> dict:
    """The ``--json`` document: ``points``, ``max_points``, ``notebooks``."""
    return {"points": sum(r["points"] for r in reports),
            "max_points": sum(r["max_points"] for r in reports),
            "notebooks": reports}


def table(reports: list[dict]) -> str:
    w = max([28] + [len(str(rep["notebook"])) for rep in reports])
    head = f"{'notebook':<{w}s} {'exercise':<20s} {'result':<16s} {'points':>7s}"
    lines = [head, "-" * len(head)]
    for rep in reports:
        name = str(rep["notebook"])
        if rep.get("error"):
            lines.append(f"{name:<{w}s} ! grader error: {rep['error']}")
        if not rep["exercises"] and not rep.get("error"):
            lines.append(f"{name:<{w}s} {'(no exercises)':<20s}")
        for e in rep["exercises"]:
            lines.append(f"{name:<{w}s} {e['exercise']:<20s} {e['status']:<16s} "
                         f"{e['points']:>3d}/{e['max_points']:<3d}")
        for line in rep.get("feedback", [])[:5]:
            lines.append(f"{'':<{w}s} ! {line[:200]}")
    got = sum(r["points"] for r in reports)
    total = sum(r["max_points"] for r in reports)
    lines.append("-" * len(head))
    lines.append(f"{'total':<{w}s} {'':<20s} {'':<16s} {got:>3d}/{total:<3d}")
    return "\n".join(lines)


def markdown(reports: list[dict]) -> str:
    """The score table in Markdown (GitHub's job summary)."""
    got = sum(r["points"] for r in reports)
    total = sum(r["max_points"] for r in reports)
    lines = [f"## Score: {got} / {total}", "", "| notebook | exercise | result | points |",
             "|---|---|---|---|"]
    for rep in reports:
        for e in rep["exercises"]:
            lines.append(f"| {rep['notebook']} | {e['exercise']} | {e['status']} | "
                         f"{e['points']}/{e['max_points']} |")
        if rep.get("error"):
            lines.append(f"| {rep['notebook']} | | grader error: {rep['error']} | |")
    return "\n".join(lines) + "\n"


def _columns(reports: list[dict]) -> list[tuple[str, int]]:
    """``(exercise, points)`` in the course's order, for every exercise in the batch."""
    from ..checks import EXERCISES
    seen = {e["exercise"]: e["max_points"] for r in reports for e in r["exercises"]}
    return [(ex, EXERCISES[ex].points) for ex in EXERCISES if ex in seen]


def class_csv(reports: list[dict]) -> str:
    """One row per student (the notebook's parent folder): ``student``, one column per
    exercise in the batch, ``total``, ``max`` (the same max for every student: an
    exercise a student did not hand in, or handed in a notebook the grader could not
    identify, counts 0)."""
    cols = _columns(reports)
    students: dict[str, dict] = {}
    for rep in reports:
        row = students.setdefault(rep["student"], {})
        for e in rep["exercises"]:
            row[e["exercise"]] = max(row.get(e["exercise"], 0), e["points"])
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["student"] + [c for c, _ in cols] + ["total", "max"])
    full = sum(p for _, p in cols)
    for student in sorted(students):
        row = students[student]
        values = [row.get(c, 0) for c, _ in cols]
        writer.writerow([student] + values + [sum(values), full])
    return out.getvalue()


def gradescope(reports: list[dict]) -> str:
    """Gradescope's ``results.json``: ``score``, ``max_score``, one test per exercise."""
    tests = []
    for rep in reports:
        for e in rep["exercises"]:
            output = e["status"] + (f": {e['message']}" if e["message"] else "")
            tests.append({"name": f"{rep['course_notebook'] or rep['notebook']}: {e['exercise']}",
                          "score": e["points"], "max_score": e["max_points"],
                          "output": output, "visibility": "visible"})
    doc = {"score": sum(r["points"] for r in reports),
           "max_score": sum(r["max_points"] for r in reports), "tests": tests,
           "visibility": "visible"}
    return json.dumps(doc, indent=1) + "\n"


def _xml(text) -> str:
    """Text that XML accepts: control characters (but tab and newline) replaced."""
    return re.sub(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]", "?", str(text))


def junit(reports: list[dict]) -> str:
    """JUnit XML: a testsuite per notebook, a testcase per exercise; the failure message
    is the check's message."""
    parts = ['<?xml version="1.0" encoding="utf-8"?>', "<testsuites>"]
    for rep in reports:
        cases = rep["exercises"]
        failed = sum(not e["passed"] for e in cases)
        parts.append(f"  <testsuite name={quoteattr(_xml(rep['notebook']))} tests=\"{len(cases)}\" "
                     f"failures=\"{failed}\" errors=\"{0 if rep['ok'] else 1}\">")
        for e in cases:
            parts.append(f"    <testcase classname={quoteattr(_xml(rep['student']))} "
                         f"name={quoteattr(_xml(e['exercise']))}>")
            if not e["passed"]:
                parts.append(f"      <failure message={quoteattr(_xml(e['status']))}>"
                             f"{escape(_xml(e['message']))}</failure>")
            parts.append("    </testcase>")
        if rep.get("error"):
            parts.append(f"    <system-err>{escape(_xml(rep['error']))}</system-err>")
        parts.append("  </testsuite>")
    parts.append("</testsuites>")
    return "\n".join(parts) + "\n"
