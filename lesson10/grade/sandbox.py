"""A private, read-only copy of the package for every process that runs student code.

At the grader's start :class:`Package` reads the package's files once (with their
compiled bytecode) into memory and imports, in the judge, every module the checks use,
so nothing the judge runs is read from disk later. Each worker receives the compiled
package over its pipe and imports it from memory (:func:`memory_bootstrap`): no file
that another process could edit. Each notebook kernel (feedback only) gets its own
fresh copy of the snapshot in a temporary folder (files 0444, folders 0555), first on
its ``sys.path``. Both start with ``python -I`` (no ``PYTHONPATH``, no current folder on
the path). A submission that rewrites the package
on disk, wherever it finds it, changes neither the judge nor any later process.
"""
from __future__ import annotations

import compileall
import importlib
import marshal
import os
import pkgutil
import py_compile
import shutil
import signal
import stat
import sys
import tempfile
from pathlib import Path

import lesson10

#: modules the judge imports up front (the checks' references); spmd (torch) is not needed
_JUDGE_MODULES = ("lesson10.checks", "lesson10.sim", "lesson10.layouts", "lesson10.cost")


def import_judge_modules() -> None:
    for name in _JUDGE_MODULES:
        mod = importlib.import_module(name)
        for info in pkgutil.walk_packages(getattr(mod, "__path__", []), prefix=name + "."):
            importlib.import_module(info.name)


class Package:
    """The package as it was when grading started."""

    def __init__(self, source: Path | None = None):
        import_judge_modules()
        self.source = Path(source or Path(lesson10.__file__).parent).resolve()
        self.files: dict[str, bytes] = {}
        self._modules = None
        with tempfile.TemporaryDirectory(prefix="lesson10-snapshot-") as tmp:
            dst = Path(tmp) / "lesson10"
            shutil.copytree(self.source, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            compileall.compile_dir(str(dst), quiet=2, workers=1,
                                   invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
            for path in sorted(dst.rglob("*")):
                if path.is_file():
                    self.files[path.relative_to(dst).as_posix()] = path.read_bytes()

    def modules(self) -> bytes:
        """Every module of the package, compiled, as one ``marshal`` blob for
        :func:`memory_bootstrap`: ``{name: (is_package, file name, marshalled code)}``.
        The file names lie under :data:`MEMORY_ROOT`, which exists on no disk."""
        if self._modules is None:
            mods = {}
            for rel, data in self.files.items():
                if not rel.endswith(".py"):
                    continue
                parts = rel[:-3].split("/")
                is_pkg = parts[-1] == "__init__"
                name = ".".join(["lesson10"] + (parts[:-1] if is_pkg else parts))
                origin = f"{MEMORY_ROOT}/{rel}"
                code = compile(data.decode("utf-8"), origin, "exec", dont_inherit=True)
                mods[name] = (is_pkg, origin, marshal.dumps(code))
            self._modules = marshal.dumps(mods)
        return self._modules

    def copy(self, parent: Path) -> Path:
        """Write a read-only copy under ``parent``; returns the folder to put on sys.path."""
        root = Path(tempfile.mkdtemp(prefix="pkg-", dir=parent))
        for rel, data in self.files.items():
            path = root / "lesson10" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            path.chmod(0o444)
        for folder in sorted((p for p in root.rglob("*") if p.is_dir()), reverse=True):
            folder.chmod(0o555)
        return root


def remove(path: Path) -> None:
    """Remove a copy, read-only folders (and whatever a submission changed) included."""
    def make_writable(func, p, _exc):
        try:
            os.chmod(os.path.dirname(p), 0o755)
            os.chmod(p, stat.S_IWUSR | stat.S_IRUSR | stat.S_IXUSR)
            func(p)
        except OSError:
            pass
    if path.exists():
        for p in [path, *path.rglob("*")]:
            try:
                if p.is_dir() and not p.is_symlink():
                    p.chmod(0o755)
            except OSError:
                pass
        shutil.rmtree(path, onerror=make_writable)


def bootstrap(pkg_root: Path, module: str) -> list[str]:
    """``python -I -c ...`` that imports ``module`` from the copy and runs its ``main``."""
    code = (f"import sys; sys.path.insert(0, {str(pkg_root)!r}); "
            f"import {module} as m; m.main()")
    return [sys.executable, "-I", "-c", code]


TAG_ENV = "LESSON10_GRADE_TAG"


def new_tag() -> str:
    """A random tag for the environment of one notebook's processes (see :func:`reap`)."""
    return os.urandom(12).hex()


def reap(tag: str) -> int:
    """SIGKILL every process still carrying ``tag`` in its environment: what a submission
    left running, including a daemon that left its process group (``setsid``). Linux only
    (``/proc``); returns how many were killed."""
    marker = f"{TAG_ENV}={tag}".encode()
    killed = 0
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return 0
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if marker in env:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    return killed


#: where the worker's in-memory package claims to live (no such folder exists)
MEMORY_ROOT = "/__lesson10_grader__/lesson10"

_MEMORY_BOOT = r"""
import importlib.abc, importlib.util, marshal, os, sys
def _read(fd, n):
    out = b""
    while len(out) < n:
        chunk = os.read(fd, n - len(out))
        if not chunk:
            raise SystemExit(3)
        out += chunk
    return out
_fd = int(sys.argv[1])
_mods = marshal.loads(_read(_fd, int.from_bytes(_read(_fd, 8), "big")))
class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name not in _mods:
            return None
        spec = importlib.util.spec_from_loader(name, self, origin=_mods[name][1],
                                               is_package=_mods[name][0])
        spec.has_location = True
        return spec
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        is_pkg, origin, code = _mods[module.__name__]
        if is_pkg:
            module.__path__ = [os.path.dirname(origin)]
        exec(marshal.loads(code), module.__dict__)
sys.meta_path.insert(0, _Finder())
import lesson10.grade.worker as _w
_w.main()
"""


def memory_bootstrap() -> list[str]:
    """``python -I -c ...`` that first reads the package (:meth:`Package.modules`, an
    8-byte length then the blob) from the pipe named by its first argument, imports
    ``lesson10`` from that (nothing from disk that a submission could have edited) and
    runs the worker."""
    return [sys.executable, "-I", "-c", _MEMORY_BOOT]


def child_env(extra: dict | None = None) -> dict:
    """The environment of a process that runs student code: no grade file, one BLAS thread."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("LESSON10_GRADE_FILE", "PYTHONPATH", "PYTHONSTARTUP")}
    env.update({"MPLBACKEND": "Agg", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYDEVD_DISABLE_FILE_VALIDATION": "1"})
    env.update(extra or {})
    return env
