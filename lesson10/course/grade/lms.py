"""Gradebook import files for an LMS: ``grade --export canvas`` and ``--export moodle``.

Both are keyed by the roster (``--roster FILE``, a CSV with a header), never by the
grader's student name alone, so no hand join is needed:

* **Canvas** (``canvas-grades.csv``): the columns of Canvas's own gradebook export,
  ``Student,ID,SIS User ID,SIS Login ID,Section,<assignment>``, then a ``Points Possible``
  row (its first five cells blank but the first) and one row per student. Canvas matches a
  row by ``ID`` (the Canvas user id) or by ``SIS User ID`` / ``SIS Login ID``. The roster
  columns read: ``name`` (else the student), ``canvas_id`` or ``id``, ``sis_id`` (or ``SIS
  User ID``), ``sis_login_id`` (or ``login``, else ``email``), ``section``. Import: the
  course's *Grades* page, *Import*, choose the file, *Upload Data*; an assignment name
  Canvas does not know becomes a new assignment (*Create a new Assignment* in the preview).
* **Moodle** (``moodle-grades.csv``): ``Email address,ID number,<assignment>,Feedback`` (one
  row per student; the ``email`` column of the roster, ``sis_id`` as the ID number). Import:
  the course's *Grades*, the grade-report menu, *Import*, *CSV file*; upload, then under
  *Identify user by* map *Email address* to *Email address*, and map the grade column to
  the grade item (or *New grade item*) and *Feedback* to its feedback.

The grade is the row's total after overrides and the late policy (:mod:`.adjust`), of the
course maximum. A student with no key on the roster is left out, with a warning naming
them (:func:`write`).
"""
from __future__ import annotations

from pathlib import Path

from ...errors import Lesson10Error
from . import late
from .reports import csv_text

FORMATS = ("canvas", "moodle")
FILE_NAMES = {"canvas": "canvas-grades.csv", "moodle": "moodle-grades.csv"}
CANVAS_HEAD = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
MOODLE_HEAD = ("Email address", "ID number")
#: roster columns read for each field (the first one present wins), lower case
FIELDS = {"name": ("name", "full name", "student name"),
          "canvas_id": ("canvas_id", "canvas user id", "id"),
          "sis_id": ("sis_id", "sis user id", "sis id", "id number"),
          "sis_login_id": ("sis_login_id", "sis login id", "login", "email"),
          "section": ("section",),
          "email": ("email", "email address", "e-mail")}


class ExportError(Lesson10Error, ValueError):
    """The export cannot be written as asked (no roster, no key column)."""


def people(roster: Path) -> dict[str, dict]:
    """``student -> {field: value}`` of a roster CSV (:data:`FIELDS`; blank where absent)."""
    header, rows = late.read_table(roster, ExportError)
    if "student" not in header:
        raise ExportError(f"the roster {roster} has no header with a 'student' column; an "
                          f"export needs one, e.g. 'student,name,sis_id,email,section'")
    cols = {f: next((header.index(c) for c in names if c in header), None)
            for f, names in FIELDS.items()}
    who = header.index("student")
    out = {}
    for r in rows:
        if len(r) <= who or not r[who].strip():
            continue
        out[r[who].strip()] = {f: (r[i].strip() if i is not None and i < len(r) else "")
                               for f, i in cols.items()}
    return out


def check(formats, roster: Path | None) -> None:
    """Refuse, before any grading, an export the roster cannot key."""
    if not formats:
        return
    if roster is None:
        raise ExportError("--export needs --roster FILE: a CSV with 'student' and the LMS's "
                          "keys (sis_id for Canvas, email for Moodle)")
    found = people(roster)
    needs = {"canvas": ("canvas_id", "sis_id", "sis_login_id"), "moodle": ("email",)}
    for fmt in formats:
        if not any(p[f] for p in found.values() for f in needs[fmt]):
            raise ExportError(f"--export {fmt}: the roster {roster} has no "
                              f"{' or '.join(needs[fmt])} column with values; add it")


def _key(fmt: str, person: dict | None) -> bool:
    if person is None:
        return False
    if fmt == "canvas":
        return bool(person["canvas_id"] or person["sis_id"] or person["sis_login_id"])
    return bool(person["email"])


def canvas(rows: list[dict], who: dict, assignment: str) -> str:
    """Canvas's gradebook import CSV (see the module's docstring)."""
    top = rows[0]["max_points"] if rows else 0
    table = [[*CANVAS_HEAD, assignment], ["    Points Possible", "", "", "", "", top]]
    for r in rows:
        p = who.get(r["student"])
        if not _key("canvas", p):
            continue
        assert p is not None
        table.append([p["name"] or r["student"], p["canvas_id"], p["sis_id"],
                      p["sis_login_id"], p["section"], r["points"]])
    return csv_text(table)


def moodle(rows: list[dict], who: dict, assignment: str, notes=None) -> str:
    """Moodle's grade import CSV keyed by email (see the module's docstring); ``notes``:
    student -> feedback text."""
    table = [[*MOODLE_HEAD, assignment, "Feedback"]]
    for r in rows:
        p = who.get(r["student"])
        if not _key("moodle", p):
            continue
        assert p is not None
        text = f"{r['points']} / {r['max_points']}"
        extra = (notes or {}).get(r["student"])
        table.append([p["email"], p["sis_id"], r["points"],
                      text + (f"; {extra}" if extra else "")])
    return csv_text(table)


def write(folder: Path, formats, rows: list[dict], roster: Path, assignment: str = "lesson10",
          notes=None) -> tuple[list[Path], list[str]]:
    """Write each export into ``folder``; ``(paths, warnings)``: a warning names the
    students an export leaves out (no key on the roster)."""
    who = people(roster)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths, warnings = [], []
    for fmt in formats:
        text = canvas(rows, who, assignment) if fmt == "canvas" else \
            moodle(rows, who, assignment, notes)
        path = folder / FILE_NAMES[fmt]
        path.write_text(text, encoding="utf-8")
        paths.append(path)
        left = [r["student"] for r in rows if not _key(fmt, who.get(r["student"]))]
        if left:
            warnings.append(f"--export {fmt} leaves out {len(left)} students with no key on "
                            f"the roster: {', '.join(left[:10])}{', ...' if len(left) > 10 else ''}")
    return paths, warnings
