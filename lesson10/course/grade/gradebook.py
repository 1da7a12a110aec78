"""Who handed in what: the students of a batch, which course notebook each file is, copies
and collisions, and one gradebook row per student.

**The student of a notebook** and the hand-in it came in are :mod:`.identity`'s: only what
the instructor names (``--student NAME``, ``--student-from REGEX``, ``--roster``), else the
student's folder or zip of the class, never a folder inside a student's zip.

**One file per course notebook and student.** Several files of one student that are the
same course notebook (copies: ``Copy of ...``, ``...-Copy1``, ``... (1)``, see
:func:`lesson10.course.grade.course.copy_base`; or versions, ``..._final``; in one student folder
at any depth) count once: one is graded, chosen by :data:`COPY_RULE`, and the others are
listed in the feedback as not graded. What the grader refuses is an instructor's name that
stands for several students: a ``--student-from`` that gives two places one name
(``sec1/s01`` and ``sec2/s01`` both ``s01``), or a flat folder whose file names start with
different names (``alice_03_...``, ``bob_02_...``). That is an error (:class:`PlanError`),
never a merge. Two hand-ins that folder names would make one student are kept apart
(:mod:`.identity`), with a note in their rows.

**The row of a student** lists every exercise of the course: a notebook that was not handed
in counts 0 of its points with the status ``missing``, so every row's maximum is the
course's maximum whatever the batch contains.
"""
from __future__ import annotations

import csv
import io
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ...checks import EXERCISES
from ...checks.exercises import maximum
from ...checks.verdict import Status
from . import accounting, course, identity, nbread, submission_files
from .accounting import SKIP_FOLDERS
from .identity import WRAPPERS, PlanError, safe_text  # noqa: F401 - this module's names too
from .results import Entry

#: how one of several copies of a notebook is chosen (README "Instructors" says the same)
COPY_RULE = ("never a symbolic link beside a real file; the file with the fewest exercises "
             "left unwritten (raise NotImplementedError statements its code can still run, "
             "comments and code after a return not counted); on a tie the most recently "
             "modified file; then a name without a copy's decoration ('Copy of ', '-Copy1', "
             "' (1)'); then the shortest path, then the path in alphabetical order")




@dataclass
class Item:
    """One notebook file of the batch."""
    path: Path
    student: str
    notebook: str | None          # course notebook id, or None (unknown, unreadable)
    stubs: int = 0                # code cells' NotImplementedError lines (a blank is many)
    mtime: float = 0.0
    readable: bool = True
    where: str = ""               # the place the student's name came from (see student_keys)


@dataclass
class Plan:
    graded: list[Item]                          # what to grade, in the order given
    ignored: dict = field(default_factory=dict)  # Path of a copy not graded -> Item graded
    students: list[str] = field(default_factory=list)
    roster: list[str] | None = None
    #: files not graded: student (None: no student's, e.g. beside the class's folders) ->
    #: [{"path", "reason"}] (see :mod:`.accounting`)
    not_graded: dict = field(default_factory=dict)
    #: path -> the hand-in it came in, or None (:mod:`.identity`; the late policy reads it)
    handins: dict = field(default_factory=dict)
    #: student -> the sentences of the collisions that concern them (in every output)
    notes: dict = field(default_factory=dict)

    def not_on_roster(self) -> list[str]:
        return [s for s in self.students if self.roster is not None and s not in self.roster]


# --------------------------------------------------------------------------- finding files
def find_notebooks(paths) -> list[Path]:
    """The notebooks named on the command line: a file as given (even one that does not
    exist, which the grader reports), a folder searched at any depth for ``*.ipynb``
    (hidden folders and files, checkpoints and ``__MACOSX`` skipped), in path order."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = []
            for top, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_FOLDERS)
                found += [Path(top) / f for f in files
                          if f.lower().endswith(".ipynb") and not f.startswith(".")]
            out += sorted(found)
        else:
            out.append(p)
    seen, unique = set(), []
    for p in out:
        key = os.path.abspath(p)
        if key not in seen:
            seen.add(key)
            unique.append(p)
    return unique


def read_roster(path: Path) -> list[str]:
    """Student names from a roster: a CSV with a ``student`` column, or one name a line
    (the first comma-separated field; blank lines and ``#`` comments skipped)."""
    text = Path(path).read_text(encoding="utf-8-sig")
    rows = list(csv.reader(io.StringIO(text)))
    header = [h.strip().lower() for h in rows[0]] if rows else []
    if "student" in header:
        col = header.index("student")
        names = [r[col].strip() for r in rows[1:] if len(r) > col]
    else:
        names = [r[0].strip() for r in rows if r and not r[0].lstrip().startswith("#")]
    names = [n for n in names if n]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise PlanError(f"the roster {path} names {', '.join(dupes)} more than once")
    return names


# --------------------------------------------------------------------------- students
_posix = identity.posix


def student_keys(paths: list[Path], student: str | None = None,
                 student_from: str | None = None, roster: list[str] | None = None,
                 base: str | None = None, anchors=()) -> dict[Path, tuple[str, str]]:
    """``path -> (student, where)``: :func:`.identity.resolve`'s keys."""
    return identity.resolve(paths, student, student_from, roster, base, anchors).keys


_UNSAFE_IN_NAME = re.compile(r'[\x00-\x1f<>:"|?*%\\]|^ | $')


def safe_parts(student: str) -> list[str]:
    """``student`` as path parts that are safe as file names (``sec1/s01`` -> two folders),
    one to one: a character a file name cannot hold, ``%``, and a space at either end are
    written ``%XX`` (``a:b`` is ``a%3Ab``, never the same folder as ``a_b``; a backslash is
    ``%5C``); an empty part is ``%``, and ``.``/``..`` are ``%2E``/``%2E%2E``."""
    parts = []
    for part in str(student).split("/"):
        part = _UNSAFE_IN_NAME.sub(lambda m: f"%{ord(m.group()):02X}", part)
        parts.append({"": "%", ".": "%2E", "..": "%2E%2E"}.get(part, part))
    return parts


# --------------------------------------------------------------------------- the plan
def _look(path: Path, content: bytes | None) -> tuple[str | None, int, bool]:
    """``(course notebook id or None, NotImplementedError lines, readable)`` of one file,
    from its bytes (read before any student code ran), read and validated by
    :func:`.nbread.read`: a file it refuses is unreadable, whatever is in it."""
    nb = nbread.read(path, content)[0] if content is not None else None
    if nb is None:
        return course.identify({}, path)[0], 1 << 30, False
    return course.identify(nb, path)[0], course.unwritten(nb), True


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _rank(item: Item):
    """Sort key of :data:`COPY_RULE`: the smallest is graded."""
    return (item.stubs, -item.mtime, course.is_copy_name(item.path.name),
            len(_posix(item.path)), _posix(item.path))


def name_prefix(path: Path, notebook: str | None) -> str:
    """The first word before the course notebook id in a file name (``alice`` for
    ``alice_4711_03_load_balance.ipynb``; empty for ``Copy of 03_load_balance.ipynb``)."""
    base = course.copy_base(path.name)
    if not notebook or notebook not in base:
        return ""
    words = [w for w in re.split(r"[\W_]+", base[:base.index(notebook)]) if w]
    return words[0].lower() if words else ""


def _flat_downloads(items: list[Item]) -> list[str]:
    """A folder whose notebooks' names start with different names ("alice_03_...",
    "bob_02_..."): several students' files in one folder, which folder keys would merge."""
    out = []
    by_student: dict[str, list[Item]] = {}
    for it in items:
        by_student.setdefault(it.student, []).append(it)
    for who, group in by_student.items():
        names = sorted({name_prefix(it.path, it.notebook) for it in group} - {""})
        if len(names) > 1:
            files = [_posix(it.path) for it in group]
            out.append(f"  {who}: file names start with {', '.join(names[:6])}"
                       f"{', ...' if len(names) > 6 else ''} (several students in one folder?): "
                       + ", ".join(files[:6]) + (", ..." if len(files) > 6 else ""))
    return out


def plan(paths: list[Path], contents: dict, *, student: str | None = None,
         student_from: str | None = None, roster: list[str] | None = None,
         others=(), base: str | None = None, anchors=(), notes: dict | None = None,
         real: dict | None = None, given=()) -> Plan:
    """Which file of whom to grade. ``contents``: path -> bytes (None: unreadable or absent);
    ``others``: the batch's files that are not notebooks (:func:`.accounting.find_others`),
    each listed in the plan's ``not_graded`` under its student (``notes``: absolute path ->
    the reason, where it is not :func:`.accounting.reason`'s); ``anchors``: files that only
    say where a student's files stand (the zips unpacked, :mod:`.archives`); ``real``: path
    -> the file on disk, for a path shown inside a zip; ``given``: the paths named on the
    command line (a zip named is its student's; with ``student``, each is the hand-in of the
    files under it)."""
    others = list(others)
    ids = _identities(paths, others, student, student_from, roster, base, anchors, given)
    base, keys = ids.root or base, ids.keys
    items = []
    for p in paths:
        nid, stubs, readable = _look(p, contents.get(p))
        items.append(Item(p, keys[p][0], nid, stubs, _mtime(Path((real or {}).get(p, p))),
                          readable, keys[p][1]))
    groups: dict[tuple, list[Item]] = {}
    for it in items:
        if it.notebook is not None and contents.get(it.path) is not None:
            groups.setdefault((it.student, it.notebook), []).append(it)   # a missing file: its own
    ignored: dict[Path, Item] = submission_files.links_beside_files(items, groups, _rank)
    collisions = []
    for (who, nid), group in groups.items():
        if len(group) < 2:
            continue
        if len({it.where for it in group}) > 1:       # two places, one name: two students
            collisions.append(f"  {who} / {nid}: " + ", ".join(_posix(it.path) for it in group))
            continue
        chosen = min(group, key=_rank)
        for it in group:
            if it is not chosen:
                ignored[it.path] = chosen
    if student is None and student_from is None:
        collisions += _flat_downloads(items)
    if collisions:
        raise PlanError(
            "these notebooks would be one student's, and they look like several students' "
            "(one name taken from two places, or file names in one folder that start with "
            "different names):\n" + "\n".join(collisions) + "\nThe grader merges nobody: "
            "give each student a folder of their own, or name the student with "
            "--student-from REGEX (a group named 'student' in the path), or --student NAME "
            "when all of these files are one student's.")
    graded = [it for it in items if it.path not in ignored]
    found = sorted({it.student for it in items})
    not_graded = _not_graded(others, keys, paths, found, base, notes or {})
    found = sorted(set(found) | {s for s in not_graded if s is not None})
    names = list(roster) if roster is not None else []
    names += [s for s in found if s not in names]
    if student is not None and not names:
        names = [student.strip()]
    return Plan(graded=graded, ignored=ignored, students=names, roster=roster,
                not_graded=not_graded, handins={p: ids.handins.get(p) for p in paths},
                notes=ids.notes)


def _identities(paths, others, student, student_from, roster, base, anchors, given):
    """:func:`.identity.resolve` of the batch; the files that are not notebooks too."""
    if student is None and student_from is None:
        return identity.resolve(list(paths) + others, roster=roster, base=base,
                                anchors=anchors, given=given)
    ids = identity.resolve(paths, student, student_from, given=given)
    for o in others:
        ids.keys[o] = _other_key(o, student, student_from)
    return ids


def _other_key(path: Path, student: str | None, student_from: str | None):
    """The (student, where) of a file that is not a notebook, or None (no student's)."""
    if student is not None:
        return (student.strip(), "")
    m = re.search(str(student_from), _posix(path))
    name = (m.group("student") or "").strip() if m else ""
    return (name, _posix(path)[:m.end("student")]) if m and name else None


def _not_graded(others, keys, paths, students, base=None, notes=None) -> dict:
    """student (or None) -> [{"path", "reason"}] of the files not graded. A file in the
    batch's common folder itself, when the batch has several students, is no student's."""
    if not others:
        return {}
    reasons = accounting.not_graded(others, paths)
    folders = [os.path.dirname(os.path.abspath(p)) for p in list(paths) + list(others)]
    common = os.path.commonpath(folders) if folders else ""
    if base and (common == base or common.startswith(base.rstrip(os.sep) + os.sep)):
        common = base
    out: dict = {}
    for o in others:
        why = (notes or {}).get(os.path.abspath(o), reasons.get(os.path.abspath(o)))
        if why is None:
            continue
        key = keys.get(o)
        who = key[0] if key is not None else None
        if key is not None and key[1] == common and len(students) > 1:
            who = None
        out.setdefault(who, []).append({"path": str(o), "reason": why})
    return out


# --------------------------------------------------------------------------- the rows


def course_max() -> int:
    """The course maximum in the course file in force (:func:`lesson10.checks.exercises.maximum`)."""
    return maximum()


def graded_notebooks() -> list[str]:
    """The course notebooks that have exercises, in the course's order."""
    return [nid for nid in course.course_notebooks() if course.exercises(nid)]


def rows(reports: list[dict], the_plan: Plan | None = None) -> list[dict]:
    """One row per student: every course exercise (``missing`` where no notebook was handed
    in), ``points``, ``max_points`` (the course's), ``notebooks`` (id -> path graded),
    ``missing`` (ids), ``ignored`` (copies not graded), ``unknown`` (files that are no course
    notebook), ``not_graded`` (the other files of the submission, ``{"path", "reason"}``),
    ``ok`` (False: a grader error; do not trust the row)."""
    by_student: dict[str, list[dict]] = {}
    for rep in reports:
        by_student.setdefault(rep["student"], []).append(rep)
    names = list(the_plan.students) if the_plan is not None else []
    names += [s for s in sorted(by_student) if s not in names]
    out = []
    for name in names:
        reps = by_student.get(name, [])
        handed = {}
        for rep in reps:
            if rep.get("course_notebook") and rep["course_notebook"] not in handed:
                handed[rep["course_notebook"]] = rep
        entries = []
        for ex in EXERCISES.values():
            got_rep: dict | None = handed.get(ex.notebook)
            if got_rep is None:
                entries.append(Entry.missing(ex.id, ex.notebook, ex.points).to_json())
                continue
            rep = got_rep
            got = next((e for e in rep["exercises"] if e["exercise"] == ex.id), None)
            if got is None:
                why = rep.get("error") or "the grader gave this exercise no verdict"
                got = Entry(exercise=ex.id, status=Status.NOT_JUDGED if rep["ok"] else
                            Status.GRADER_ERROR, max_points=ex.points, message=why).to_json()
            entries.append({**got, "notebook": ex.notebook, "max_points": ex.points})
        ignored = []
        if the_plan is not None:
            for path, chosen in the_plan.ignored.items():
                if chosen.student == name:
                    ignored.append({"path": str(path), "graded": str(chosen.path),
                                    "notebook": chosen.notebook})
        out.append({
            "student": name,
            "points": sum(e["points"] for e in entries),
            "max_points": course_max(),
            "exercises": entries,
            "notebooks": {nid: handed[nid]["notebook"] for nid in course.course_notebooks()
                          if nid in handed},
            "missing": [nid for nid in graded_notebooks() if nid not in handed],
            "ignored": ignored,
            "unknown": [rep["notebook"] for rep in reps if not rep.get("course_notebook")],
            "not_graded": list(the_plan.not_graded.get(name, [])) if the_plan is not None else [],
            "notes": list(the_plan.notes.get(name, [])) if the_plan is not None else [],
            "ok": all(rep["ok"] for rep in reps),
            "on_roster": None if the_plan is None or the_plan.roster is None
            else name in the_plan.roster,
        })
    return out


def split_message(message: str) -> tuple[str, list[str]]:
    """``(what the judge found, [hints])``: the checks end a message with ``hint: ...`` lines."""
    body, hints = [], []
    for line in str(message or "").splitlines():
        if line.lstrip().lower().startswith("hint:"):
            hints.append(line.lstrip()[len("hint:"):].strip())
        elif hints and line.startswith("  "):           # a hint that goes on
            hints[-1] += " " + line.strip()
        else:
            body.append(line)
    return "\n".join(body).strip(), hints
