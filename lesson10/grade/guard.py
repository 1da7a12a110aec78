"""The reference guard, inside the worker: did the student's function run course code?

While the judge calls an exercise, a profile function (``sys.setprofile`` and
``threading.setprofile``) sees every Python call. A call whose *code object* comes from
the course package (``lesson10.sim``, ``layouts``, ``cost``, ``checks``, ... anything in
the package but the grader itself and the ``checks.fallback`` wrapper) is a violation,
whatever name, alias, wrapper, lambda or ``try/except`` led to it. Code objects are
recognised by the file they were compiled from (the package the worker imported from
memory, or the installed package), and by a fingerprint of their bytecode, names and
constants, so a copy of a reference function's code object made with
``types.FunctionType`` or ``code.replace(co_filename=...)``, or the reference's source
compiled under another file name, is caught too.

Some exercises may use a course function (Ulysses attention calls the reference
``attention`` per head group): those entry points are allowed for that exercise, and
everything they call is allowed until they return.

Tampering is a violation too: calling ``sys.setprofile`` / ``settrace`` / ``getprofile``,
starting a thread or a process, or reading frames or the garbage collector's objects
(where the worker keeps its state) while being judged (an audit hook blocks those that
raise audit events), or leaving another profile function installed. The worker also
checks, before each call, that no cell patched the grader's code (:mod:`.worker`).
"""
from __future__ import annotations

import hashlib
import os
import sys
import threading
import _thread

_MIN_FINGERPRINT = 60          # bytecode shorter than this is too generic to fingerprint
_AUDIT_BLOCKED = ("sys.setprofile", "sys.settrace", "subprocess.Popen", "os.fork", "os.forkpty",
                  "os.posix_spawn", "os.spawn", "os.exec", "os.system", "pty.spawn",
                  # reading the worker's frames or objects (where the grader keeps its state)
                  "sys._getframe", "sys._current_frames", "gc.get_objects", "gc.get_referrers",
                  "gc.get_referents", "ctypes.")
_FRAME_ATTRS = ("tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back")


def fingerprint(code) -> str:
    consts = tuple(repr(c) for c in code.co_consts if not hasattr(c, "co_code"))
    data = repr((code.co_code, code.co_names, code.co_varnames, consts)).encode()
    return hashlib.sha1(data).hexdigest()


def _fingerprinted(code) -> bool:
    """Named functions of some length: comprehensions, lambdas and one-liners are too
    generic (a student's ``[x.copy() for x in xs]`` is the course's too)."""
    return not code.co_name.startswith("<") and len(code.co_code) >= _MIN_FINGERPRINT


def walk_code(code):
    """``code`` and every code object nested in it."""
    yield code
    for c in code.co_consts:
        if hasattr(c, "co_code"):
            yield from walk_code(c)


def _exempt(rel: str, code) -> bool:
    """Package code that is not a reference: the grader itself, a module body (an import),
    a lazy import, and the ``checks.fallback`` wrapper (it runs the student's function)."""
    qual = getattr(code, "co_qualname", code.co_name)
    return (rel.startswith("grade/") or code.co_name == "<module>"
            or (rel.endswith("__init__.py") and code.co_name in ("__getattr__", "__dir__"))
            or (rel == "checks/core.py" and qual.startswith("fallback")))


def reference_fingerprints(package_dir: str) -> list[str]:
    """Fingerprints of every function in the package (but the grader's own files)."""
    out = set()
    for root, dirs, files in os.walk(package_dir):
        dirs[:] = [d for d in dirs if d not in ("__pycache__", "grade")]
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(root, name)
            try:
                with open(path, encoding="utf-8") as f:
                    top = compile(f.read(), path, "exec")
            except (OSError, SyntaxError, ValueError):
                continue
            rel = os.path.relpath(path, package_dir).replace(os.sep, "/")
            for code in walk_code(top):
                if _fingerprinted(code) and not _exempt(rel, code):
                    out.add(fingerprint(code))
    return sorted(out)


class Guard:
    """Watches one judged call at a time; :attr:`violation` says what went wrong."""

    def __init__(self, roots: list[str], fingerprints: list[str]):
        self.roots = tuple(os.path.realpath(r) + os.sep for r in roots if r)
        self.prints = frozenset(fingerprints)
        self._kind: dict = {}          # code object -> None (student) | reference name
        self._keep: list = []          # keeps the cached code objects alive (stable ids)
        self.allowed: set[str] = set()
        self.violation: str | None = None
        self.active = False
        self._inside = None            # frame of an allowed entry point being run
        banned_c = {sys.setprofile, sys.settrace, sys.getprofile, sys.gettrace,
                          _thread.start_new_thread, threading.settrace, threading.setprofile}
        for name in ("start_joinable_thread", "start_new"):
            if hasattr(_thread, name):
                banned_c.add(getattr(_thread, name))
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "execv", "execve"):
            if hasattr(os, name):
                banned_c.add(getattr(os, name))
        self._banned_c = frozenset(banned_c)
        self._banned_code = frozenset({threading.settrace.__code__, threading.setprofile.__code__,
                                       threading.Thread.start.__code__})
        sys.addaudithook(self._audit)

    # ----------------------------------------------------------------- classification
    def _classify(self, code):
        kind = self._kind.get(code, False)
        if kind is not False:
            return kind
        name = None
        path = code.co_filename
        for root in self.roots:
            if path.startswith(root):
                rel = path[len(root):].replace(os.sep, "/")
                if not _exempt(rel, code):
                    qual = getattr(code, "co_qualname", code.co_name)
                    name = "lesson10." + rel[:-3].replace("/", ".").replace(".__init__", "") + \
                        "." + qual
                break
        # wherever it claims to come from (a copy, compiled under another file name)
        if name is None and _fingerprinted(code) and fingerprint(code) in self.prints:
            name = f"a copy of the course's {code.co_name}"
        self._kind[code] = name
        self._keep.append(code)
        return name

    def reference_name(self, fn) -> str | None:
        code = getattr(fn, "__code__", None)
        return self._classify(code) if code is not None else None

    # ----------------------------------------------------------------- the profile
    def _flag(self, what: str) -> None:
        if self.violation is None:
            self.violation = what

    def _profile(self, frame, event, arg):
        if not self.active:
            return
        if event == "call":
            if self._inside is not None:
                return
            code = frame.f_code
            if code in self._banned_code:
                self._flag("starts a thread or changes the grader's profiler while being judged")
                return
            name = self._classify(code)
            if name is not None:
                short = name.split("<locals>")[0].rstrip(".")
                if short in self.allowed or name in self.allowed:
                    self._inside = frame
                else:
                    self._flag(f"calls the course's reference implementation ({name})")
        elif event == "return":
            if frame is self._inside:
                self._inside = None
        elif event == "c_call":
            if self._inside is None and arg in self._banned_c:
                self._flag(f"calls {getattr(arg, '__name__', arg)} while being judged (it would "
                           f"switch off or escape the grader's reference guard)")

    def _audit(self, event, args):
        if not self.active:
            return
        if event.startswith(_AUDIT_BLOCKED) or (event == "object.__getattr__" and len(args) > 1
                                                  and args[1] in _FRAME_ATTRS):
            self._flag(f"calls {event} while being judged (it would switch off or escape the "
                       f"grader's reference guard)")
            raise RuntimeError(f"{event} is not allowed while the grader calls your function")

    # ----------------------------------------------------------------- one call
    def start(self, allowed) -> None:
        self.allowed = frozenset(allowed)
        self.violation = None
        self._kind, self._keep = {}, []      # a fresh cache: nothing a cell put there counts
        self._inside = None
        # a trace function left by a cell would run unwatched (tracing pauses the profiler)
        sys.settrace(None)
        threading.settrace(None)
        threading.setprofile(self._profile)
        sys.setprofile(self._profile)
        self.active = True

    def stop(self) -> str | None:
        """Switch off; the violation of this call, if any."""
        self.active = False
        current = sys.getprofile()
        sys.setprofile(None)
        threading.setprofile(None)
        if current is None or getattr(current, "__func__", None) is not Guard._profile or \
                getattr(current, "__self__", None) is not self:
            self._flag("removed or replaced the grader's profiler while being judged")
        return self.violation
