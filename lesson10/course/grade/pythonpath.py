"""What of the grader's own Python the sandbox shows: every folder of its ``sys.path``
(what ``.pth`` files added, ``PYTHONPATH``, the user site), bound read-only, but the course's
own checkout; and what the runner is told of it (its path, the modules it must find).

A folder that cannot be shown raises :class:`Unbindable` (the probe then refuses, saying
why); so does one that holds the folder the grader runs in (it would show the submissions).
"""
from __future__ import annotations

import json
import os
import site
import sys
import sysconfig
from pathlib import Path

import lesson10

MOUNT = "/opt/lesson10"        # where the sandbox shows the stand-in folder

#: modules the runner and the course's notebooks need: where the grader can import one and
#: the sandbox cannot, the grader refuses to start (a sandbox without matplotlib would judge
#: nothing, and say "ok")
NEEDS = ("numpy", "IPython", "matplotlib")
#: places inside the sandbox that a folder of the grader's Python cannot be bound onto
_RESERVED = ("/proc", "/dev", "/sys", MOUNT)


class Unbindable(Exception):
    """A folder of the grader's Python cannot be shown inside the sandbox (says why)."""


def _under(p: str, roots) -> bool:
    return any(p == r or p.startswith(r.rstrip("/") + "/") for r in roots)


def _course_checkouts(entries) -> list[str]:
    """Folders holding a real ``lesson10`` package that are not site-packages folders (a
    checkout, an editable install's source, a PYTHONPATH copy): never bound, nor anything
    under them but a Python's own prefix (a checkout's venv): they hold the course's source,
    its solutions and its tests."""
    sites = set(_site_folders())
    roots = {str(Path(lesson10.__file__).resolve().parent.parent)}
    roots |= {os.path.realpath(p) for p in entries
              if p and os.path.isfile(os.path.join(p, "lesson10", "__init__.py"))}
    return sorted(r for r in roots if r not in sites)


def _site_folders() -> list[str]:
    out = []
    try:
        out += site.getsitepackages()
    except AttributeError:
        pass
    try:
        out.append(site.getusersitepackages())
    except AttributeError:
        pass
    return [os.path.realpath(p) for p in out if p]


def grader_path() -> list[str]:
    """The entries of this process's ``sys.path`` the runner gets (in order): every one
    (what ``.pth`` files added, ``PYTHONPATH``, the user site included) but the script's or
    working folder that Python put first (it may hold the submissions) and the course's
    course's own source (see :func:`_course_checkouts`)."""
    entries = list(sys.path)
    script = os.path.dirname(os.path.realpath(sys.argv[0])) if sys.argv and sys.argv[0] and \
        os.path.isfile(sys.argv[0]) else None
    if entries and script and os.path.realpath(entries[0] or ".") == script:
        entries = entries[1:]                    # the script's folder (the working folder: below)
    cwd, checkouts = os.getcwd(), _course_checkouts(entries)
    prefixes = [os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)]
    out = []
    for p in entries:
        if not p or not os.path.exists(p):
            continue
        real = os.path.realpath(p)
        if real == os.path.realpath(cwd):
            continue
        if _under(real, checkouts) and not _under(real, prefixes):
            continue
        out.append(os.path.abspath(p))
    return list(dict.fromkeys(out))


def python_paths() -> list[str]:
    """Folders this Python needs, bound read-only into the sandbox: its prefixes and every
    folder of :func:`grader_path` (realpaths; a path through a symlink is bound at its
    own name too, see :func:`python_binds`)."""
    return sorted({src for src, _ in python_binds()})


def python_binds() -> list[tuple[str, str]]:
    """``(source, destination)`` of each read-only bind that makes the grader's Python whole
    inside; raises :class:`Unbindable` for a folder that cannot be bound."""
    cwd = os.path.realpath(os.getcwd())
    wanted = [sys.prefix, sys.base_prefix, sys.exec_prefix,
              os.path.dirname(os.path.realpath(sys.executable))]
    wanted += [sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib", "purelib",
                                                           "platlib")]
    system = ["/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"]
    pairs: list[tuple[str, str]] = []
    for p in [w for w in wanted if w and os.path.exists(w)] + grader_path():
        real, name = os.path.realpath(p), os.path.abspath(p)
        for dest in dict.fromkeys([real, name]):
            if dest == "/" or _under(dest, _RESERVED):
                raise Unbindable(f"{p} is on the grader's sys.path, but {dest} cannot be shown "
                                 f"inside the sandbox (a reserved place)")
            if _under(cwd, [dest]) and dest not in (os.path.realpath(q) for q in wanted):
                raise Unbindable(f"{p} is on the grader's sys.path and holds the folder the "
                                 f"grader runs in ({cwd}): shown inside the sandbox it would "
                                 f"show the submissions too; grade from another folder or take "
                                 f"{p} off PYTHONPATH")
            pairs.append((real, dest))
    out: list[tuple[str, str]] = []
    for src, dest in sorted(dict.fromkeys(pairs), key=lambda x: (len(x[1]), x[1])):
        if not _under(dest, system + [d for _, d in out]):
            out.append((src, dest))
    return out


def needs() -> list[str]:
    """The modules of :data:`NEEDS` this Python can import (found, not imported)."""
    import importlib.util
    return [m for m in NEEDS if importlib.util.find_spec(m) is not None]


def runner_config() -> str:
    """The runner's last argument (JSON): this Python's path (:func:`grader_path`) and the
    modules it must find (:func:`needs`)."""
    return json.dumps({"path": grader_path(), "needs": needs()})
