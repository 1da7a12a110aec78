"""What an exercise may not call of the course's code, one rule for the check cell and the grader.

:data:`WITHHELD` lists, per course notebook, the course functions an exercise of that
notebook may not use (its references, and whatever computes one of them in a line or
two), gathered from the exercise records (``withholds``, written where the exercise is
registered); :func:`use_instead` says what to write instead (the record's
``use_instead``). The grader's sandbox withholds those functions
(:mod:`lesson10.course.grade.withheld`: while an exercise is judged there, each stand-in
raises ``NotAvailable`` with :func:`refusal`'s sentence). In
Jupyter, :func:`guard` gives the check cell the same rule: while a check runs the
student's function, each withheld function of that notebook refuses to be called from the
student's code (directly, or through other course code the student called), with the same
sentence; the check's own code (its references, what it serves) calls them as usual.

The sandbox ships only :data:`REAL` as course code; every other module of the package
(``spmd``, ``figures``, ``runs``, ``bench``, ``course``, the checks themselves) is a stub
there that refuses any call while an exercise is judged. The guard refuses the student's
calls into those modules too (a profile hook sees each call), but for what a check
serves (:data:`SERVED`). The student's code is a notebook cell's, or a file of the
student's own: in the notebook's folder tree and no library's (:func:`.helper_files.is_own`:
numpy is a library wherever it is installed). In a Jupyter kernel the guard notes every
such file the check ran: one that the grader would not copy beside the notebook (a package
folder, a link, too large: :mod:`.helper_files`) fails the check with the grader's sentence.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import os
import sys
import tempfile
import threading
import types
from collections.abc import Mapping
from typing import Any

from ..errors import Lesson10Error
from .exercises import EXERCISES
from .helper_files import is_own, reaches_grader

__all__ = ["WITHHELD", "REAL", "SERVED", "NotAvailable", "guard", "refusal",
           "use_instead", "is_real"]

#: the modules (paths under lesson10/) the grader's sandbox ships as real code (less what
#: :data:`WITHHELD` names); every other module is a stub there
REAL = ("layouts.py", "cost.py", "topology.py", "rules.py", "sim/")

#: the check modules whose objects a check hands to the student's function (a ring network,
#: a served kernel or op): the student calls them; in the sandbox they are the wire's
SERVED = ("checks/network.py", "checks/served_attention.py", "checks/served_ring.py",
          "checks/served_sp.py", "checks/returns.py")

#: check modules the sandbox has real code of too (its ``_standin``): this guard, and
#: ``checks.fallback`` that a later exercise may call
_SANDBOX_TOO = ("checks/refused.py", "checks/feedback.py")


def is_real(rel: str) -> bool:
    """Whether the module at ``rel`` (a path under lesson10/) is shipped as real code."""
    return any(rel == r or (r.endswith("/") and rel.startswith(r)) for r in REAL)

class _Withheld(Mapping):
    """notebook -> {qualified name as defined: the student's function, "adapter:NAME" or
    None}: the ``withholds`` of the notebook's exercise records, gathered (read when used,
    so it holds every exercise registered by then; the right-hand side is what stands in
    for the name in the grader's display-only cells)."""

    def _table(self) -> dict[str, dict[str, str | None]]:
        out: dict[str, dict[str, str | None]] = {}
        for ex in EXERCISES.values():
            out.setdefault(ex.notebook, {}).update(ex.withholds)
        return out

    def __getitem__(self, notebook: str) -> dict[str, str | None]:
        return self._table()[notebook]

    def __iter__(self):
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


#: notebook -> what its exercises may not call (their records' ``withholds``)
WITHHELD: Mapping[str, dict[str, str | None]] = _Withheld()

#: the sentence of a refusal, in the check cell and in the sandbox (which gets this text)
REFUSAL = "exercise {exercise} may not call {name}; {instead}"


class NotAvailable(Lesson10Error, RuntimeError):
    """A course function an exercise may not use was called while its check ran."""


def use_instead(exercise_id: str) -> str:
    """What the exercise's record says to write instead of the course's code."""
    ex = EXERCISES.get(exercise_id)
    return (ex.use_instead if ex is not None else "") or \
        "write it with NumPy and the functions you wrote"


def refusal(exercise: str, name: str, instead: str | None = None) -> str:
    """The sentence both paths say when ``exercise`` calls the withheld ``name``."""
    return REFUSAL.format(exercise=exercise, name=name,
                          instead=use_instead(exercise) if instead is None else instead)


# --------------------------------------------------------------------------- the check cell
_HERE = os.path.dirname(os.path.abspath(__file__))            # lesson10/checks
_COURSE = os.path.dirname(_HERE)                              # lesson10
_KEY = "__lesson10_refused__"
_LOCK = threading.RLock()
_ACTIVE: dict[int, tuple] = {}        # id(function) -> (function, copy, code, defaults, kwdefaults)
_NAMES: dict[int, str] = {}           # id(function) -> its public name
_JUDGING: list[str] = []              # the exercises whose check runs now (innermost last)


def _who(filename: str) -> str:
    """``"check"``, ``"course"``, ``"library"`` or ``"student"``: whose code a frame runs (the
    student's: a cell, or a file of the student's own, :func:`.helper_files.is_own`)."""
    return _whose(filename, os.getcwd())


@functools.lru_cache(maxsize=4096)
def _whose(filename: str, folder: str) -> str:
    if filename.startswith(("<frozen", "<string>", "<lesson10")):
        return "library"
    path = os.path.abspath(filename) if not filename.startswith("<") else filename
    if path.startswith(_HERE + os.sep) and os.path.basename(path) != "feedback.py":
        return "check"              # feedback's fallback runs what the student hands it
    if path.startswith(_COURSE + os.sep):
        return "course"
    return "student" if _is_cell(path) or is_own(path, folder) else "library"


def _from_student(frame) -> bool:
    """Whether the call whose caller is ``frame`` comes from the student's code: the first
    frame outwards that is neither course code nor a library decides. A course module being
    imported on the way out (its ``<module>`` code) is no call of the student's: the sandbox
    has a module of that name to import too."""
    while frame is not None:
        who = _who(frame.f_code.co_filename)
        if who in ("check", "student"):
            return who == "student"
        if who == "course" and frame.f_code.co_name == "<module>":
            return False
        frame = frame.f_back
    return False


def _dispatch(key: int, args, kwargs):
    entry, name = _ACTIVE.get(key), _NAMES.get(key, "a course function")
    if entry is None:                           # restored meanwhile (another thread's check)
        raise NotAvailable(f"{name} was called while its check was ending; run the cell again")
    if _JUDGING and _from_student(sys._getframe(2)):
        raise NotAvailable(refusal(_JUDGING[-1], name))
    return entry[1](*args, **kwargs)


def _resolve(qualified: str):
    """``(function, public name)`` of a qualified name of :data:`WITHHELD`, or None."""
    parts = qualified.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        obj: Any = module
        owner: Any = None
        for attr in parts[cut:]:
            owner, obj = obj, (vars(obj).get(attr) if isinstance(obj, type)
                               else getattr(obj, attr, None))
        obj = getattr(obj, "__func__", obj)            # a staticmethod
        if not isinstance(obj, types.FunctionType):
            return None
        package = sys.modules.get(module.__name__.rpartition(".")[0])
        public = qualified
        if owner is module and package is not None and getattr(package, parts[-1], None) is obj:
            public = f"{package.__name__}.{parts[-1]}"
        return obj, public
    return None


def _install(fn, public: str) -> None:
    key = id(fn)
    if key in _ACTIVE or fn.__closure__:        # a closure's code cannot be swapped
        return
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__,
                              fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    glue = compile(f"def {fn.__name__}(*args, **kwargs):\n"
                   f"    return {_KEY}({key}, args, kwargs)\n", "<lesson10 refused>", "exec")
    code = next(c for c in glue.co_consts if isinstance(c, types.CodeType))
    _ACTIVE[key] = (fn, copy, fn.__code__, fn.__defaults__, fn.__kwdefaults__)
    _NAMES[key] = public
    fn.__globals__[_KEY] = _dispatch
    fn.__code__, fn.__defaults__, fn.__kwdefaults__ = code, None, None


def _restore() -> None:
    for fn, _, code, defaults, kwdefaults in _ACTIVE.values():
        fn.__code__, fn.__defaults__, fn.__kwdefaults__ = code, defaults, kwdefaults
        fn.__globals__.pop(_KEY, None)
    _ACTIVE.clear()


# --------------------------------------------------------------------------- stub modules
_SEEN: set[str] = set()               # the student's code files a check ran (in a kernel)
_PREVIOUS: list = []                  # the profile functions the outermost guard replaced


def _kind(filename: str) -> str:
    """``"stub"`` for a module of the package the sandbox does not ship, ``"served"`` for
    one whose objects a check serves, ``"student"`` for a file of the student's own (not a
    cell), else ``""``."""
    return _kind_in(filename, os.getcwd())


@functools.lru_cache(maxsize=4096)
def _kind_in(filename: str, folder: str) -> str:
    if filename.startswith("<"):
        return ""
    path = os.path.abspath(filename)
    if path.startswith(_COURSE + os.sep):
        rel = os.path.relpath(path, _COURSE).replace(os.sep, "/")
        return "" if is_real(rel) or rel in _SANDBOX_TOO else "served" if rel in SERVED else "stub"
    return "student" if _whose(filename, folder) == "student" and not _is_cell(path) else ""


def _is_cell(path: str) -> bool:
    """A notebook cell's code: no file (IPython's ``<ipython-input-...>``), or one a kernel
    names under the temporary folder (ipykernel's ``ipykernel_<pid>/``, xeus-python's)."""
    folder = os.path.dirname(path)
    return not os.path.isfile(path) or (
        os.path.dirname(folder) == os.path.abspath(tempfile.gettempdir())
        and os.path.basename(folder).startswith(("ipykernel_", "xpython_")))


_MAKERS: set = set()                  # code of the served modules' functions and constructors


def _served_method(code) -> bool:
    """A method of a served object (not its constructor, not a module's function: the
    student gets the objects, and makes none)."""
    if not _MAKERS:
        for rel in SERVED:
            module = importlib.import_module("lesson10." + rel[:-3].replace("/", "."))
            for obj in vars(module).values():
                if getattr(obj, "__module__", None) != module.__name__:
                    continue
                for fn in ([obj] if isinstance(obj, types.FunctionType) else
                           [vars(obj).get(m) for m in ("__init__", "__new__", "__post_init__")]
                           if isinstance(obj, type) else []):
                    if isinstance(fn, types.FunctionType):
                        _MAKERS.add(fn.__code__)
    return code not in _MAKERS


def _public(frame) -> str:
    """The name a stub of the sandbox has for the function ``frame`` runs."""
    module = frame.f_globals.get("__name__", "lesson10")
    qual = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
    qual = qual.removesuffix(".__init__").removesuffix(".__new__")     # a class: its name
    head = qual.split(".")[0]
    package = sys.modules.get(module.rpartition(".")[0])
    mine = getattr(sys.modules.get(module), head, None)
    if package is not None and mine is not None and getattr(package, head, None) is mine:
        module = package.__name__
    return f"{module}.{qual}"


def _profile(frame, event, arg):
    """The guard's profile hook: a call into a stub module from the student's code is
    refused (raising here also removes the hook: :func:`rearm` puts it back)."""
    if event != "call":
        return
    kind = _kind(frame.f_code.co_filename)
    if not kind:
        return
    if kind == "student":
        _SEEN.add(frame.f_code.co_filename)
    elif kind == "served" and _served_method(frame.f_code):
        return                        # a method of what the check handed over
    elif _JUDGING and frame.f_code.co_name != "<module>" and _from_student(frame.f_back):
        raise NotAvailable(refusal(_JUDGING[-1], _public(frame)))


def rearm() -> None:
    """Put the hook back in this thread while a check runs (after a refusal removed it)."""
    if _JUDGING and sys.getprofile() is None:
        sys.setprofile(_profile)


def _in_kernel() -> bool:
    shell = sys.modules.get("IPython")
    try:
        ip = shell.get_ipython() if shell is not None else None
    except Exception:  # noqa: BLE001 - no IPython that can be asked
        return False
    return ip is not None and getattr(ip, "kernel", None) is not None


def helper_note() -> str | None:
    """In a Jupyter kernel: the grader's sentence for the first file of the student's own
    code the check ran that the grader would not copy beside the notebook, or None."""
    if not _in_kernel():
        return None
    folder = os.getcwd()
    for path in sorted(_SEEN):
        said = reaches_grader(path, folder)
        if said is not None:
            return said
    return None


@contextlib.contextmanager
def guard(exercise: str, notebook: str):
    """While the block runs (the check of ``exercise`` of ``notebook``), the course
    functions ``notebook`` withholds, and every function of a module the sandbox does not
    ship, refuse calls from the student's code, as in the grader's sandbox
    (:data:`WITHHELD`, :data:`REAL`). Only for a graded notebook (one of :data:`WITHHELD`)."""
    if notebook not in WITHHELD:
        yield
        return
    with _LOCK:
        outermost = not _JUDGING
        _JUDGING.append(exercise)
        if outermost:
            _SEEN.clear()
            for qualified in WITHHELD.get(notebook, {}):
                found = _resolve(qualified)
                if found is not None:
                    _install(*found)
            _PREVIOUS[:] = [sys.getprofile(), threading.getprofile()]
            sys.setprofile(_profile)
            threading.setprofile(_profile)
    try:
        yield
    finally:
        with _LOCK:
            _JUDGING.pop()
            if not _JUDGING:
                _restore()
                sys.setprofile(_PREVIOUS[0] if _PREVIOUS else None)
                threading.setprofile(_PREVIOUS[1] if _PREVIOUS else None)
