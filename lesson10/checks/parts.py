"""The parts of a multi-point exercise, and the mistakes a check recognised.

**Parts.** An exercise worth several points names its parts (``register_exercise(...,
parts=(("non-causal", 1), ("causal", 1)))``: the ring's two cases, capacity's copies per
expert and which copies). Its check's body asks :func:`in_part` of each case (or each comparison)
which part it belongs to. With no part being judged (a notebook's check cell) every case
belongs, so the check is the same as ever; the grader's judge runs the body once per part
inside :func:`judging`, and only that part's cases run: a part's points are won or lost on
its own cases. The number of cases a part ran is counted, so that a part with no case is
never passed by default. Every part has cases that a constant or trivial answer fails
(nothing kept, everything kept, zeros), and a part whose inputs could be few draws its
random cases from ranges too large to tabulate (``tests/test_checks_parts.py``).

**Mistakes.** The hint functions of :mod:`.mistakes` (``*_mistake``) and the checks' own
diagnoses report, through :func:`note_mistake`, which known mistake an answer was found to
be; inside :func:`recording` (the judge) these are kept, so a verdict can name the mistake
(``"mistake": "reduce_scatter_mistake"``) for the class report.

Both live in context variables: each thread (the grader's ``-j`` workers) has its own.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools

_PART: contextvars.ContextVar = contextvars.ContextVar("lesson10_part", default=None)
_MISTAKES: contextvars.ContextVar = contextvars.ContextVar("lesson10_mistakes", default=None)


def in_part(name: str) -> bool:
    """Whether the case at hand, of part ``name``, is to run: always when no part is being
    judged, else only for that part (and then it is counted)."""
    active = _PART.get()
    if active is None:
        return True
    if active["part"] == name:
        active["cases"] += 1
        return True
    return False


@contextlib.contextmanager
def judging(part: str):
    """Run a check's body for one ``part`` only: yields ``{"part", "cases"}``, where
    ``cases`` counts the cases that ran."""
    state = {"part": part, "cases": 0}
    token = _PART.set(state)
    try:
        yield state
    finally:
        _PART.reset(token)


def note_mistake(name: str, text: str) -> None:
    """A check found that an answer is the known mistake ``name`` (its hint ``text``)."""
    seen = _MISTAKES.get()
    if seen is not None:
        seen.append((name, text))


@contextlib.contextmanager
def recording():
    """Keep the mistakes noted inside: yields the list of ``(name, text)``."""
    seen: list = []
    token = _MISTAKES.set(seen)
    try:
        yield seen
    finally:
        _MISTAKES.reset(token)


def mistake_in(message: str, seen) -> str | None:
    """The name of the last noted mistake whose text the failure ``message`` shows."""
    for name, text in reversed(list(seen)):
        if text and text in str(message):
            return name
    return None


def recognised(fn):
    """Decorate a hint function ``(...) -> text or None``: a text it returns is noted as
    the mistake named after the function."""
    @functools.wraps(fn)
    def hint(*args, **kwargs):
        text = fn(*args, **kwargs)
        if text:
            note_mistake(fn.__name__, text)
        return text
    return hint
