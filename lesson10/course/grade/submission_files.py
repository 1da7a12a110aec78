"""A submission's own files, read as regular files: the notebook and its helper modules.

Nothing is read through a link. A symbolic link, a folder, a device or a pipe where a
student's file should be is refused, with a note that says so; a file is opened with
``O_NOFOLLOW`` inside its folder and checked to be the same regular file that was listed
(so a link swapped in between is refused too).

**Helper modules** are the ``*.py`` files beside the student's notebook. In a folder that
holds several students' notebooks (a flat download graded with ``--student-from``), a
helper is a student's only when its name says so: the ``--student-from`` pattern finds
that student in the helper's path (``alice_03_helper.py``), or the file name starts with
the student's name and a separator (``alice_helper.py``, ``alice-utils.py``; the longest
name wins). A helper whose pattern match ends inside its file name is also copied under
the rest of that name (``alice_4711_helper.py`` as ``helper.py`` too), the module the
student's notebook imports. Files that are nobody's are not copied into any sandbox.
"""
from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...checks import helper_files as rule
from ...checks.helper_files import MAX_HELPER_BYTES, MAX_HELPERS
from ...errors import Lesson10Error

#: (the limits and sentences are the check cell's too: :mod:`lesson10.checks.helper_files`)
_MODULE_FILE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\.py")
_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) \
    | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)


class FileRefused(Lesson10Error, OSError):
    """The file is not a regular file of the student's folder (the message says why)."""


@dataclass
class Helpers:
    """The helper modules of one notebook: ``files`` go into its working folder,
    ``notes`` (why a file was not copied) into its feedback."""
    files: list[tuple[str, str]] = field(default_factory=list)     # (name, text)
    notes: list[str] = field(default_factory=list)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        """The ``(name, text)`` pairs, as the plain list of them once was."""
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)


def read_regular(path: Path, limit: int | None = None, *, dir_fd: int | None = None) -> bytes:
    """The bytes of the regular file ``path``, never through a link. :class:`FileRefused` for a
    link or anything but a regular file (or over ``limit`` bytes), OSError if unreadable."""
    name = os.fspath(path) if dir_fd is None else os.path.basename(os.fspath(path))
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        raise FileRefused(rule.LINK)
    if not stat.S_ISREG(st.st_mode):
        raise FileRefused(rule.NOT_REGULAR)
    if limit is not None and st.st_size > limit:
        raise FileRefused(rule.OVER.format(limit=limit))
    fd = os.open(name, _FLAGS, dir_fd=dir_fd)
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise FileRefused("it changed while it was read")
        chunks, size = [], 0
        while limit is None or size <= limit:
            chunk = os.read(fd, 1 << 20 if limit is None else min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if limit is not None and size > limit:
        raise FileRefused(rule.OVER.format(limit=limit))
    return b"".join(chunks)


def _posix(path: Path) -> str:
    return str(path).replace(os.sep, "/")


def owner(helper: Path, students: Sequence[str], student_from: str | None = None
          ) -> tuple[str | None, str | None]:
    """``(student, other name)`` of a helper file in a folder shared by ``students``: whose
    it is by its name (module docstring), or None; and the name it is also copied as."""
    if student_from:
        m = re.search(student_from, _posix(helper))
        who = (m.group("student") or "").strip() if m and "student" in m.re.groupindex else ""
        if m and who in students:
            rest = _posix(helper)[m.end():]
            return who, rest if _MODULE_FILE.fullmatch(rest) and rest != helper.name else None
    name, best = helper.name.casefold(), None
    for who in students:
        key = who.casefold()
        if key and name.startswith(key) and name[len(key):len(key) + 1] in ("_", "-", ".", " ") \
                and (best is None or len(who) > len(best)):
            best = who
    return best, None


def _candidates(dir_fd: int) -> list[str]:
    return sorted(n for n in os.listdir(dir_fd) if rule.is_candidate(n))


def helper_files(notebook: Path, *, student: str | None = None, sharing: Sequence[str] = (),
                 student_from: str | None = None) -> Helpers:
    """The helper modules of the notebook at ``notebook``: the ``*.py`` files beside it that
    are the student's own (``sharing``: every student with a notebook in that folder; more
    than one, and only files named after ``student`` are theirs), read as regular files."""
    folder = Path(notebook).parent
    out = Helpers()
    names = sorted(set(sharing) | {student}) if student is not None else []
    try:
        dir_fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return out
    try:
        for name in _candidates(dir_fd):
            alias = None
            if len(names) > 1:                     # a folder shared by several students
                who, alias = owner(folder / name, names, student_from)
                if who != student:
                    continue
            if len(out.files) >= MAX_HELPERS:
                out.notes.append(rule.too_many(name))
                break
            try:
                text = read_regular(folder / name, MAX_HELPER_BYTES, dir_fd=dir_fd).decode(
                    "utf-8", errors="replace")
            except OSError as exc:
                why = str(exc) if isinstance(exc, FileRefused) else f"it cannot be read ({exc.strerror})"
                out.notes.append(rule.note(name, why))
                continue
            out.files.append((name, text))
            if alias and alias not in {n for n, _ in out.files}:
                out.files.append((alias, text))
    finally:
        os.close(dir_fd)
    return out


def is_link(path: Path) -> bool:
    """Whether ``path`` is a symbolic link (never read, never graded beside a real file)."""
    try:
        return stat.S_ISLNK(os.stat(path, follow_symlinks=False).st_mode)
    except (OSError, ValueError):
        return False


def links_beside_files(items, groups: dict, rank) -> dict:
    """``{path of a link: the item graded instead}`` for every symbolic link in ``items``
    that stands beside a real file of the same student and notebook (``groups``: (student,
    notebook) -> the readable items; ``rank``: the copy rule's sort key). Such a link is
    named among the copies not graded and skipped: it never becomes the student's notebook,
    whatever it points to. A link alone stays in the plan (its report says it is refused)."""
    out = {}
    for it in items:
        real = groups.get((it.student, it.notebook))
        if it.notebook is not None and real and it not in real and is_link(it.path):
            out[it.path] = min(real, key=rank)
    return out
