"""Who handed in a file, and in which hand-in: only from what the instructor names.

**The student** is ``--student NAME``, or the group ``student`` of ``--student-from REGEX``,
or a roster name, or else the student's *hand-in*: the folder or zip of the class the
notebook came in, never a folder inside a student's zip. The class's folder (the *root*)
is the common parent of the batch's files (the results folder's, when some of a class is
graded again); a zip that is all the batch holds and holds several folders (a class
download) is a class folder too, and the root is inside it.

- ``subs/sec1/s01/a.ipynb`` and ``subs/sec2/s01/a.ipynb``: ``sec1/s01`` and ``sec2/s01``.
  A student's folder ends at the first folder that wraps notebooks rather than names a
  student (:data:`WRAPPERS`: ``alice/lesson10-main/notebooks`` is alice's), except
  GitHub Classroom's repositories: where a folder holds several ``lesson10-<user>``
  (``sec1/lesson10-alice``, ``sec1/lesson10-bob``), each such folder is a student.
- a zip of the class (``class/bob.zip``) is the student ``bob``, whatever folders it holds;
  a zip inside a student's folder (``class/carol/hw.zip``) is carol's. A Canvas name of
  the class (``smithjane_LATE_12_34_hw.zip``) is its student's login (``smithjane``).
- the root holding one student's files (loose notebooks or one wrapper folder, and at most
  one zip: one student's folder graded alone) is that student, and its zip no other one.
- with a roster, the longest run of folder names outside any zip of a student's that is a
  roster name (``sec1/alice`` is ``alice`` when the roster names alice).

**The hand-in** of a file is the student's folder or zip of the class, as a path under the
root (``bob.zip``, ``sec1/s01``); the path as given up to the end of the component in which
``--student-from``'s ``student`` group ends (a flat download: the file itself); or, with
``--student``, the path named on the command line that holds it; None where the student is
the root itself. Its name is the LMS's (a Canvas download's), so the
late policy (:mod:`.late`) reads hand-in times from it and from nothing inside it.

**Collisions** never replace anyone's work and never stop the run: two hand-ins that would
be one student (``class/bob/`` and ``class/bob.zip``; ``sec1/alice`` and ``sec2/alice`` with
a roster naming alice) are graded as the students their paths name (``bob`` and
``bob.zip``), and a hand-in holding a folder named after another student is graded as its
own student's; each is a note in the rows of the students concerned (every output shows
it). A ``--student-from`` that gives two places one name is the instructor's to fix
(:class:`PlanError`, see :mod:`.gradebook`).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import Lesson10Error
from .late import CANVAS_NAME


class PlanError(Lesson10Error, ValueError):
    """The batch cannot be graded as given (a collision, a --student-from that does not
    match): the grader says so and grades nothing."""


#: folder names that wrap a student's notebooks rather than name a student: a GitHub zip
#: (``lesson10-main``, ``<repo>-master``), the course's own folders, Colab's folder
WRAPPERS = re.compile(r"^(notebooks?|solutions|submissions?|colab notebooks|"
                      r"lesson10([^a-z0-9].*)?|.+-(main|master))$", re.IGNORECASE)
#: wrappers that are a repository's name (GitHub Classroom's ``lesson10-<user>``, not a
#: GitHub zip's ``-main``): where one folder holds several, each such folder is a student
_REPOSITORY = re.compile(r"^lesson10[^a-z0-9](?!.*-(main|master)$).+$", re.IGNORECASE)

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


def posix(path) -> str:
    return str(path).replace(os.sep, "/")


def _is_zip(name: str) -> bool:
    return name.lower().endswith(".zip")


@dataclass
class Identities:
    """``keys``: path -> ``(student, where)`` (``where`` tells apart two places that give one
    name); ``handins``: path -> its hand-in (a path as shown, or None); ``notes``: student ->
    sentences of the collisions that concern them; ``root``: the class's folder."""
    keys: dict = field(default_factory=dict)
    handins: dict = field(default_factory=dict)
    notes: dict = field(default_factory=dict)
    root: str = ""

    def note(self, student: str, text: str) -> None:
        if text not in self.notes.setdefault(student, []):
            self.notes[student].append(text)


def resolve(paths, student: str | None = None, student_from: str | None = None,
            roster=None, base: str | None = None, anchors=(), given=()) -> Identities:
    """The students and hand-ins of ``paths`` (see the module). ``anchors``: the zips
    unpacked (where their files stand); ``given``: the paths named on the command line."""
    paths = list(paths)
    if student is not None:
        if not student.strip():
            raise PlanError("--student needs a name")
        tops = sorted(given, key=lambda g: len(os.path.abspath(g)), reverse=True)
        return Identities({p: (student.strip(), "") for p in paths},
                          {p: _given(p, tops) for p in paths})
    if student_from is not None:
        return _from_regex(paths, student_from)
    return _from_folders(paths, roster, base, anchors, given)


def _given(path: Path, tops) -> str | None:
    """The path named on the command line (as given) that holds ``path``, or None."""
    real = os.path.abspath(path)
    return next((posix(t) for t in tops if real == os.path.abspath(t)
                 or real.startswith(os.path.abspath(t) + os.sep)), None)


def _from_regex(paths, student_from: str) -> Identities:
    try:
        rx = re.compile(student_from)
    except re.error as exc:
        raise PlanError(f"--student-from {student_from!r} is not a regular expression: "
                        f"{exc}") from None
    if "student" not in rx.groupindex:
        raise PlanError(f"--student-from {student_from!r} has no group named 'student', "
                        f"e.g. '(?P<student>[^/]+)/'")
    out = Identities()
    for p in paths:
        text = posix(p)
        m = rx.search(text)
        name = safe_text((m.group("student") or "").strip()) if m else ""
        if m is None or not name:
            raise PlanError(f"--student-from {student_from!r} finds no student in {text!r}")
        out.keys[p] = (name, text[:m.end("student")])
        end = text.find("/", m.end("student"))
        out.handins[p] = text if end < 0 else text[:end]
    return out


def _class_root(common: str, raws: dict) -> tuple[str, dict]:
    """The root and each path's folders under it: a zip that is all the batch holds and that
    holds several folders that are no wrappers (a class download) is entered."""
    while raws:
        tops = {r[0] if r else "" for r in raws.values()}
        if len(tops) != 1 or not _is_zip(next(iter(tops))):
            break
        inner = [r[1:] for r in raws.values()]
        if any(not r for r in inner) or all(WRAPPERS.match(r[0]) for r in inner) or \
                len({r[0] for r in inner}) < 2:
            break                                   # one student's zip
        common = os.path.join(common, next(iter(tops)))
        raws = {p: r[1:] for p, r in raws.items()}
    return common, raws


def _from_folders(paths, roster, base, anchors, given) -> Identities:
    folders = {p: os.path.dirname(os.path.abspath(p)) for p in paths}
    ends = list(folders.values()) + [os.path.dirname(os.path.abspath(z)) for z in anchors]
    if not ends:
        return Identities()
    common = os.path.commonpath(ends)
    if base and (common == base or common.startswith(base.rstrip(os.sep) + os.sep)):
        common = base                   # some students of a class graded again
    raws = {p: [] if f == common else list(Path(os.path.relpath(f, common)).parts)
            for p, f in folders.items()}
    root, raws = _class_root(common, raws)
    out = Identities(root=root)
    tops = {r[0] for r in raws.values() if r}
    folder_tops = {t for t in tops if not _is_zip(t)}
    loose = any(not r for r in raws.values())
    named = {os.path.abspath(g) for g in given}
    if len(tops) == 1 and not folder_tops and root not in named and \
            os.path.join(root, next(iter(tops))) not in named:
        loose = True                         # a student's folder with one zip, named above it
    if _one_student(loose, folder_tops, len(tops) - len(folder_tops)):
        name = safe_text(os.path.basename(root))
        name = (name[:-4] if _is_zip(name) else name) or "student"
        out.keys = {p: (name, root) for p in paths}
        out.handins = {p: None for p in paths}
        return out
    classroom = _classroom(raws.values())
    for p, r in raws.items():
        out.keys[p] = _student(r, root, roster, classroom)
    out.keys = _merge_nested(out.keys, root)
    out.handins = {p: safe_text(posix(os.path.relpath(where, root))) if where != root else None
                   for p, (_, where) in out.keys.items()}
    _apart(out)
    _holding_others(out, roster)
    return out


def _one_student(loose: bool, folder_tops: set, zips: int) -> bool:
    """Whether the root is one student's folder: at most one zip, beside loose notebooks or
    one wrapper folder (a class folder holds students' folders and zips)."""
    if zips > 1:
        return False
    if not folder_tops:
        return loose
    top = next(iter(folder_tops))
    return len(folder_tops) == 1 and bool(WRAPPERS.match(top)) and not _REPOSITORY.match(top)


def _classroom(raws) -> bool:
    """Whether a folder of the batch holds several repository-named wrappers (then every
    such folder is a student: GitHub Classroom's repositories, under sections or not)."""
    seen: dict[tuple, set] = {}
    for r in raws:
        for i, part in enumerate(r):
            if _is_zip(part):
                break
            if _REPOSITORY.match(part):
                seen.setdefault(tuple(r[:i]), set()).add(part)
    return any(len(v) > 1 for v in seen.values())


def _student(raw: list[str], root: str, roster, classroom: bool) -> tuple[str, str]:
    """``(student, where)`` of a file in the folders ``raw`` under ``root``."""
    if not raw:
        name = safe_text(os.path.basename(root))
        return (name[:-4] if _is_zip(name) else name) or "student", root
    if _is_zip(raw[0]):                              # a zip of the class: its student
        return _top_name(raw[0][:-4]), os.path.join(root, raw[0])
    n = next((i for i, part in enumerate(raw) if _is_zip(part)), len(raw))
    parts = [safe_text(x) for x in raw[:n]]          # never a folder inside a zip
    if parts:
        parts[0] = _top_name(raw[0])
    if roster:
        names = set(roster)
        for size in range(len(parts), 0, -1):
            for i in range(len(parts) - size + 1):
                if "/".join(parts[i:i + size]) in names:
                    return "/".join(parts[i:i + size]), os.path.join(root, *raw[:i + size])
    depth = next((i for i, part in enumerate(parts) if i and WRAPPERS.match(part)
                  and not (classroom and _REPOSITORY.match(part))), len(parts))
    return "/".join(parts[:depth]), os.path.join(root, *raw[:depth])


def _top_name(name: str) -> str:
    """The student an entry of the class names: a Canvas download's login
    (``smithjane_LATE_12_34_hw`` is smithjane), else the name itself."""
    return safe_text(name.split("_")[0] if CANVAS_NAME.match(name) else name) or name


def _merge_nested(keys: dict, root: str) -> dict:
    """A student folder inside another student's folder is that student's (a download
    unpacked in ``alice/``: ``alice/lesson10/...`` is alice's work, whatever its names)."""
    places = sorted({where for _, where in keys.values() if where != root}, key=len)
    names = {where: name for name, where in keys.values()}
    out = {}
    for p, (name, where) in keys.items():
        outer = next((w for w in places if where.startswith(w + os.sep)), None)
        out[p] = (names[outer], outer) if outer is not None else (name, where)
    return out


def _apart(out: Identities) -> None:
    """Two hand-ins that would be one student: each is the student its path names."""
    wheres: dict[str, set] = {}
    for name, where in out.keys.values():
        wheres.setdefault(name, set()).add(where)
    for name, places in wheres.items():
        if len(places) < 2:
            continue
        shown = {w: safe_text(posix(os.path.relpath(w, out.root))) for w in places}
        if len(set(shown.values())) < len(places):
            continue                                  # cannot be told apart by path
        listed = ", ".join(sorted(shown.values()))
        for p, (who, where) in list(out.keys.items()):
            if who == name:
                out.keys[p] = (shown[where], where)
        text = (f"two hand-ins would be the student {name}: {listed}; neither replaces the "
                f"other: each is graded as the student its path names ({listed}). Tell them "
                f"apart with a roster or --student-from, or rename one")
        for who in [name, *shown.values()]:
            out.note(who, text)


def _holding_others(out: Identities, roster) -> None:
    """A note for each hand-in that holds a folder named after another student."""
    names = {n for n, _ in out.keys.values()} | set(roster or ())
    for p in out.keys:
        who, where = out.keys[p]
        if where == out.root:
            continue
        inside = Path(os.path.relpath(os.path.dirname(os.path.abspath(p)), where)).parts
        for part in inside:
            other = safe_text(part[:-4] if _is_zip(part) else part)
            if other in names and other != who:
                hand = safe_text(posix(os.path.relpath(where, out.root)))
                out.note(who, f"the hand-in {hand} holds a folder named {other}, another "
                              f"student's name: its files are graded as {who}'s")
                out.note(other, f"{who}'s hand-in {hand} holds a folder named {other}: it is "
                                f"graded as {who}'s work, never in place of {other}'s")
