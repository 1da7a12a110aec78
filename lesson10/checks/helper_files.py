"""Which of a student's own ``.py`` files reach the grader: one rule for the check cell and
the grader.

The grader copies into a notebook's sandbox the helper modules that stand *beside* the
notebook: regular ``*.py`` files (no link, no folder, nothing starting with ``.``), at most
:data:`MAX_HELPERS` of them, each at most :data:`MAX_HELPER_BYTES`
(:mod:`lesson10.course.grade.submission_files` applies it to a hand-in). A function that
lives anywhere else (a package folder ``utils/``, a file one folder up, a path added to
``sys.path``) is not there when the grader runs the notebook, so the check cell says so
first, in the grader's words (:func:`reaches_grader`)::

    >>> note("utils/ops.py", "it is in a folder")
    'your helper file utils/ops.py was not copied into the sandbox: it is in a folder'
"""
from __future__ import annotations

import os
import stat

__all__ = ["MAX_HELPERS", "MAX_HELPER_BYTES", "note", "is_candidate", "too_many", "refusal",
           "reaches_grader"]

#: helper modules one notebook's working folder gets, and the size of each
MAX_HELPERS, MAX_HELPER_BYTES = 20, 1_000_000

#: the sentence of a helper file the grader does not copy (its feedback and the check cell)
NOTE = "your helper file {name} was not copied into the sandbox: {why}"
LINK = "it is a symbolic link: hand in the file itself"
NOT_REGULAR = "it is not a regular file"
OVER = "it is over {limit:,} bytes"
IN_FOLDER = "only the .py files beside the notebook are copied, not folders: move it next to the notebook"
ELSEWHERE = "it is not beside the notebook: copy it into the notebook's folder"


def note(name: str, why: str) -> str:
    """The one sentence for a helper file ``name`` that is not copied, because ``why``."""
    return NOTE.format(name=name, why=why)


def is_candidate(name: str) -> bool:
    """Whether a file name beside a notebook is a helper module the grader looks at."""
    return name.endswith(".py") and not name.startswith(".")


def too_many(name: str) -> str:
    return f"more than {MAX_HELPERS} helper files beside the notebook: {name} and the ones " \
           f"after it were not copied"


def refusal(path: str) -> str | None:
    """Why the grader does not copy the file at ``path`` on its own (a link, not a regular
    file, too large), or None."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None                   # gone since: the grader's own run will say what it finds
    if stat.S_ISLNK(st.st_mode):
        return LINK
    if not stat.S_ISREG(st.st_mode):
        return NOT_REGULAR
    if st.st_size > MAX_HELPER_BYTES:
        return OVER.format(limit=MAX_HELPER_BYTES)
    return None


def reaches_grader(path: str, folder: str) -> str | None:
    """None when the file at ``path`` (where a function of the student's is defined) is a
    helper module the grader copies for a notebook in ``folder``; else the sentence that
    says why not (:func:`note`). The grader's order: the candidates by name, each refused
    on its own or copied, until :data:`MAX_HELPERS` are copied."""
    path, folder = os.path.abspath(path), os.path.abspath(folder)
    rel = os.path.relpath(path, folder)
    name = os.path.basename(path)
    if os.path.dirname(rel):
        inside = not rel.startswith(os.pardir + os.sep)
        return note(rel.replace(os.sep, "/") if inside else path, IN_FOLDER if inside else ELSEWHERE)
    if not is_candidate(name):
        return note(name, "only the .py files beside the notebook are copied")
    try:
        candidates = sorted(n for n in os.listdir(folder) if is_candidate(n))
    except OSError:
        return None
    copied = 0
    for other in candidates:
        if copied >= MAX_HELPERS:
            return too_many(other)
        why = refusal(os.path.join(folder, other))
        if other == name:
            return None if why is None else note(name, why)
        copied += why is None
    return None
