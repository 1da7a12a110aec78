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


class Kind(str, enum.Enum):
    """How a status counts, the one classification every writer takes (a ``str``)."""
    CREDIT = "credit"                       # the points were earned
    STUDENT = "against the student"         # the student's code lost the points
    NOT_ATTEMPTED = "not attempted"         # the function is still a stub
    NOT_HANDED_IN = "not handed in"         # no notebook of the exercise
    FILE = "file not gradable"              # the file is no readable Python course notebook
    GRADER = "grader error"                 # the grader or the machine failed, not the student
    INSTRUCTOR = "set by the instructor"    # overrides.csv decided the points


class Status(str, enum.Enum):
    """Every status an exercise can have in a report (a ``str``: ``Status.PASSED == "passed"``),
    with its :class:`Kind` and what it means (the words of the feedback and the README)."""
    _value_: str
    kind: Kind
    meaning: str

    def __new__(cls, value: str, kind: Kind = Kind.GRADER, meaning: str = "") -> Status:
        # the defaults are for the type checker: ``Status(word)`` looks a member up
        obj = str.__new__(cls, value)
        obj._value_ = value
        obj.kind = kind
        obj.meaning = meaning
        return obj

    PASSED = ("passed", Kind.CREDIT, "the judge's hidden cases all passed")
    FAILED = ("failed", Kind.STUDENT, "the judge found a wrong answer (the message says what)")
    NOT_ATTEMPTED = ("not attempted", Kind.NOT_ATTEMPTED,
                     "the function still raises NotImplementedError")
    # the judge: what crossed the process boundary
    TIMED_OUT = ("timed out", Kind.STUDENT, "the function ran over the exercise's time limit")
    CRASHED = ("crashed", Kind.STUDENT, "the process running the function died")
    # the grader, without a judged call
    CHECK_REMOVED = ("check removed", Kind.STUDENT,
                     "the check cell of the exercise was deleted")
    NOT_JUDGED = ("not judged", Kind.STUDENT,
                  "the check cell never ran (the notebook stopped before it)")
    GRADER_ERROR = ("grader error", Kind.GRADER,
                    "the grader or the machine failed: not the student's score")
    # the file handed in, or none
    MISSING = ("missing", Kind.NOT_HANDED_IN, "the notebook was not handed in")
    UNREADABLE = ("unreadable", Kind.FILE, "the notebook file could not be read")
    NOT_PYTHON = ("not python", Kind.FILE, "the notebook's kernel is not Python")
    UNKNOWN_NOTEBOOK = ("unknown notebook", Kind.FILE, "the file is no course notebook")
    # the instructor, after grading
    OVERRIDDEN = ("overridden", Kind.INSTRUCTOR,
                  "the instructor set the points (overrides.csv; the reason is shown, the "
                  "judge's verdict kept in the JSON)")

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of(cls, word: str) -> Status:
        """The status a report's word names; a clear ValueError for a word that is none."""
        try:
            return cls(word)
        except ValueError:
            raise ValueError(f"{word!r} is no exercise status (one of: "
                             f"{', '.join(s.value for s in cls)}); grade the notebooks "
                             f"again with this version of lesson10") from None

    @property
    def against_student(self) -> bool:
        """The student's code lost these points (the class report's "failed or broken")."""
        return self.kind is Kind.STUDENT

    @property
    def grader_error(self) -> bool:
        """The grader's failure, not the student's score (JUnit ``<error>``, Classroom
        ``error``)."""
        return self.kind is Kind.GRADER


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
