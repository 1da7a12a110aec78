"""A check that knows what it depends on.

Some exercises call a helper the student wrote in an earlier exercise (Ulysses calls
their ``seq_to_heads`` and ``heads_to_seq``). When such an exercise fails while one of
those helpers does not pass its own check, the real cause is the helper: the message
says so first, before what the failing check saw.

* In a check cell, :func:`run_body` finds the helpers the student's function reaches by
  name (globals its code uses) and runs each helper's own check on it, quietly.
* The grader's judge has the verdicts of the notebook's earlier check cells and passes
  them to :func:`note_for`.
"""
from __future__ import annotations

import contextlib
import io

import numpy as np

from .exercises import EXERCISES, seed_of
from .feedback import CheckFailed
from .verdict import StudentError

__all__ = ["note_for", "run_body", "helper_statuses"]


def _uses(exercise: str) -> tuple:
    """The exercises whose functions (the student's own) ``exercise`` calls: its record's."""
    ex = EXERCISES.get(exercise)
    return ex.uses if ex is not None else ()


def note_for(exercise: str, statuses: dict) -> str:
    """The lines that go first in a failure of ``exercise``: one per helper whose status
    (``statuses[helper]``: "passed", "failed", ...) is known and not "passed"."""
    lines = []
    for helper in _uses(exercise):
        status = statuses.get(helper)
        if status is not None and status != "passed":
            name = EXERCISES[helper].function or helper
            what = "is not written yet" if status == "not attempted" else \
                "does not pass its check yet"
            lines.append(f"your {name} {what}: fix it first (see its check cell)\n")
    return "".join(lines)


def _names(code) -> set:
    """The global names a function's code uses, nested code (comprehensions, lambdas) too."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _names(const)
    return names


def _status(exercise: str, fn) -> str:
    """The verdict of ``exercise``'s own check on ``fn`` (its fixed seed), without output."""
    body = EXERCISES[exercise].body
    with contextlib.redirect_stdout(io.StringIO()), np.errstate(all="ignore"):
        try:
            body(fn, np.random.default_rng(seed_of(exercise)))  # type: ignore[operator]
        except NotImplementedError:
            return "not attempted"
        except Exception:  # noqa: BLE001 - any failure of the helper is a failure
            return "failed"
    return "passed"


def helper_statuses(exercise: str, student_fn) -> dict:
    """``{helper: status}`` for each helper of ``exercise`` that ``student_fn`` calls by its
    global name (the notebook's function of that name, not the course's)."""
    code, found = getattr(student_fn, "__code__", None), getattr(student_fn, "__globals__", None)
    if code is None or not isinstance(found, dict):
        return {}
    used, out = _names(code), {}
    for helper in _uses(exercise):
        name = EXERCISES[helper].function or helper
        fn = found.get(name)
        if name in used and callable(fn) and not \
                str(getattr(fn, "__module__", "") or "").startswith("lesson10."):
            out[helper] = _status(helper, fn)
    return out


def run_body(exercise: str, body, student_fn, rng):
    """``body(student_fn, rng)``; a failure gets the helpers' note first (see above)."""
    try:
        return body(student_fn, rng)
    except (CheckFailed, StudentError) as exc:
        if not _uses(exercise):
            raise
        note = note_for(exercise, helper_statuses(exercise, student_fn))
        if not note:
            raise
        if isinstance(exc, StudentError):
            raise StudentError(note + str(exc)) from exc.__cause__
        raise CheckFailed(note + str(exc)) from exc.__cause__
