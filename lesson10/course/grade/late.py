"""The late policy: a due time, each student's extension, and what a late notebook costs.

``grade --due 2026-03-01T23:59`` (ISO 8601; without a zone it is this machine's local time)
turns it on. Each graded notebook's hand-in time comes from the LMS or the file system,
never from a name a student chose. It is read from the notebook's *hand-in* (the student's
folder or zip of the class, or the file where ``--student-from`` ends in its name; see
:mod:`.identity`) and holds for everything unpacked from it; nothing inside a hand-in,
and no folder above it (the class's folder), is read:

1. a Canvas download name of the hand-in (``smithjane_12345_67890_02_ring_attention.ipynb``,
   ``smithjane_LATE_12345_67890_hw.zip``): Canvas puts ``LATE_`` after the student's name of
   a late submission. Canvas's mark decides: without ``LATE_`` the file is on time; with it,
   it is late by the file's time past the due time, or by one unit of the policy when the
   file's time says nothing later (an unzip that kept no times);
2. with ``--time-from REGEX`` (the instructor's layout, e.g. Moodle's
   ``'_(?P<time>\\d{8}T\\d{4})$'``): the group ``time`` (else the whole match) of REGEX's first
   match in the path up to and including the hand-in, read as ``2026-03-02_14-05``,
   ``20260302T1405``, ``2026-03-02 14:05:59`` or ISO 8601. A time in a name counts nowhere
   else;
3. else the file's modification time (keep it: ``unzip`` keeps a zip's times); a notebook
   the grader unpacked from a zip has the zip's time.

A student's due time is ``--due`` moved by their extension: a column ``extension`` or
``due`` of the roster CSV, or ``--extensions FILE`` (a CSV ``student,extension``), where an
extension is a due time of its own (``2026-03-04T12:00``) or a length (``2d``, ``36h``, a
bare number is days). The file wins over the roster.

The cost (``--late-penalty 10/day`` or ``2/hour``): that percentage of the notebook's points
for every day (hour) or part of one past the student's due time, at most ``--late-cap PCT``
(default 100). ``--latest-on-time``: of a student's copies of a notebook, the latest one
handed in on time is graded (a late resubmission then costs nothing and counts nothing);
with no copy on time, the copy rule's choice is graded, and penalised.

The penalty is whole points: the percentage of the notebook's points, rounded half up,
taken from its exercises last first. An overridden exercise (:mod:`.overrides`) loses
nothing. Each row carries ``late`` (``[{"notebook", "file", "submitted", "due",
"hours_late", "source", "percent", "points_lost"}]``, one per late notebook) and ``due``.
"""
from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path

from ...errors import Lesson10Error

UNITS = {"day": 86400.0, "hour": 3600.0}
#: a Canvas download name: ``<name>_[LATE_]<user id>_<submission id>_<file>``
CANVAS_NAME = re.compile(r"^[^_/]+_(?P<late>LATE_)?\d+_\d+_", re.IGNORECASE)
#: a time written in a path, read where ``--time-from`` finds one
NAME_TIME = re.compile(r"(?<!\d)(?P<y>20\d\d)-?(?P<mo>[01]\d)-?(?P<d>[0-3]\d)[T_ -]?"
                       r"(?P<h>[0-2]\d)[:.\-h]?(?P<mi>[0-5]\d)(?:[:.\-m]?(?P<s>[0-5]\d))?(?!\d)")


class LateError(Lesson10Error, ValueError):
    """A due time, penalty or extension that cannot be read: the message says the form."""


def parse_time(text: str, what: str = "--due") -> datetime:
    """An ISO 8601 time (``2026-03-01T23:59``, ``2026-03-01 23:59+01:00``); naive is local."""
    try:
        t = datetime.fromisoformat(str(text).strip())
    except ValueError:
        raise LateError(f"{what} {text!r} is not a time; give ISO 8601, e.g. "
                        f"2026-03-01T23:59 or 2026-03-01T23:59+01:00") from None
    return t if t.tzinfo is not None else t.astimezone()


def parse_penalty(text: str) -> tuple[float, str]:
    """``"10/day"`` -> ``(10.0, "day")``; ``"2/hour"``, ``"5%/h"`` too."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*%?\s*/\s*(day|d|hour|h)\s*", str(text), re.I)
    if not m:
        raise LateError(f"--late-penalty {text!r}: give a percentage per day or per hour, "
                        f"e.g. 10/day or 2/hour")
    return float(m.group(1)), "day" if m.group(2).lower().startswith("d") else "hour"


def parse_extension(text: str, due: datetime, who: str) -> datetime:
    """A student's due time from their extension: a time, or ``2d`` / ``36h`` / ``3``."""
    t = str(text).strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(d|days?|h|hours?)?", t, re.I)
    if m:
        hours = float(m.group(1)) * (1 if (m.group(2) or "d").lower().startswith("h") else 24)
        return due + timedelta(hours=hours)
    return parse_time(t, f"the extension of {who}")


def read_table(path: Path, error=ValueError) -> tuple[list[str], list[list[str]]]:
    """``(header in lower case, the rows under it)`` of a CSV file; ``error(message)`` is
    raised when it cannot be read."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read {path}: {exc}") from None
    rows = list(csv.reader(io.StringIO(text)))
    return ([h.strip().lower() for h in rows[0]] if rows else []), rows[1:]


def read_extensions(path: Path, *, column_required: bool = True) -> dict[str, str]:
    """``student -> extension`` of a CSV with a ``student`` column and an ``extension`` (or
    ``due``) column; a roster without such a column gives ``{}``."""
    header, rows = read_table(path, LateError)
    col = next((header.index(c) for c in ("extension", "due") if c in header), None)
    if "student" not in header or col is None:
        if column_required:
            raise LateError(f"{path}: give a header 'student,extension' (an extension is "
                            f"a time, 2026-03-04T12:00, or a length, 2d or 36h)")
        return {}
    who = header.index("student")
    return {r[who].strip(): r[col].strip() for r in rows
            if len(r) > max(who, col) and r[who].strip() and r[col].strip()}


@dataclass
class Policy:
    """What ``--due``, ``--late-penalty``, ``--late-cap``, ``--latest-on-time`` and the
    extensions say. ``extensions``: student -> the text given (kept as given, so the results
    folder can keep it)."""
    due: datetime
    percent: float = 0.0
    unit: str = "day"
    cap: float = 100.0
    on_time_copy: bool = False
    extensions: dict = field(default_factory=dict)
    time_from: str | None = None

    def due_for(self, student: str) -> datetime:
        ext = self.extensions.get(student)
        return self.due if ext is None else parse_extension(ext, self.due, student)

    def as_dict(self) -> dict:
        return {"due": self.due.isoformat(), "percent": self.percent, "unit": self.unit,
                "cap": self.cap, "on_time_copy": self.on_time_copy,
                "extensions": dict(self.extensions), "time_from": self.time_from}

    @classmethod
    def from_dict(cls, doc: dict) -> Policy:
        return cls(due=parse_time(doc["due"]), percent=float(doc.get("percent", 0)),
                   unit=doc.get("unit", "day"), cap=float(doc.get("cap", 100)),
                   on_time_copy=bool(doc.get("on_time_copy")),
                   extensions=dict(doc.get("extensions") or {}),
                   time_from=doc.get("time_from"))

    def describe(self) -> str:
        cost = (f"{self.percent:g}% of a notebook's points per {self.unit} or part of one, "
                f"at most {self.cap:g}%") if self.percent else "no penalty"
        copy = "; the latest copy on time is graded" if self.on_time_copy else ""
        return f"due {self.due.isoformat(timespec='minutes')}: {cost}{copy}"


def policy(due: str | None, penalty: str | None = None, cap: float | None = None,
           on_time_copy: bool = False, extensions: dict | None = None,
           time_from: str | None = None) -> Policy | None:
    """The policy of the command line, or None without ``--due`` (LateError for options
    that need it, and for any that cannot be read)."""
    if due is None:
        if penalty or cap is not None or on_time_copy or extensions or time_from:
            raise LateError("--late-penalty, --late-cap, --latest-on-time, --time-from and "
                            "extensions need --due (the due time, e.g. --due 2026-03-01T23:59)")
        return None
    if time_from is not None:
        try:
            re.compile(time_from)
        except re.error as exc:
            raise LateError(f"--time-from {time_from!r} is not a regular expression: {exc}; "
                            f"give one with a group named 'time', e.g. "
                            f"'_(?P<time>\\d{{8}}T\\d{{4}})$'") from None
    when = parse_time(due)
    percent, unit = parse_penalty(penalty) if penalty else (0.0, "day")
    if cap is not None and not 0 <= cap <= 100:
        raise LateError(f"--late-cap {cap:g}: give a percentage from 0 to 100")
    out = Policy(when, percent, unit, 100.0 if cap is None else float(cap), on_time_copy,
                 dict(extensions or {}), time_from)
    for who in out.extensions:
        out.due_for(who)                         # every extension readable, before grading
    return out


# --------------------------------------------------------------------------- hand-in times
def stamp(handin: str | None, mtime: float | None, time_from: str | None = None) -> dict:
    """``{"time": epoch seconds or None, "source", "late_mark": True/False/None}`` of a file
    of the hand-in ``handin`` (None: none, the student is the class's folder) whose own time
    (or its zip's) is ``mtime`` (see the module's docstring for the order)."""
    canvas = CANVAS_NAME.match(Path(str(handin)).name) if handin else None
    if canvas:
        return {"time": mtime, "source": "Canvas LATE_ mark" if canvas.group("late")
                else "Canvas name (no LATE_ mark)", "late_mark": bool(canvas.group("late"))}
    when = path_time(str(handin), time_from) if handin and time_from else None
    if when is not None:
        return {"time": when, "source": "time in the path (--time-from)", "late_mark": None}
    said = " (--time-from finds no time in the hand-in)" if handin and time_from else ""
    return {"time": mtime, "source": "file time" + said, "late_mark": None}


def path_time(path: str, time_from: str) -> float | None:
    """The time ``--time-from``'s REGEX finds in ``path`` (epoch seconds), or None."""
    m = re.search(time_from, path.replace("\\", "/"))
    if m is None:
        return None
    text = m.group("time") if "time" in m.re.groupindex else m.group(0)
    found = NAME_TIME.search(text or "")
    try:
        if found:
            y, mo, d, h, mi, sec = (int(found.group(k) or 0)
                                    for k in ("y", "mo", "d", "h", "mi", "s"))
            t = datetime(y, mo, d, h, mi, sec)
        else:
            t = datetime.fromisoformat((text or "").strip())
    except ValueError:
        return None
    return (t if t.tzinfo is not None else t.astimezone()).timestamp()


def seconds_late(st: dict, due: datetime, unit: str) -> float | None:
    """Seconds past ``due`` (0: on time; None: late by an unknown time, one unit charged)."""
    t = st["time"]
    if st["late_mark"] is False:
        return 0.0
    past = max(0.0, t - due.timestamp()) if t is not None else 0.0
    if st["late_mark"] and past <= 0:
        return None
    return past


def percent_of(late: float | None, pol: Policy) -> float:
    units = 1 if late is None else math.ceil(late / UNITS[pol.unit] - 1e-9)
    return min(pol.cap, units * pol.percent)


def time_of(path: str, times: dict) -> float | None:
    """The modification time of ``path`` (kept in ``times``, else the file's); a file
    unpacked from a zip (``class/bob/hw.zip/03_x.ipynb``) has the zip's."""
    if str(path) in times:
        return times[str(path)]
    for p in [Path(str(path)), *Path(str(path)).parents]:
        try:
            if p.is_file():
                return p.stat().st_mtime
        except OSError:
            return None
    return None


def stamp_of(path, pol: Policy, times: dict, handins: dict | None) -> dict:
    """:func:`stamp` of the file at ``path`` (``times``: path -> its time when it was graded;
    ``handins``: path -> its hand-in)."""
    return stamp((handins or {}).get(str(path)), time_of(str(path), times), pol.time_from)


def apply(rows: list[dict], pol: Policy | None, times: dict, handins: dict | None = None) -> None:
    """Each row's ``due`` and ``late``, and the penalty taken from its entries (in place).
    ``times``: path -> the file's modification time when it was graded; ``handins``: path ->
    the hand-in it came in (:mod:`.identity`; a path without one is read by its time only)."""
    if pol is None:
        return
    for row in rows:
        due = pol.due_for(row["student"])
        row["due"] = due.isoformat(timespec="minutes")
        row["late"] = []
        for nid, path in row["notebooks"].items():
            st = stamp_of(path, pol, times, handins)
            late = seconds_late(st, due, pol.unit)
            if late == 0:
                continue
            entries = [e for e in row["exercises"] if e["notebook"] == nid]
            pct = percent_of(late, pol)
            lost = _take(entries, pct)
            row["late"].append({
                "notebook": nid, "file": path, "due": row["due"], "source": st["source"],
                "submitted": None if st["time"] is None else
                datetime.fromtimestamp(st["time"]).astimezone().isoformat(timespec="minutes"),
                "hours_late": None if late is None else round(late / 3600, 1),
                "percent": pct, "points_lost": lost})
        row["points"] = sum(e["points"] for e in row["exercises"])


def _take(entries: list[dict], pct: float) -> int:
    """Take ``pct`` % of the entries' points (rounded half up; overridden ones keep theirs),
    last exercise first; returns the points taken."""
    mine = [e for e in entries if "override" not in e]
    want = math.floor(sum(e["points"] for e in mine) * pct / 100 + 0.5)
    taken = 0
    for e in reversed(mine):
        cut = min(e["points"], want - taken)
        if cut <= 0:
            continue
        e.setdefault("judged", {"status": e["status"], "passed": e["passed"],
                                "points": e["points"]})
        e["points"] -= cut
        e["late_penalty"] = cut
        e["passed"] = False
        if "parts" in e:
            e["judged_parts"] = e.pop("parts")
        e["message"] = (f"Late: {cut} point(s) taken by the late policy ({pct:g}% of the "
                        f"notebook's points)\n" + e.get("message", ""))
        taken += cut
    return taken


def describe_row(row: dict) -> str:
    """One line of a row's lateness for a table cell ("" when on time or no policy)."""
    parts = []
    for item in row.get("late", []):
        when = "late by an unknown time" if item["hours_late"] is None else \
            f"{item['hours_late']:g} h late"
        parts.append(f"{item['notebook']}: {when} ({item['source']}), -{item['percent']:g}% "
                     f"= -{item['points_lost']}")
    return "; ".join(parts)


# --------------------------------------------------------------------------- copies
def choose_on_time(the_plan, pol: Policy | None, times: dict | None = None,
                   handins: dict | None = None):
    """With ``--latest-on-time``: of each student's copies of a notebook, the latest one on
    time is graded (the plan is changed in place and returned)."""
    if pol is None or not pol.on_time_copy:
        return the_plan
    times = times or {}
    for i, chosen in enumerate(list(the_plan.graded)):
        copies = [p for p, c in the_plan.ignored.items() if c is chosen]
        if not copies:
            continue
        due = pol.due_for(chosen.student)
        cands = []
        for p in [chosen.path, *copies]:
            st = stamp_of(p, pol, times, handins)
            if seconds_late(st, due, pol.unit) == 0:
                cands.append((st["time"] or 0.0, str(p), p))
        if not cands:
            continue
        best = max(cands)[2]
        if best == chosen.path:
            continue
        new = replace(chosen, path=best, mtime=time_of(str(best), times) or 0.0)
        the_plan.graded[i] = new
        for p in [chosen.path, *copies]:
            the_plan.ignored.pop(p, None)
            if p != best:
                the_plan.ignored[p] = new
    return the_plan
