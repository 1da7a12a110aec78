"""Who handed in what: the students of a batch, which course notebook each file is, copies
and collisions, and one gradebook row per student.

**The student of a notebook** is its folder relative to the common parent of every
notebook's folder in the batch: ``subs/sec1/s01/a.ipynb`` and ``subs/sec2/s01/a.ipynb`` are
the students ``sec1/s01`` and ``sec2/s01``; when every notebook sits in one folder, that
folder's name. A student's folder ends at the first folder that wraps notebooks rather than
names a student (:data:`WRAPPERS`: a GitHub zip ``lesson10-main``, ``notebooks``), and a
folder inside a student's folder is that student's: ``alice/lesson10-main/notebooks/02...``
is alice's. With ``--roster`` the roster decides: the longest run of folder names that is a
roster name is the student (``sec1/alice`` is ``alice`` when the roster names alice).
``--student-from REGEX`` takes the group named ``student`` of the first match
of REGEX in the notebook's path as given (a flat download: ``'(?P<student>[^/]+)_\\d\\d_'``),
and ``--student NAME`` says the whole batch is one student's work (a repository, a Gradescope
submission).

**One file per course notebook and student.** Several files of one student that are the
same course notebook (copies: ``Copy of ...``, ``...-Copy1``, ``... (1)``, see
:func:`lesson10.course.grade.course.copy_base`; or versions, ``..._final``; in one student folder
at any depth) count once: one is graded, chosen by :data:`COPY_RULE`, and the others are
listed in the feedback as not graded. What the grader refuses is a *collision*, names that
stand for several students: a ``--student-from`` that gives two places one name
(``sec1/s01`` and ``sec2/s01`` both ``s01``), or a flat folder whose file names start with
different names (``alice_03_...``, ``bob_02_...``). That is an error (:class:`PlanError`),
never a merge.

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
from ...errors import Lesson10Error
from . import accounting, course, nbread, submission_files
from .accounting import SKIP_FOLDERS
from .results import Entry

#: how one of several copies of a notebook is chosen (README "Instructors" says the same)
COPY_RULE = ("never a symbolic link beside a real file; the file with the fewest exercises "
             "left unwritten (raise NotImplementedError statements its code can still run, "
             "comments and code after a return not counted); on a tie the most recently "
             "modified file; then a name without a copy's decoration ('Copy of ', '-Copy1', "
             "' (1)'); then the shortest path, then the path in alphabetical order")




class PlanError(Lesson10Error, ValueError):
    """The batch cannot be graded as given (a collision, a --student-from that does not
    match): the grader says so and grades nothing."""


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
def _posix(path: Path) -> str:
    return str(path).replace(os.sep, "/")


def student_keys(paths: list[Path], student: str | None = None,
                 student_from: str | None = None, roster: list[str] | None = None,
                 base: str | None = None, anchors=(), named=()) -> dict[Path, tuple[str, str]]:
    """``path -> (student, where)`` (see the module's docstring). ``where`` tells apart two
    places that give the same name: the student's folder (folder keys), the path up to the
    end of the ``student`` group (``--student-from``), nothing (``--student``). ``base``: the
    class's folder (a results folder's), used instead of the common parent under it.
    ``anchors``: zips unpacked (their folder is where their files stand), ``named``: the
    absolute paths of those named on the command line (each names its student)."""
    if student is not None:
        if not student.strip():
            raise PlanError("--student needs a name")
        return {p: (student.strip(), "") for p in paths}
    if student_from is not None:
        try:
            rx = re.compile(student_from)
        except re.error as exc:
            raise PlanError(f"--student-from {student_from!r} is not a regular expression: "
                            f"{exc}") from None
        if "student" not in rx.groupindex:
            raise PlanError(f"--student-from {student_from!r} has no group named 'student', "
                            f"e.g. '(?P<student>[^/]+)/'")
        keys = {}
        for p in paths:
            m = rx.search(_posix(p))
            name = safe_text((m.group("student") or "").strip()) if m else ""
            if m is None or not name:
                raise PlanError(f"--student-from {student_from!r} finds no student in "
                                f"{_posix(p)!r}")
            keys[p] = (name, _posix(p)[:m.end("student")])
        return keys
    folders = {p: os.path.dirname(os.path.abspath(p)) for p in list(paths) + list(anchors)}
    if not folders:
        return {}
    common = os.path.commonpath(list(folders.values()))
    if base and (common == base or common.startswith(base.rstrip(os.sep) + os.sep)):
        common = base                   # some students of a class graded again
    keys = {}
    # a zip in the class's folder beside other students' files is named after its student
    tops = {os.path.relpath(folders[p], common).split(os.sep)[0] for p in paths}
    zips = {os.path.join(common, t) for t in tops if t.lower().endswith(".zip")} \
        if len(tops) > 1 else set()
    zips |= {os.path.abspath(z) for z in named}
    for p, folder in folders.items():
        keys[p] = folder_student(folder, common, roster, zips)
    return _merge_nested(keys, common)


_SURROGATE = re.compile("[\ud800-\udfff]")


def safe_text(text):
    """``text`` (or every string in a list or dict of them) as any file takes it: a name
    read from the file system with surrogate escapes (bytes that are not UTF-8, such as a
    Windows zip's Latin-1 folder names) gets those bytes as Latin-1 letters (``Jos\\udce9``
    is ``José``); other lone surrogates become U+FFFD."""
    if isinstance(text, str):
        return _SURROGATE.sub(lambda m: chr(ord(m.group()) - 0xDC00)
                              if 0xDC80 <= ord(m.group()) <= 0xDCFF else "\ufffd", text)
    if isinstance(text, dict):
        return {safe_text(k): safe_text(v) for k, v in text.items()}
    if isinstance(text, (list, tuple)):
        return type(text)(safe_text(v) for v in text)
    return text


#: folder names that wrap a student's notebooks rather than name a student: a GitHub zip
#: (``lesson10-main``, ``<repo>-master``), the course's own folders, Colab's folder
WRAPPERS = re.compile(r"^(notebooks?|solutions|submissions?|colab notebooks|"
                      r"lesson10([^a-z0-9].*)?|.+-(main|master))$", re.IGNORECASE)


def folder_student(folder: str, common: str, roster=None, zips=()) -> tuple[str, str]:
    """``(student, student folder)`` of a file in ``folder``: with a roster, the longest
    run of folder names under ``common`` that is a roster name (``sec1/alice/x`` is
    ``alice`` when the roster says so); else the folders under ``common`` up to the first
    wrapper (:data:`WRAPPERS`: ``alice/lesson10-main/notebooks`` is ``alice``). A zip's
    name is no folder, except a zip of ``zips`` (absolute paths) right under ``common``
    holding a wrapper or the files themselves: it names its student (``alice.zip``)."""
    rel = os.path.relpath(folder, common)
    raw = [] if rel == "." else list(Path(rel).parts)
    parts = [safe_text(p) for p in raw if not p.lower().endswith(".zip")]
    if raw and os.path.join(common, raw[0]) in zips and (not parts or WRAPPERS.match(parts[0])):
        parts.insert(0, safe_text(raw[0][:-4]))
    if roster:
        names = set(roster)
        for size in range(len(parts), 0, -1):
            for i in range(len(parts) - size + 1):
                name = "/".join(parts[i:i + size])
                if name in names:
                    return name, os.path.join(common, *parts[:i + size])
    depth = next((i for i, part in enumerate(parts) if i and WRAPPERS.match(part)), len(parts))
    if depth == 0:
        name = safe_text(os.path.basename(common))
        return (name[:-4] if name.lower().endswith(".zip") else name) or "student", common
    return "/".join(parts[:depth]), os.path.join(common, *parts[:depth])


def _merge_nested(keys: dict, common: str) -> dict:
    """A student folder inside another student's folder is that student's (a download
    unpacked in ``alice/``: ``alice/lesson10/...`` is alice's work, whatever its names)."""
    places = sorted({where for _, where in keys.values() if where != common}, key=len)
    out = {}
    for p, (name, where) in keys.items():
        outer = next((w for w in places if where.startswith(w + os.sep)), None)
        if outer is not None:
            name = next(n for n, w in keys.values() if w == outer)
            where = outer
        out[p] = (name, where)
    return out


def safe_parts(student: str) -> list[str]:
    """``student`` as path parts that are safe as file names (``sec1/s01`` -> two folders)."""
    parts = []
    for part in str(student).replace("\\", "/").split("/"):
        part = re.sub(r"[\x00-\x1f<>:\"|?*]", "_", part).strip()
        if part in ("", ".", ".."):
            part = part.replace(".", "_") or "_"
        parts.append(part)
    return parts or ["_"]


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
         real: dict | None = None, named=()) -> Plan:
    """Which file of whom to grade. ``contents``: path -> bytes (None: unreadable or absent);
    ``others``: the batch's files that are not notebooks (:func:`.accounting.find_others`),
    each listed in the plan's ``not_graded`` under its student (``notes``: absolute path ->
    the reason, where it is not :func:`.accounting.reason`'s); ``anchors``: files that only
    say where a student's files stand (the zips unpacked, :mod:`.archives`; ``named``: those
    named on the command line, see :func:`folder_student`); ``real``: path
    -> the file on disk, for a path shown inside a zip."""
    others = list(others)
    if student is None and student_from is None:
        keys = student_keys(list(paths) + others, roster=roster, base=base, anchors=anchors,
                            named=named)
    else:
        keys = student_keys(paths, student, student_from)
        for o in others:
            keys[o] = _other_key(o, student, student_from)
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
                not_graded=not_graded)


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
