"""The exercise records: what an exercise is, the table of them, and its fixed seed.

At the bottom of ``checks/``: :mod:`.core` fills :data:`EXERCISES` (``@register_exercise``)
and :mod:`.depends` reads it, so neither imports the other for it.
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


#: exercise id -> Exercise, filled by :func:`lesson10.checks.core.register_exercise`
EXERCISES: dict[str, Exercise] = {}


def seed_of(exercise: str) -> int:
    """The seed a check uses when it is called without one: fixed per exercise."""
    return zlib.crc32(f"lesson10.checks.{exercise}".encode())
