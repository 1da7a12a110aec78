"""How a check speaks to the student: shown in a notebook, raised elsewhere.

**In a notebook** (an IPython kernel: JupyterLab, Notebook, Colab, nbclient) a failed check
*shows* its verdict as plain text and returns, so Run All goes on to the end: what differs,
where, and a hint, without a traceback of course code. When the student's own function
raised, the text carries the traceback of *their* frames only (the check's frames and those
inside NumPy or the standard library are left out), ending at their line that raised.

**Elsewhere** (a script, pytest) a failed check raises :class:`CheckFailed`, whose message
is the same text. ``LESSON10_STRICT_CHECKS`` decides instead of the kernel test: ``1``
raises everywhere, for a stub too (the solution notebooks under nbval, see the repository's
conftest.py: a broken or missing solution fails the run), ``0`` shows everywhere. Raised inside a kernel, a
CheckFailed still shows only its text (IPython honours ``_render_traceback_``).

:func:`fallback` lets the cells that *use* an exercise go on with the course's reference
while the student's function is a stub or was judged wrong by its check, and says so in
every cell where it stands in.
"""
from __future__ import annotations

import functools
import os
import sys
import sysconfig
import traceback
from pathlib import Path

from ..errors import Lesson10Error

ENV = "LESSON10_STRICT_CHECKS"
_COURSE = str(Path(__file__).resolve().parent.parent)     # the lesson10 package folder
#: where NumPy, the standard library and other installed packages live (not the student's code)
_LIBRARIES = tuple({str(Path(p).resolve()) for k, p in sysconfig.get_paths().items()
                    if k in ("stdlib", "platstdlib", "purelib", "platlib")})


class CheckFailed(Lesson10Error, AssertionError):
    """A check found a wrong answer; the message says what, where and why. Raised by
    ``fail_check`` it also carries its parts: the lines before the hint (``head``), the
    mistakes that explain the case and the check's general hint (:mod:`.diagnosis`)."""

    head: str | None = None
    mistakes: tuple[str, ...] = ()
    general: str = ""

    def _render_traceback_(self):
        # IPython shows these lines instead of a traceback through the checks' code
        return str(self).splitlines()


def _shell():
    """The running IPython shell, or None (plain Python, pytest)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    try:
        return ipython.get_ipython()
    except Exception:  # noqa: BLE001 - a broken IPython is no shell
        return None


def strict() -> bool:
    """``LESSON10_STRICT_CHECKS=1``: every check must pass (the solution notebooks), so a
    stub ("not attempted") raises too."""
    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "raise", "strict")


def raising() -> bool:
    """Does a failed check raise (True) or show its verdict and return (False)?"""
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("1", "true", "yes", "raise", "strict"):
        return True
    if value in ("0", "false", "no", "show"):
        return False
    return _shell() is None


# --------------------------------------------------------------------------- the student's traceback
def _course_file(filename: str) -> bool:
    """A file of lesson10, or of a library (NumPy's frames under the student's line)."""
    try:
        path = str(Path(filename).resolve())
    except (OSError, ValueError):
        return False
    return any(path.startswith(folder + os.sep) for folder in (_COURSE, *_LIBRARIES))


def _label(filename: str) -> str:
    """``Cell In[5]`` for a notebook cell (as IPython names it), else the file name."""
    shell = _shell()
    if shell is not None:
        compiler = getattr(shell, "compile", None)
        try:
            named = compiler.format_code_name(filename)  # type: ignore[union-attr]
            if named:
                return " ".join(named)
        except Exception:  # noqa: BLE001 - older IPython: no format_code_name
            number = getattr(compiler, "_filename_map", {}).get(filename)
            if number is not None:
                return f"Cell In[{number}]"
    return f'File "{filename}"'


def student_traceback(exc: BaseException | None) -> str:
    """The traceback of ``exc`` through the student's code only (no frame of lesson10 or of
    a library), or "" when there is none to show (no traceback, or no frame of theirs)."""
    if exc is None or exc.__traceback__ is None:
        return ""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not _course_file(f.filename)]
    if not frames:
        return ""
    lines = ["Traceback of your code (most recent call last):"]
    for f in frames:
        lines.append(f"  {_label(f.filename)}, line {f.lineno}, in {f.name}")
        if f.line:
            lines.append(f"    {f.line.strip()}")
    lines.append(f"{type(exc).__name__}: {exc}")
    return "\n".join(lines)


def with_traceback(message: str, exc: BaseException | None) -> str:
    """``message`` with the student's traceback put before its ``hint:`` line."""
    tb = student_traceback(exc)
    if not tb:
        return message
    lines = message.splitlines()
    at = next((i for i, line in enumerate(lines) if line.startswith("hint:")), len(lines))
    return "\n".join(lines[:at] + tb.splitlines() + lines[at:])


def show_or_raise(message: str, cause: BaseException | None = None) -> None:
    """The end of a failed check: raise CheckFailed(message), or print it and return."""
    if raising():
        raise CheckFailed(message) from cause
    print(message)


# --------------------------------------------------------------------------- fallback
#: exercise -> (the function its latest check judged, that check's status)
JUDGED: dict[str, tuple] = {}
#: what fallback has already said: (function name, reason, cell)
_SAID: set = set()


def _cell():
    shell = _shell()
    return getattr(shell, "execution_count", None)


def _say(name: str, reason: str, text: str) -> None:
    key = (name, reason, _cell())
    if key not in _SAID:
        _SAID.add(key)
        print(text)


def judged_wrong(fn) -> str | None:
    """The exercise whose latest check judged this very function wrong, or None."""
    for exercise, (judged, status) in JUDGED.items():
        if judged is fn and status == "failed":
            return exercise
    return None


def fallback(student_fn, reference_fn):
    """``student_fn``, or ``reference_fn`` while the student's function is still a stub or
    after its check judged it wrong.

    Notebook cells that *use* an exercise call it through this wrapper, so every exercise
    notebook runs top to bottom whatever the answers; where the reference stands in, the
    cell says so (once per cell) and why."""
    name = getattr(student_fn, "__name__", "this function")

    @functools.wraps(student_fn)
    def call(*args, **kwargs):
        exercise = judged_wrong(student_fn)
        if exercise is not None:
            _say(name, "wrong", f"(your {name} did not pass check_{exercise} above: the course's "
                                f"reference stands in for it here, so this cell shows what a right "
                                f"{name} gives; fix yours and run its check again)")
            return reference_fn(*args, **kwargs)
        try:
            return student_fn(*args, **kwargs)
        except NotImplementedError:
            _say(name, "stub", f"({name} is not written yet: the course's reference stands in "
                               f"for it)")
            return reference_fn(*args, **kwargs)

    return call
