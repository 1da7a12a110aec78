"""The exercise records: what an exercise is, the table of them, and its fixed seed.

At the bottom of ``checks/``: :mod:`.core` fills :data:`EXERCISES` (``@register_exercise``,
the one place an exercise's facts are written) and every reader takes them from there:
:mod:`.depends` (the helpers it uses), :mod:`.refused` (what it may not call and what to
write instead, the grader's sandbox withholding the same), the verdict, the grader and the
report (id, notebook, points, parts).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

__all__ = ["EXERCISES", "Exercise", "seed_of"]


@dataclass(frozen=True)
class Exercise:
    id: str
    notebook: str
    points: int
    title: str
    #: ``body(student_fn, rng) -> success text``: generates the cases, calls the student's
    #: function and compares; raises CheckFailed, NotImplementedError or StudentError.
    #: The check cell and the grader's judge both drive it.
    body: object = None
    #: the name of the function the student writes (what ``summary()`` prints)
    function: str = ""
    #: ``((part, points), ...)`` of an exercise scored per part (see :mod:`.parts`)
    parts: tuple = ()
    #: the exercises whose functions (the student's own) this one calls
    uses: tuple = ()
    #: ``((qualified name as defined, stand-in), ...)``: the course functions that give this
    #: exercise's answer (its reference, and what computes it in a line or two). The check
    #: cell refuses the student's calls to them; the grader's sandbox withholds them, and in
    #: a display-only cell runs the stand-in instead: the student's function of that name,
    #: ``"adapter:NAME"`` (built from the student's functions), or None (refused)
    withholds: tuple = ()
    #: what to write instead, said when the student's function calls one of them
    use_instead: str = ""


#: exercise id -> Exercise, filled by :func:`lesson10.checks.core.register_exercise`
EXERCISES: dict[str, Exercise] = {}


def seed_of(exercise: str) -> int:
    """The seed a check uses when it is called without one: fixed per exercise."""
    return zlib.crc32(f"lesson10.checks.{exercise}".encode())
