"""The exercise records: what an exercise is, the table of them, and its fixed seed.

At the bottom of ``checks/``: :mod:`.core` fills :data:`EXERCISES` (``@register_exercise``,
the one place an exercise's facts are written) and every reader takes them from there:
:mod:`.depends` (the helpers it uses), :mod:`.refused` (what it may not call and what to
write instead, the grader's sandbox withholding the same), the verdict, the grader and the
report (id, notebook, parts, functions). Its points and whether it counts are not written
here: they are the effective course file's (:func:`lesson10.scheme.current`), read each time.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

from .. import scheme

__all__ = ["EXERCISES", "Exercise", "counts", "maximum", "seed_of", "shown_status"]


@dataclass(frozen=True)
class Exercise:
    id: str
    notebook: str
    title: str
    #: ``body(student_fn, rng) -> success text``: generates the cases, calls the student's
    #: function and compares; raises CheckFailed, NotImplementedError or StudentError.
    #: The check cell and the grader's judge both drive it.
    body: object = None
    #: the name of the function the student writes (what ``summary()`` prints)
    function: str = ""
    #: the names of the parts of an exercise scored per part (see :mod:`.parts`), which
    #: share its points equally
    part_names: tuple = ()
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

    @property
    def points(self) -> int:
        """Its points in the course file in force (0 for optional practice)."""
        return self._scheme()[1]

    @property
    def status(self) -> str:
        """``counts``, ``optional`` (checked, 0 points) or ``bonus`` (on top of the maximum)."""
        return self._scheme()[0]

    @property
    def optional(self) -> bool:
        return self.status == "optional"

    @property
    def parts(self) -> tuple:
        """``((part, points), ...)``: the course file's points shared equally by the parts
        (``()`` for an exercise without parts, or one worth 0)."""
        if not self.part_names or not self.points:
            return ()
        share, rest = divmod(self.points, len(self.part_names))
        if rest or not share:
            found = scheme.current()
            raise scheme.SchemeError(
                f"{found.source}: exercises.{self.id}.points = {self.points} does not split "
                f"equally over its {len(self.part_names)} parts ({', '.join(self.part_names)}); "
                f"write a multiple of {len(self.part_names)}")
        return tuple((name, share) for name in self.part_names)

    def _scheme(self) -> tuple[str, int]:
        found = scheme.current()
        if self.id not in found.exercises:
            raise scheme.SchemeError(f"{found.source}: exercise {self.id!r} has no entry; add "
                                     f"exercises.{self.id} = {{ points = 1 }} to the course file")
        return found.exercises[self.id]


#: exercise id -> Exercise, filled by :func:`lesson10.checks.core.register_exercise`
EXERCISES: dict[str, Exercise] = {}


def seed_of(exercise: str) -> int:
    """The seed a check uses when it is called without one: fixed per exercise."""
    return zlib.crc32(f"lesson10.checks.{exercise}".encode())


def maximum(notebook: str | None = None) -> int:
    """The course maximum (of one notebook, where named): the points of the exercises that
    count in the course file in force; a bonus is on top of it, optional practice worth 0."""
    return sum(ex.points for ex in EXERCISES.values()
               if ex.status == "counts" and notebook in (None, ex.notebook))


def counts(exercise: str) -> bool:
    """Whether an entry's ``max_points`` is part of the maximum (not optional, not a bonus;
    an id that is no course exercise, e.g. an unknown notebook's one entry, counts)."""
    ex = EXERCISES.get(exercise)
    return ex is None or ex.status == "counts"


#: the statuses that say the student's answer lost the points (shown "not passed" when optional)
_LOST = ("failed", "timed out", "crashed", "check removed", "not judged")


def shown_status(exercise: str, status: str) -> str:
    """The status word every output shows: the verdict's, and for optional practice
    ``optional: passed`` / ``optional: not passed`` / ``optional: <status>`` (never "failed")."""
    ex = EXERCISES.get(exercise)
    if ex is None or not ex.optional:
        return status
    return f"optional: {'not passed' if status in _LOST else status}"
