"""Predict-first questions: the student writes a prediction in a cell, the next cell reveals.

A notebook asks, then a cell holds ``my_prediction = None`` for the student to replace, and
the cell that computes the answer ends with ``predict.reveal(my_prediction, truth, ...)``,
which prints the prediction next to the truth. Nothing here judges or grades: a missing or
wrong prediction only changes the printed line.
"""
from __future__ import annotations

import math
from numbers import Real

__all__ = ["reveal", "compare"]


def _show(x) -> str:
    if isinstance(x, bool) or not isinstance(x, Real):
        return repr(x)
    x = float(x)
    if not math.isfinite(x):
        return str(x)
    if x == int(x) and abs(x) < 1e15:
        return f"{int(x):,}"
    if abs(x) >= 1e7 or abs(x) < 1e-3:
        return f"{x:.3g}"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.4g}"


def _numeric(prediction, truth: Real, unit: str, rtol: float, atol: float) -> str:
    if isinstance(prediction, bool) or not isinstance(prediction, Real):
        return (f"your prediction {prediction!r} is not a number: write a number (in {unit or 'the unit asked'}), "
                f"then run this cell again. The answer: {_show(truth)} {unit}".rstrip())
    p, t = float(prediction), float(truth)
    if not math.isfinite(p):
        return f"your prediction {p} is not finite: write a finite number. The answer: {_show(t)} {unit}".rstrip()
    if abs(p - t) <= atol or abs(p - t) <= rtol * abs(t):
        verdict = "close" if p != t else "exact"
        return f"{verdict}: you predicted {_show(p)}, the answer is {_show(t)} {unit}".rstrip()
    if t != 0 and p != 0 and (p > 0) == (t > 0):
        factor = max(p / t, t / p)
        side = "too high" if abs(p) > abs(t) else "too low"
        return (f"not quite: you predicted {_show(p)}, the answer is {_show(t)} {unit} "
                f"({side} by a factor {factor:.2g})").replace("  ", " ")
    return f"not quite: you predicted {_show(p)}, the answer is {_show(t)} {unit}".rstrip()


def compare(prediction, truth, unit: str = "", rtol: float = 0.1, atol: float = 0.0) -> str:
    """The line that :func:`reveal` prints: ``prediction`` next to ``truth``.

    ``truth`` a number: a prediction within ``rtol`` (relative) counts as close; a bool: a
    yes/no question (``True`` / ``False``, or the strings ``"yes"`` / ``"no"``); a string:
    one of a few named answers, compared without case. ``None`` means no prediction yet.
    ``atol``: an absolute tolerance too, for an answer near 0 (rounding errors)."""
    if not (rtol >= 0) or not (atol >= 0):
        raise ValueError(f"rtol and atol must be numbers >= 0 (tolerances such as 0.1), got {rtol!r}, {atol!r}")
    if prediction is None or prediction is Ellipsis:
        answer = f"{_show(truth)} {unit}".strip()
        return (f"no prediction written (it is still None): the answer is {answer}. "
                f"Next time write your guess first, then run the cell: the surprise is the lesson.")
    if isinstance(truth, bool):
        said = prediction
        if isinstance(said, str) and said.strip().lower() in ("yes", "no", "true", "false"):
            said = said.strip().lower() in ("yes", "true")
        if not isinstance(said, bool):
            return f"answer this one with True or False (yes or no), not {prediction!r}. The answer: {truth}"
        return f"{'right' if said == truth else 'not quite'}: you said {said}, the answer is {truth}"
    if isinstance(truth, str):
        said = str(prediction).strip().lower()
        ok = said == truth.strip().lower()
        return f"{'right' if ok else 'not quite'}: you said {prediction!r}, the answer is {truth!r}"
    if isinstance(truth, Real):
        return _numeric(prediction, truth, unit, rtol, atol)
    raise TypeError(f"truth must be a number, a bool or a string, got {type(truth).__name__}")


def reveal(prediction, truth, unit: str = "", rtol: float = 0.1, atol: float = 0.0) -> None:
    """Print ``prediction`` next to ``truth`` (see :func:`compare`)."""
    print("your prediction:", compare(prediction, truth, unit, rtol, atol))
