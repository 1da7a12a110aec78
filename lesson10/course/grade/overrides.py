"""The instructor's overrides: ``overrides.csv`` sets one student's points for one exercise
(a regrade request, a judgement call), on top of what the judge found.

The file has a header and four columns, in any order::

    student,exercise,points,reason
    sec1/alice,merge,1,regrade: the check's case 3 was ambiguous (ticket 12)

``student`` is the grader's name of the student (the first column of the class CSV),
``exercise`` a course exercise (``merge``, ``ring_attention``, ...), ``points`` a whole
number from 0 to the exercise's points, ``reason`` is required: every output shows it.
:func:`read` refuses a file that breaks any of this, naming the line and what to do.

:func:`apply` changes the gradebook rows only: the entry's ``points`` become the override's,
``passed`` is whether they are full marks, the message starts with the override and its
reason, the status is ``overridden`` (:attr:`Status.OVERRIDDEN`), and ``override``
(``{"points", "reason", "judged_points"}``) and ``judged`` (the judge's ``status``,
``passed`` and ``points``) are added. The notebook reports (the JSON's ``notebooks``) keep
the judge's verdict as it was. An overridden exercise is the instructor's last word: no late
penalty is taken from it (:mod:`.late`).
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

from ...checks import EXERCISES
from ...checks.verdict import Status
from ...errors import Lesson10Error

#: the columns of overrides.csv
COLUMNS = ("student", "exercise", "points", "reason")


class OverrideError(Lesson10Error, ValueError):
    """overrides.csv cannot be used: the message names the line and what to fix."""


def read(path: Path) -> list[dict]:
    """The overrides of ``path``: ``[{"student", "exercise", "points", "reason", "line"}]``."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise OverrideError(f"cannot read the overrides file {path}: {exc}") from None
    return parse(text, str(path))


def parse(text: str, name: str = "overrides.csv") -> list[dict]:
    """:func:`read` of the file's text."""
    rows = [r for r in csv.reader(io.StringIO(text))]
    numbered = [(i, r) for i, r in enumerate(rows, start=1)
                if any(c.strip() for c in r) and not r[0].lstrip().startswith("#")]
    if not numbered:
        return []
    head_line, head = numbered[0]
    header = [h.strip().lower() for h in head]
    absent = [c for c in COLUMNS if c not in header]
    if absent:
        raise OverrideError(f"{name} line {head_line}: the header needs the columns "
                            f"{', '.join(COLUMNS)} (missing: {', '.join(absent)}), e.g. "
                            f"'student,exercise,points,reason'")
    col = {c: header.index(c) for c in COLUMNS}
    out: list[dict] = []
    seen: dict[tuple, int] = {}
    for line, r in numbered[1:]:
        cells = {c: (r[i].strip() if i < len(r) else "") for c, i in col.items()}
        item = _one(cells, f"{name} line {line}")
        key = (item["student"], item["exercise"])
        if key in seen:
            raise OverrideError(f"{name} line {line}: {item['student']} / {item['exercise']} "
                                f"is overridden already on line {seen[key]}; keep one line")
        seen[key] = line
        out.append({**item, "line": line})
    return out


def _one(cells: dict, where: str) -> dict:
    student, exercise = cells["student"], cells["exercise"]
    if not student:
        raise OverrideError(f"{where}: no student; give the student's name as in the class CSV")
    ex = EXERCISES.get(exercise)
    if ex is None:
        raise OverrideError(f"{where}: {exercise!r} is not an exercise of the course; one of "
                            f"{', '.join(EXERCISES)}")
    try:
        points = int(cells["points"])
    except ValueError:
        raise OverrideError(f"{where}: points {cells['points']!r} is not a whole number; give "
                            f"0 to {ex.points} for {exercise}") from None
    if not 0 <= points <= ex.points:
        raise OverrideError(f"{where}: {points} points for {exercise}, which is worth "
                            f"{ex.points}; give 0 to {ex.points}")
    if not cells["reason"]:
        raise OverrideError(f"{where}: no reason; every output shows why the points were "
                            f"changed, so write one (e.g. 'regrade request, ticket 12')")
    return {"student": student, "exercise": exercise, "points": points,
            "reason": cells["reason"]}


def note(e: dict) -> str:
    """The line an overridden entry's message starts with."""
    o = e["override"]
    return (f"Override by the instructor: {o['points']}/{e['max_points']} points (the judge "
            f"gave {o['judged_points']}/{e['max_points']}): {o['reason']}")


def apply(rows: list[dict], overrides: list[dict]) -> list[str]:
    """Apply ``overrides`` to the gradebook ``rows`` in place; returns a warning per override
    whose student is not in the class (it is not applied)."""
    by_student = {r["student"]: r for r in rows}
    warnings = []
    for o in overrides:
        row = by_student.get(o["student"])
        if row is None:
            warnings.append(f"override of line {o.get('line', '?')}: no student "
                            f"{o['student']!r} in this class; not applied")
            continue
        e = next(x for x in row["exercises"] if x["exercise"] == o["exercise"])
        e["judged"] = {"status": e["status"], "passed": e["passed"], "points": e["points"]}
        e["override"] = {"points": o["points"], "reason": o["reason"],
                         "judged_points": e["points"]}
        e["points"] = o["points"]
        e["status"] = Status.OVERRIDDEN.value      # the judge's is kept in ``judged``
        e["passed"] = o["points"] == e["max_points"]
        if "parts" in e:                     # the parts' points are the judge's, not these
            e["judged_parts"] = e.pop("parts")
        e["message"] = note(e) + ("\n" + e["message"] if e.get("message") else "")
        row["points"] = sum(x["points"] for x in row["exercises"])
    return warnings
