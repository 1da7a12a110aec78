"""Outputs of a graded batch: the table, JSON, the class CSV, Gradescope's results.json,
JUnit XML and a Markdown summary (a CI job's summary).

Each takes the per-notebook reports (:mod:`.notebook`) and, where it speaks of students,
their gradebook rows (:func:`lesson10.course.grade.gradebook.rows`; computed from the reports when
not given). GitHub Classroom's runner JSON is in :mod:`.classroom`, the feedback files in
:mod:`.feedback`.
"""
from __future__ import annotations

import csv
import io
import json
import re
import socket
import time
from xml.sax.saxutils import escape, quoteattr

from ...checks import EXERCISES
from ...checks.exercises import shown_status
from ...checks.verdict import Status
from . import gradebook


def summary(reports: list[dict], students: list[dict] | None = None) -> dict:
    """The ``--json`` document: ``points`` and ``max_points`` of the notebooks graded,
    ``notebooks`` (their reports) and ``students`` (the gradebook rows: every course
    exercise, missing notebooks at 0, the course maximum)."""
    return {"points": sum(r["points"] for r in reports),
            "max_points": sum(r["max_points"] for r in reports),
            "notebooks": reports,
            "students": gradebook.rows(reports) if students is None else students}


def seed_line(seed, sandboxed) -> str:
    parts = []
    if seed is not None:
        parts.append(f"seed {seed} (`--seed {seed}` repeats this grading exactly)")
    if sandboxed is False:
        parts.append("NOT sandboxed (--no-sandbox)")
    return "; ".join(parts)


def _student_notes(r: dict) -> list[str]:
    """The notes column of one student's row in the table."""
    notes = list(r.get("notes", []))                  # a collision (.identity)
    if r["missing"]:
        notes.append("missing: " + ", ".join(r["missing"]))
    if r["ignored"]:
        notes.append(f"{len(r['ignored'])} copies not graded")
    if r["unknown"]:
        notes.append(f"{len(r['unknown'])} unknown notebooks")
    if r.get("not_graded"):
        notes.append(f"{len(r['not_graded'])} files not graded")
    n_over = sum(1 for e in r["exercises"] if "override" in e)
    if n_over:
        notes.append(f"{n_over} overridden")
    if r.get("late"):
        notes.append(f"{len(r['late'])} late (-{sum(x['points_lost'] for x in r['late'])})")
    if r.get("on_roster") is False:
        notes.append("not on the roster")
    if not r["ok"]:
        notes.append("GRADER ERROR")
    return notes


def shown(e: dict) -> str:
    """An entry's status as every output shows it (optional practice is never "failed")."""
    return shown_status(e["exercise"], e["status"])


def _optional(e: dict) -> bool:
    ex = EXERCISES.get(e["exercise"])
    return ex is not None and ex.optional


def table(reports: list[dict], students: list[dict] | None = None, seed=None) -> str:
    w = max([28] + [len(str(rep["notebook"])) for rep in reports])
    head = f"{'notebook':<{w}s} {'exercise':<20s} {'result':<24s} {'points':>7s}"
    lines = [head, "-" * len(head)]
    for rep in reports:
        name = str(rep["notebook"])
        if rep.get("error"):
            lines.append(f"{name:<{w}s} ! grader error: {rep['error']}")
        if not rep["exercises"] and not rep.get("error"):
            lines.append(f"{name:<{w}s} {'(no exercises)':<20s}")
        for e in rep["exercises"]:
            lines.append(f"{name:<{w}s} {e['exercise']:<20s} {shown(e):<24s} "
                         f"{e['points']:>3d}/{e['max_points']:<3d}")
        for line in rep.get("feedback", [])[:5]:
            lines.append(f"{'':<{w}s} ! {line[:200]}")
    got = sum(r["points"] for r in reports)
    total = sum(r["max_points"] for r in reports)
    lines.append("-" * len(head))
    lines.append(f"{'total':<{w}s} {'':<20s} {'':<24s} {got:>3d}/{total:<3d}")
    rows = gradebook.rows(reports) if students is None else students
    if rows:
        sw = max([7] + [len(r["student"]) for r in rows])
        lines += ["", f"{'student':<{sw}s} {'points':>9s}  notes", "-" * (sw + 30)]
        for r in rows:
            notes = _student_notes(r)
            lines.append(f"{r['student']:<{sw}s} {r['points']:>4d}/{r['max_points']:<4d}  "
                         f"{'; '.join(notes)}")
    if seed is not None:
        lines.append(f"\nseed: {seed} (replay with --seed {seed})")
    return "\n".join(lines)


def lateness_lines(row: dict) -> list[str]:
    """What a row's collision notes (:mod:`.identity`), overrides and late notebooks say,
    one sentence each (every output)."""
    out = [f"Identity: {n}." for n in row.get("notes", [])]
    out += [f"Override of {e['exercise']}: {e['points']}/{e['max_points']} (the judge gave "
           f"{e['override']['judged_points']}): {e['override']['reason']}."
           for e in row["exercises"] if "override" in e]
    if "due" in row:
        out.append(f"Due: {row['due']}.")
    for item in row.get("late", []):
        when = "late by an unknown time" if item["hours_late"] is None else \
            f"{item['hours_late']:g} hours late"
        out.append(f"Late: {item['file']} ({item['notebook']}) was handed in {when} "
                   f"({item['source']}): -{item['percent']:g}% of its points, "
                   f"{item['points_lost']} points.")
    return out


def md_cell(text, limit: int = 700) -> str:
    text = str(text or "")
    if len(text) > limit:
        text = text[:limit] + " ..."
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.replace("|", "\\|").replace("\r", "").replace("\n", "<br>")


def markdown(reports: list[dict], students: list[dict] | None = None, *, seed=None,
             sandboxed=None) -> str:
    """The scores in Markdown (GitHub's job summary): per student the total, then a row per
    course exercise with its result, points and the judge's message (hint included)."""
    rows = gradebook.rows(reports) if students is None else students
    got = sum(r["points"] for r in rows)
    total = sum(r["max_points"] for r in rows)
    lines = [f"## Score: {got} / {total}", ""]
    note = seed_line(seed, sandboxed)
    if note:
        lines += [note, ""]
    paths = {(r["student"], n): p for r in rows for n, p in r["notebooks"].items()}
    for r in rows:
        if len(rows) > 1:
            lines += [f"### {md_cell(r['student'])}: {r['points']} / {r['max_points']}", ""]
        lines += ["| notebook | exercise | result | points | message |", "|---|---|---|---|---|"]
        for e in r["exercises"]:
            where = paths.get((r["student"], e["notebook"]), f"{e['notebook']} (not handed in)")
            lines.append(f"| {md_cell(where)} | {e['exercise']} | {shown(e)} | "
                         f"{e['points']}/{e['max_points']} | {md_cell(e['message'])} |")
        extra = [f"not graded: {i['path']} (another copy of {i['notebook']}; graded: "
                 f"{i['graded']})" for i in r["ignored"]]
        extra += [f"not a course notebook: {p}" for p in r["unknown"]]
        extra += [f"not graded: {f['path']} ({f['reason']})" for f in r.get("not_graded", [])]
        extra += lateness_lines(r)
        if extra:
            lines += [""] + [f"- {md_cell(x)}" for x in extra]
        lines.append("")
    for rep in reports:
        if rep.get("error"):
            lines.append(f"- **grader error** in {md_cell(rep['notebook'])}: "
                         f"{md_cell(rep['error'])}")
    return "\n".join(lines).rstrip("\n") + "\n"


#: how a cell a spreadsheet would run as a formula begins (OWASP's CSV injection list)
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
#: where a spreadsheet reading the file with another separator (``;`` in many locales, a tab)
#: or ignoring a quote mid-line starts a new cell inside one of ours: a break, then a formula
_INNER_START = re.compile(r"([;\t\r\n][ \"]*)(?=[=+\-@\t\r])")


def csv_cell(value):
    """``value`` as a CSV cell no spreadsheet runs: a number as it is; text that begins
    (after spaces and line breaks) with a :data:`FORMULA_START` character, and is not a
    plain number like ``-1.5``, gets a single quote in front (OWASP's advice), so
    ``=HYPERLINK(...)`` is shown as the text ``'=HYPERLINK(...)``; so does each place inside
    it where a ``;``, a tab or a line break is followed by one (``x;=cmd`` is ``x;'=cmd``)."""
    if isinstance(value, (int, float)):
        return value
    text = "" if value is None else str(value)
    if _NUMBER.fullmatch(text):
        return text
    text = _INNER_START.sub(r"\1'", text)
    return "'" + text if text.lstrip(" \n").startswith(FORMULA_START) else text


def csv_text(rows) -> str:
    """The CSV of ``rows`` (lists of cells), every cell through :func:`csv_cell`: the one
    writer of every CSV the grader writes (``tests/test_csv_safe.py`` finds any other).
    Lines end in ``\n``; a row with a carriage return in a cell has its text quoted (the
    csv module quotes only the line terminator's characters), so the row stays one row."""
    out = io.StringIO()
    plain = csv.writer(out, lineterminator="\n")
    quoted = csv.writer(out, lineterminator="\n", quoting=csv.QUOTE_NONNUMERIC)
    for row in rows:
        cells = [csv_cell(c) for c in row]
        (quoted if any("\r" in c for c in cells if isinstance(c, str)) else plain).writerow(cells)
    return out.getvalue()


def class_csv(reports: list[dict], students: list[dict] | None = None, seed=None) -> str:
    """One row per student: ``student``, a column of points per course exercise (in the
    course's order, every exercise whatever the batch holds), then ``<exercise> status`` per
    exercise (passed, failed, not attempted, check removed, missing, ...:
    :class:`lesson10.checks.verdict.Status`), ``missing`` (the notebooks not handed in),
    ``late`` (each late notebook: how late, from which mark, the penalty; :mod:`.late`),
    ``adjustments`` (overrides with their reasons, then lateness: :func:`.adjust.describe`),
    ``seed``, and last ``total`` and ``max`` (the course maximum, the same in every row)."""
    from . import adjust, late
    rows = gradebook.rows(reports) if students is None else students
    cols = list(EXERCISES)
    table = [["student"] + cols + [f"{c} status" for c in cols]
             + ["missing", "late", "adjustments", "seed", "total", "max"]]
    for r in rows:
        got = {e["exercise"]: e for e in r["exercises"]}
        table.append([r["student"]] + [got[c]["points"] for c in cols]
                     + [shown(got[c]) for c in cols]
                     + [" ".join(r["missing"]), late.describe_row(r), adjust.describe(r),
                        r.get("seed", "" if seed is None else seed),
                        r["points"], r["max_points"]])
    return csv_text(table)


def gradescope(reports: list[dict], students: list[dict] | None = None, *, seed=None,
               sandboxed=None, notes=()) -> str:
    """Gradescope's ``results.json`` for ONE student: a test per course exercise (missing
    notebooks at 0), the course maximum, a top-level ``output`` that says what was graded,
    what is missing and any grader error. Raises ValueError for more than one student."""
    rows = gradebook.rows(reports) if students is None else students
    if len(rows) != 1:
        raise ValueError(f"Gradescope's results.json is one student's; this batch has "
                         f"{len(rows)} students ({', '.join(r['student'] for r in rows[:5])}"
                         f"{', ...' if len(rows) > 5 else ''})")
    row = rows[0]
    numbers = {nid: i for i, nid in enumerate(gradebook.graded_notebooks(), start=1)}
    per_notebook: dict[str, int] = {}
    tests = []
    for e in row["exercises"]:
        per_notebook[e["notebook"]] = per_notebook.get(e["notebook"], 0) + 1
        body, hints = gradebook.split_message(e["message"])
        text = shown(e) + (f"\n\n{body}" if body else "")
        text += "".join(f"\n\nHint: {h}" for h in hints)
        test = {"name": f"{e['notebook']}: {e['exercise']}",
                "number": f"{numbers.get(e['notebook'], 0)}.{per_notebook[e['notebook']]}",
                "score": e["points"], "max_score": e["max_points"],
                "status": "passed" if e["passed"] else "failed",
                "output": text, "visibility": "visible"}
        if _optional(e):          # no score and no status: Gradescope shows it, neither red nor scored
            test = {k: v for k, v in test.items() if k not in ("score", "max_score", "status")}
            test["name"] += " (optional practice)"
        tests.append(test)
    doc = {"score": row["points"], "max_score": row["max_points"],
           "output": overview(reports, row, seed=seed, sandboxed=sandboxed, notes=notes),
           "visibility": "visible", "stdout_visibility": "hidden", "tests": tests,
           "extra_data": {"seed": seed, "sandboxed": sandboxed, "student": row["student"],
                          "notebooks": row["notebooks"], "missing": row["missing"],
                          "not_graded": row.get("not_graded", []),
                          "unknown": row["unknown"], "late": row.get("late", []),
                          "due": row.get("due"),
                          "overrides": {e["exercise"]: e["override"] for e in row["exercises"]
                                        if "override" in e}}}
    return json.dumps(doc, indent=1) + "\n"


def overview(reports: list[dict], row: dict, *, seed=None, sandboxed=None, notes=()) -> str:
    """What a student is told about the whole submission (Gradescope's top-level output,
    Classroom's summary): the score, what was graded, what is missing, any grader error."""
    lines = [f"Score: {row['points']} / {row['max_points']}"]
    lines += list(notes)
    if not reports:
        lines.append("Nothing graded: no notebook found in the submission. Hand in the "
                     "course's .ipynb files (any folder; their names start with the notebook's "
                     "number, e.g. 01_sequence_parallel.ipynb).")
    for nid, path in row["notebooks"].items():
        lines.append(f"Graded {path} as {nid}.")
    for i in row["ignored"]:
        lines.append(f"Not graded: {i['path']} (another copy of {i['notebook']}; the one "
                     f"graded is {i['graded']}, chosen as {gradebook.COPY_RULE}).")
    for p in row["unknown"]:
        lines.append(f"Not a course notebook (scores nothing): {p}.")
    for f in row.get("not_graded", []):
        lines.append(f"Not graded: {f['path']} ({f['reason']}).")
    if row["missing"]:
        lines.append("Missing (0 points each): " + ", ".join(row["missing"]) + ".")
    lines += lateness_lines(row)
    for rep in reports:
        if rep.get("error"):
            lines.append(f"GRADER ERROR in {rep['notebook']}: {rep['error']}. This is not your "
                         f"score: the course staff will grade it again.")
        for f in rep.get("feedback", [])[:10]:
            lines.append(f"{rep['notebook']}: {f}")
    seedline = seed_line(seed, sandboxed)
    if seedline:
        lines.append(seedline.replace("`", "") + ".")
    return "\n".join(lines)


def _xml(text) -> str:
    """Text that XML accepts: control characters (but tab and newline) replaced."""
    return re.sub(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]", "?", str(text))


#: JUnit's ``timestamp`` where nothing of the class says when it was graded
EPOCH = "1970-01-01T00:00:00"


def graded_at() -> str:
    """Now, as a report's ``graded_at`` (UTC, the form JUnit's ``timestamp`` takes)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())


def _junit_counts(entries: list[dict]) -> tuple[int, int, int]:
    """``(failures, errors, skipped)`` of a suite: a lost exercise, a grader error, optional
    practice not passed."""
    errors = [Status.of(e["status"]).grader_error for e in entries]
    lost = [not e["passed"] and not err for e, err in zip(entries, errors)]
    skipped = sum(1 for e, x in zip(entries, lost) if x and _optional(e))
    return sum(lost) - skipped, sum(errors), skipped


def _junit_case(e: dict, classname: str, t: float) -> list[str]:
    """One ``<testcase>``: a lost exercise a ``<failure>``, a grader error an ``<error>``."""
    lines = [f"    <testcase classname={quoteattr(_xml(classname))} "
             f"name={quoteattr(_xml(e['exercise']))} time=\"{t:.3f}\">"]
    msg = escape(_xml(e.get("message", "")))
    if _optional(e) and not e["passed"] and not Status.of(e["status"]).grader_error:
        lines.append(f"      <skipped message={quoteattr(_xml(shown(e)))}>{msg}</skipped>")
    elif Status.of(e["status"]).grader_error:
        lines.append(f"      <error message={quoteattr(_xml(e['status']))} "
                     f"type=\"GraderError\">{msg}</error>")
    elif not e["passed"]:
        kind = re.sub(r"\W", "", e["status"].title()) or "Failed"
        lines.append(f"      <failure message={quoteattr(_xml(e['status']))} "
                     f"type={quoteattr(kind)}>{msg}</failure>")
    elif "override" in e:                        # full marks by override: say so all the same
        lines.append(f"      <system-out>{msg}</system-out>")
    return lines + ["    </testcase>"]


def _junit_suites(reports: list[dict], students: list[dict] | None) -> list[tuple]:
    """``(name, student, notebook id, path, [(entry, None)], seconds, report or None)`` of
    each suite: a graded notebook's (with the rows' entries: overrides and late penalties
    included), then each missing notebook's."""
    suites: list[tuple] = []
    adjusted = {(row["student"], row["notebooks"].get(e["notebook"]), e["exercise"]): e
                for row in students or [] for e in row["exercises"]}
    for rep in reports:
        cases = [(adjusted.get((rep["student"], rep["notebook"], e["exercise"]), e), None)
                 for e in rep["exercises"]]
        if not cases and not rep["ok"]:
            cases = [({"exercise": "(notebook)", "status": Status.GRADER_ERROR.value, "passed": False,
                       "message": rep.get("error") or "the grader failed"}, None)]
        suites.append((f"{rep['student']}: {rep.get('course_notebook') or rep['notebook']}",
                       rep["student"], rep.get("course_notebook"), rep["notebook"], cases,
                       float(rep.get("seconds", 0.0)), rep))
    for row in students or []:
        for nid in row["missing"]:
            cases = [(e, None) for e in row["exercises"] if e["notebook"] == nid]
            suites.append((f"{row['student']}: {nid}", row["student"], nid, "", cases, 0.0, None))
    return suites


def junit(reports: list[dict], students: list[dict] | None = None, *, seed=None,
          timestamp: str | None = None) -> str:
    """JUnit XML: a testsuite per graded notebook (and, with ``students``, one per missing
    notebook), a testcase per exercise with a ``time`` (the exercise's own seconds where the
    report has them, else an equal share of its notebook's); a lost exercise is a
    ``<failure>``, a grader error an ``<error>``, and ``failures``/``errors`` count exactly
    those. The attributes and elements are those the common JUnit schemas ask for. A
    suite's ``timestamp`` is when its notebook was graded (the report's ``graded_at``, kept
    in the results folder, so an unchanged class writes the same file; else ``timestamp``,
    else the class's latest), its ``seed`` property the notebook's own seed (else ``seed``)."""
    suites = _junit_suites(reports, students)
    timestamp = timestamp or max((r["graded_at"] for r in reports if r.get("graded_at")),
                                 default=EPOCH)
    host = quoteattr(_xml(socket.gethostname() or "localhost"))
    parts = []
    n_tests = n_fail = n_err = 0
    total_time = 0.0
    for number, (name, student, nid, path, cases, seconds, rep) in enumerate(suites):
        fails, errs, skipped = _junit_counts([e for e, _ in cases])
        n_tests, n_fail, n_err = n_tests + len(cases), n_fail + fails, n_err + errs
        total_time += seconds
        when = str((rep or {}).get("graded_at") or timestamp)
        attrs = (f"name={quoteattr(_xml(name))} tests=\"{len(cases)}\" failures=\"{fails}\" "
                 f"errors=\"{errs}\" skipped=\"{skipped}\" time=\"{seconds:.3f}\" "
                 f"timestamp={quoteattr(_xml(when))} hostname={host} id=\"{number}\" "
                 f"package=\"lesson10\"")
        parts.append(f"  <testsuite {attrs}>")
        props = [("student", student), ("notebook", path), ("course_notebook", nid or "")]
        mine = (rep or {}).get("seed", seed)
        if mine is not None:
            props.append(("seed", mine))
        if rep is not None:
            props.append(("sandboxed", str(bool(rep.get("sandboxed", True))).lower()))
        parts.append("    <properties>")
        parts += [f"      <property name={quoteattr(k)} value={quoteattr(_xml(v))}/>"
                  for k, v in props]
        parts.append("    </properties>")
        share = seconds / len(cases) if cases else 0.0
        for e, _ in cases:
            parts += _junit_case(e, f"{student}.{nid or path}", float(e.get("seconds", share)))
        out = "\n".join(rep.get("feedback", [])) if rep is not None else ""
        err = (rep.get("error") or "") if rep is not None else ""
        parts.append(f"    <system-out>{escape(_xml(out))}</system-out>")
        parts.append(f"    <system-err>{escape(_xml(err))}</system-err>")
        parts.append("  </testsuite>")
    head = (f'<testsuites name="lesson10" tests="{n_tests}" failures="{n_fail}" '
            f'errors="{n_err}" time="{total_time:.3f}">')
    return "\n".join(['<?xml version="1.0" encoding="utf-8"?>', head, *parts,
                      "</testsuites>"]) + "\n"
