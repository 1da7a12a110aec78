"""Which of a student's own ``.py`` files reach the grader: one rule for the check cell and
the grader.

**The student's own files** (:func:`is_own`) are the code files in the notebook's folder
tree (the kernel's working folder and the folders under it) that no library folder holds:
not the interpreter's prefixes or standard library, no site directory (site-packages,
dist-packages, the user site), no ``PYTHONPATH`` entry, no folder a ``.pth`` file of a site
directory adds, and no installed distribution (its recorded files, an editable install's
source folder). A library folder that holds the notebook's folder itself (``PYTHONPATH=.``,
an editable install of the project the notebook is in) is the student's working folder, not
a library. So numpy is never the student's, wherever it is installed (a stacked environment,
``PYTHONPATH``, ``pip install --user``, Colab's dist-packages).

The grader copies into a notebook's sandbox the helper modules that stand *beside* the
notebook: regular ``*.py`` files (no link, no folder, nothing starting with ``.``), at most
:data:`MAX_HELPERS` of them, each at most :data:`MAX_HELPER_BYTES`
(:mod:`lesson10.course.grade.submission_files` applies it to a hand-in). A function of the
student's own in a package folder (``utils/ops.py``) is not there when the grader runs the
notebook, so the check cell says so first, in the grader's words (:func:`reaches_grader`)::

    >>> note("utils/ops.py", "it is in a folder")
    'your helper file utils/ops.py was not copied into the sandbox: it is in a folder'
"""
from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import site
import stat
import sys
import sysconfig
from urllib.parse import unquote, urlparse

__all__ = ["MAX_HELPERS", "MAX_HELPER_BYTES", "note", "is_candidate", "too_many", "refusal",
           "reaches_grader", "is_own", "library_folders"]

#: helper modules one notebook's working folder gets, and the size of each
MAX_HELPERS, MAX_HELPER_BYTES = 20, 1_000_000

#: the sentence of a helper file the grader does not copy (its feedback and the check cell)
NOTE = "your helper file {name} was not copied into the sandbox: {why}"
LINK = "it is a symbolic link: hand in the file itself"
NOT_REGULAR = "it is not a regular file"
OVER = "it is over {limit:,} bytes"
IN_FOLDER = "only the .py files beside the notebook are copied, not folders: move it next to the notebook"


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


def _under(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or inside it (both absolute; case as the system sees it)."""
    path, folder = os.path.normcase(path), os.path.normcase(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _pth_folders(site_dir: str) -> list[str]:
    """The folders the ``.pth`` files of ``site_dir`` add to ``sys.path`` (as :mod:`site`
    reads them: a line is a folder relative to ``site_dir``, but ``#`` and ``import`` lines)."""
    try:
        names = sorted(n for n in os.listdir(site_dir) if n.endswith(".pth"))
    except OSError:
        return []
    out = []
    for name in names:
        try:
            with open(os.path.join(site_dir, name), encoding="utf-8", errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        out += [os.path.join(site_dir, line.rstrip()) for line in lines
                if line.strip() and not line.startswith(("#", "import ", "import\t"))]
    return out


@functools.cache
def library_folders() -> tuple[str, ...]:
    """The folders whose files are libraries', absolute and resolved: the interpreter's
    prefixes and standard library, every site directory (its own, the user site, each
    ``sys.path`` entry named site-packages or dist-packages), ``PYTHONPATH``'s entries and the
    folders the site directories' ``.pth`` files add."""
    paths = sysconfig.get_paths()
    sites = set(site.getsitepackages() if hasattr(site, "getsitepackages") else []) | {
        paths.get("purelib"), paths.get("platlib"), getattr(site, "getusersitepackages", str)()} | {
        p for p in sys.path if os.path.basename(os.path.normpath(p or ".")) in ("site-packages", "dist-packages")}
    found = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, paths.get("stdlib"),
             paths.get("platstdlib"), *os.environ.get("PYTHONPATH", "").split(os.pathsep)} | sites
    found |= {extra for s in sites if s for extra in _pth_folders(s)}
    return tuple(sorted({f(p) for p in found if p for f in (os.path.abspath, os.path.realpath)}))


def _editable_folder(dist) -> str | None:
    """The source folder of an editable install (its ``direct_url.json``), or None."""
    try:
        info = json.loads(dist.read_text("direct_url.json") or "{}")
    except (OSError, ValueError):
        return None
    url = urlparse(str(info.get("url", ""))) if isinstance(info, dict) else None
    if url is None or url.scheme != "file" or not (info.get("dir_info") or {}).get("editable"):
        return None
    return os.path.abspath(unquote(url.path))


@functools.lru_cache(maxsize=8)
def _distributed(search: tuple[str, ...]) -> tuple[tuple[str, frozenset[str] | None], ...]:
    """``(folder, files)`` of each distribution found on ``search`` (``sys.path``) that a
    library folder does not hold already: where it is installed and the files it records;
    an editable install's source folder with None (every file in it)."""
    libraries = library_folders()
    out: list[tuple[str, frozenset[str] | None]] = []
    for dist in importlib.metadata.distributions(path=list(search)):
        editable = _editable_folder(dist)
        if editable is not None:
            out.append((editable, None))
        base = os.path.abspath(str(dist.locate_file("")))
        if dist.files and not any(_under(base, lib) for lib in libraries):
            out.append((base, frozenset(os.path.abspath(str(dist.locate_file(f))) for f in dist.files)))
    return tuple(out)


def is_own(path: str, folder: str) -> bool:
    """Whether the code file at ``path`` is the student's own for a notebook in ``folder``:
    in ``folder``'s tree, and held by no library folder (:func:`library_folders`) and no
    installed distribution, but those that hold ``folder`` itself (module docstring)."""
    path, folder = os.path.abspath(path), os.path.abspath(folder)
    if not _under(path, folder):
        return False
    seen = (path, os.path.realpath(path))
    if any(_under(p, lib) for lib in library_folders() if not _under(folder, lib) for p in seen):
        return False
    return not any(any(_under(p, base) for p in seen) if files is None else files.intersection(seen)
                   for base, files in _distributed(tuple(sys.path)) if not _under(folder, base))


def reaches_grader(path: str, folder: str) -> str | None:
    """None when the file at ``path`` (where a function of the student's is defined) is a
    helper module the grader copies for a notebook in ``folder``, or is not the student's
    own (:func:`is_own`: a library's, or outside the notebook's folder); else the sentence
    that says why not (:func:`note`). The grader's order: the candidates by name, each
    refused on its own or copied, until :data:`MAX_HELPERS` are copied."""
    if not is_own(path, folder):
        return None
    path, folder = os.path.abspath(path), os.path.abspath(folder)
    rel = os.path.relpath(path, folder)
    name = os.path.basename(path)
    if os.path.dirname(rel):
        return note(rel.replace(os.sep, "/"), IN_FOLDER)
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
