"""Which mistake a wrong answer makes, judged over all of its failing cases.

A check that runs its cases through :class:`Cases` keeps going after a failing case and
collects every failure. Each failure carries the mistakes that explain it (a
:class:`Diagnosis`: the known wrong answers the student's output equals on that case, in
order of preference) and the check's general hint for that case. The verdict then shows
the first failing case, and as its hint the first mistake that explains *every* failing
case; when no known mistake does, the one that explains most of them (at least two and at
least half: an answer may make two mistakes), else the general hint of the first failing
case (a mistake that fits one case by chance is not named).
"""
from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence

from .feedback import CheckFailed
from .precision import plural, wrapped_count


class Diagnosis(str):
    """A hint text (``str``: the first mistake, else the general hint) that also carries
    every mistake that explains the case (``mistakes``) and the general hint (``general``)."""

    mistakes: tuple[str, ...]
    general: str

    def __new__(cls, mistakes: Sequence[str] = (), general: str = ""):
        obj = super().__new__(cls, mistakes[0] if mistakes else general)
        obj.mistakes = tuple(mistakes)
        obj.general = general
        return obj


def parts(hint) -> tuple[tuple[str, ...], str]:
    """``(mistakes, general)`` of a hint: a :class:`Diagnosis`, or a plain text, which is
    both the only explanation and the general hint (a rule the answer breaks)."""
    if isinstance(hint, Diagnosis):
        return hint.mistakes, hint.general or (str(hint) if not hint.mistakes else "")
    text = str(hint or "")
    return ((text,) if text else ()), text


def with_wrapped_count(raw, target, hint):
    """``hint`` (a text or a function), with a count of ``raw`` that wrapped around in a
    small integer type (uint8, ...) as the first mistake."""
    def diagnose():
        given = hint() if callable(hint) else hint
        wrap = wrapped_count(raw, target)
        if not wrap:
            return given
        mistakes, general = parts(given)
        return Diagnosis((wrap,) + tuple(m for m in mistakes if m != general), general)
    return diagnose


def split(exc: CheckFailed) -> tuple[str, tuple[str, ...], str]:
    """``(head, mistakes, general)`` of a failure: from its attributes when
    :func:`lesson10.checks.core.fail_check` raised it, else from its text (the lines
    before ``hint:`` are the head)."""
    if exc.head is not None:
        return exc.head, exc.mistakes, exc.general
    lines = str(exc).splitlines()
    at = next((i for i, line in enumerate(lines) if line.startswith("hint: ")), len(lines))
    hint = "\n".join(lines[at:])[len("hint: "):]
    return "\n".join(lines[:at]), ((hint,) if hint else ()), hint


def _key(text: str) -> str:
    """A mistake's identity: its text without the numbers of the case ("your experts keep
    22 copies" and "... keep 9 copies" are one mistake)."""
    return re.sub(r"\d+(\.\d+)?(e-?\d+)?", "#", text)


def choose(failures: Sequence[CheckFailed]) -> str:
    """The hint of a set of failures: the first mistake (in the first failure's order) that
    explains all of them; else the one of the first failure's mistakes that explains the
    most of them, when that is at least two and at least half (an answer with two mistakes,
    each failing cases of its own); else the first failure's general hint."""
    split_ = [split(f) for f in failures]
    first_mistakes = split_[0][1]
    keys = [{_key(m) for m in mistakes} for _, mistakes, _ in split_[1:]]
    counts = [1 + sum(_key(text) in k for k in keys) for text in first_mistakes]
    if counts:
        best = max(range(len(counts)), key=lambda i: (counts[i], -i))
        if counts[best] == len(failures) or (counts[best] >= 2 and 2 * counts[best] >= len(failures)):
            return first_mistakes[best]
    return split_[0][2] or (first_mistakes[0] if first_mistakes else "")


class Cases:
    """Run every case of a check, keep the failures, and judge them together::

        cases = Cases("ring_time")
        for label, work in ...:
            with cases.case():
                ...                      # fail_check(...) here ends this case only
        cases.verdict()                  # raises CheckFailed if any case failed

    An error that ends the check (the student's function raised, a stub) still ends it; if
    cases failed before it, their verdict is raised instead."""

    def __init__(self, exercise: str):
        self.exercise = exercise
        self.failures: list[CheckFailed] = []
        self.count = 0

    @contextlib.contextmanager
    def case(self) -> Iterator[None]:
        self.count += 1
        try:
            yield
        except NotImplementedError:
            raise
        except CheckFailed as exc:
            self.failures.append(exc)
        except Exception:
            if self.failures:
                raise self.combined() from None
            raise

    def combined(self) -> CheckFailed:
        head = split(self.failures[0])[0]
        n = len(self.failures)
        lines = [head, f"  {n} of the {plural(self.count, 'case')} "
                       f"{'fails' if n == 1 else 'fail'}"]
        hint = choose(self.failures)
        if hint:
            lines.append(f"hint: {hint}")
        return CheckFailed("\n".join(lines))

    def verdict(self) -> None:
        if self.failures:
            raise self.combined()
