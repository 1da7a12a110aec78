"""One verdict ladder: what running an exercise's check body means for the exercise.

An exercise's body ``body(student_fn, rng) -> success text`` either returns (the answer
passed) or raises. :func:`judge_body` turns each outcome into a :class:`Verdict`, in the
same words for the check cell (:func:`lesson10.checks.core.register_exercise`) and for the
grader's judge (:mod:`lesson10.course.grade.judge`)::

    returns text           -> passed        (the text says what was verified)
    NotImplementedError    -> not attempted (the function is still a stub)
    CheckFailed            -> failed        (what differs, where, and a hint)
    StudentError           -> failed        (the student's function raised)
    ReturnRefused          -> failed        (it returned what the return rule refuses)
    any other Exception    -> failed        (the check could not use the answer)

The judge adds only what crosses its process boundary (a fork that hung or died, an error
raised on the other side, a sandbox that did not start); the statuses it gives are in
:class:`Status` too. Reports keep verdicts as plain dicts (:meth:`Verdict.as_dict`).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Protocol

from .feedback import CheckFailed
from .returns import ReturnRefused


class Status(str, enum.Enum):
    """Every status an exercise can have in a report (a ``str``: ``Status.PASSED == "passed"``)."""
    PASSED = "passed"
    FAILED = "failed"
    NOT_ATTEMPTED = "not attempted"
    # the judge: what crossed the process boundary
    TIMED_OUT = "timed out"
    CRASHED = "crashed"
    # the grader, without a judged call
    CHECK_REMOVED = "check removed"
    NOT_JUDGED = "not judged"
    MISSING = "missing"
    UNREADABLE = "unreadable"
    NOT_PYTHON = "not python"
    UNKNOWN_NOTEBOOK = "unknown notebook"
    GRADER_ERROR = "grader error"

    def __str__(self) -> str:
        return self.value


class StudentError(Exception):
    """The student's function raised something other than NotImplementedError (the
    original error is the ``__cause__``)."""


class _Exercise(Protocol):
    """What the ladder reads of an exercise (:class:`lesson10.checks.core.Exercise`)."""
    @property
    def id(self) -> str: ...
    @property
    def points(self) -> int: ...
    @property
    def function(self) -> str: ...
    @property
    def body(self) -> Any: ...


@dataclass(frozen=True)
class Verdict:
    """The verdict on one exercise: ``points`` is ``max_points`` when passed, else 0."""
    exercise: str
    status: Status
    message: str
    max_points: int
    #: the exception behind a failure (its traceback shows the student's frames)
    cause: BaseException | None = field(default=None, compare=False, repr=False)
    #: the student's own function raised (the check cell shows their traceback)
    raised: bool = field(default=False, compare=False, repr=False)

    @classmethod
    def of(cls, ex: _Exercise, status: Status | str, message: str, *,
           cause: BaseException | None = None, raised: bool = False) -> Verdict:
        return cls(ex.id, Status(status), message, ex.points, cause, raised)

    @property
    def passed(self) -> bool:
        return self.status is Status.PASSED

    @property
    def points(self) -> int:
        return self.max_points if self.passed else 0

    def as_dict(self) -> dict:
        """The report's entry: ``{"exercise", "status", "passed", "points", "max_points",
        "message"}`` (plain ``str`` status)."""
        return {"exercise": self.exercise, "status": self.status.value, "passed": self.passed,
                "points": self.points, "max_points": self.max_points, "message": self.message}


def not_attempted_message(name: str) -> str:
    return (f"{name}, or a function it calls, still raises NotImplementedError: write it and "
            f"run its check again")


def refused_return_message(exercise: str, sentence: str) -> str:
    """A return the return rule refuses, in the check cell and in the grader alike."""
    return f"check_{exercise} failed: {sentence}"


def judge_body(ex: _Exercise, fn, rng, *, name: str | None = None,
               passthrough: tuple[type[BaseException], ...] = (), run=None) -> Verdict:
    """Run ``ex.body(fn, rng)`` and turn what happens into a :class:`Verdict` (the ladder
    above). ``name``: the student's function as the messages call it (default: the
    exercise's). An exception of ``passthrough`` (the judge's own) is raised unchanged, as
    is any BaseException that is not an Exception. ``run(fn, rng)``: how to call the body
    (default ``ex.body``; the check cell adds the note on failed helpers)."""
    name = name or getattr(ex, "function", "") or ex.id
    try:
        verified = (run or ex.body)(fn, rng)
    except passthrough:
        raise
    except NotImplementedError:
        return Verdict.of(ex, Status.NOT_ATTEMPTED, not_attempted_message(name))
    except ReturnRefused as exc:          # the return rule (:mod:`.returns`), one sentence
        return Verdict.of(ex, Status.FAILED, refused_return_message(ex.id, str(exc)))
    except CheckFailed as exc:
        return Verdict.of(ex, Status.FAILED, str(exc))
    except StudentError as exc:
        return Verdict.of(ex, Status.FAILED, f"check_{ex.id} failed: {exc}",
                          cause=exc.__cause__, raised=True)
    except Exception as exc:  # noqa: BLE001 - the check choked on a strange answer
        return Verdict.of(ex, Status.FAILED,
                          f"check_{ex.id} failed: the check could not use what your function "
                          f"returned ({type(exc).__name__}: {str(exc)[:300]})\n"
                          f"hint: return what the exercise asks for (its types and shapes are "
                          f"in the text above the function)", cause=exc)
    return Verdict.of(ex, Status.PASSED, str(verified))
