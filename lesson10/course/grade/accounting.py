"""Every file of a submission accounted for: the files under a batch's folders that are
not graded, each with the reason a student reads (``02.ipynb.txt`` is not a notebook file;
a ``.py`` that sits beside no notebook is no helper of one).

A folder named on the command line is searched as :func:`.gradebook.find_notebooks`
searches it (hidden files and folders, checkpoints and ``__MACOSX`` skipped); its notebooks
are graded (or listed as copies not graded), the ``.py`` files beside a graded notebook are
its helper modules, and every other file is listed by :func:`reason` in the report, the
feedback and Gradescope's output.
"""
from __future__ import annotations

import os
from pathlib import Path

from .submission_files import helper_files

#: folders a search never enters (besides hidden ones); the same as for notebooks
SKIP_FOLDERS = {".ipynb_checkpoints", "__MACOSX", "__pycache__", "node_modules", "site-packages"}

#: files nobody needs to be told about (an OS's or an editor's)
NOISE = {"Thumbs.db", "desktop.ini"}


def find_others(paths) -> list[Path]:
    """The files under the folders in ``paths`` that are not ``*.ipynb``, in path order
    (files named on the command line are the grader's, not listed here)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if not p.is_dir():
            continue
        for top, dirs, files in os.walk(p):
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_FOLDERS)
            out += sorted(Path(top) / f for f in files
                          if not f.lower().endswith(".ipynb") and not f.startswith(".")
                          and f not in NOISE)
    seen: set[str] = set()
    unique = []
    for p in out:
        if os.path.abspath(p) not in seen:
            seen.add(os.path.abspath(p))
            unique.append(p)
    return unique


def helpers_of(notebooks) -> set[str]:
    """Absolute paths of the ``.py`` files the grader gives the notebooks as helper modules
    (:func:`lesson10.course.grade.submission_files.helper_files`: beside the notebook, within
    its limits)."""
    out: set[str] = set()
    for folder in {os.path.dirname(os.path.abspath(p)) for p in notebooks}:
        out |= {os.path.join(folder, name) for name, _ in helper_files(Path(folder) / "x.ipynb")}
    return out


def reason(path: Path, notebook_folders: set[str]) -> str:
    """Why ``path`` is not graded, in words a student acts on."""
    name = Path(path).name
    low = name.lower()
    if ".ipynb" in low:
        base = name[:low.index(".ipynb") + len(".ipynb")]
        return (f"not a notebook file: its name ends in {name[len(base):]!r}, not '.ipynb' "
                f"(rename it {base} to have it graded)")
    if low.endswith(".py"):
        if os.path.dirname(os.path.abspath(path)) in notebook_folders:
            return ("a .py file beside the notebook that the grader does not give it (over the "
                    "limit of helper modules: the first 20 .py files of 1 MB or less)")
        return ("a .py file beside no notebook: a notebook's helper modules must sit in the "
                "notebook's own folder, and a .py file is not graded on its own")
    return "not a notebook (.ipynb): only notebooks are graded"


def not_graded(others, notebooks) -> dict[str, str]:
    """``absolute path -> reason`` for every file of ``others`` that is not a helper."""
    helpers = helpers_of(notebooks)
    folders = {os.path.dirname(os.path.abspath(p)) for p in notebooks}
    return {os.path.abspath(p): reason(Path(p), folders) for p in others
            if os.path.abspath(p) not in helpers}
