"""The one base of the errors lesson10 raises on purpose.

Every error the package means to raise (a refused command line, a wrong answer found by a
check, a rank that failed, a file the grader will not read, ...) is a :class:`Lesson10Error`
*and* the builtin kind it has always been (``ValueError``, ``AssertionError``, ``OSError``,
``RuntimeError``), so ``except lesson10.Lesson10Error`` catches them all and old ``except``
clauses keep working::

    >>> from lesson10.runs.validate import Refused
    >>> issubclass(Refused, Lesson10Error) and issubclass(Refused, ValueError)
    True

Each has its own name: no two error classes of the package share one (tested).
"""
from __future__ import annotations

__all__ = ["Lesson10Error"]


class Lesson10Error(Exception):
    """An error lesson10 raised on purpose; its message says what to do."""
