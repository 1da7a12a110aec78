"""The precision rule of the checks, and how a refusal shows its numbers.

The rule (stated in every notebook's introduction):

* an answer in float64 (NumPy's default, and Python's floats) is compared with the
  course's reference to a relative error of ``TOL64`` = 1e-9;
* an answer in float32 is accepted to a relative error of ``TOL32`` = 2e-4: float32 keeps
  about 7 significant digits, and inputs of +-1000 (large scores, large logits) use three of
  them before any arithmetic. A Python float that holds a float32 value exactly (the
  result of ``float()`` or ``.item()`` on a float32, a non-integer) counts as float32 too;
* a float16 answer is refused: about 3 significant digits, and nothing above 65504, are too
  few for the lesson's numbers;
* counts and ids are compared exactly; a count that wrapped around in a small integer type
  (``uint8`` holds 0..255) is named as such.

A refusal shows yours and the target with as many digits as it takes to tell them apart,
and their relative error.
"""
from __future__ import annotations

import numpy as np

TOL64 = 1e-9
TOL32 = 2e-4


def plural(n: int, word: str, many: str = "") -> str:
    """``1 array``, ``3 arrays`` (``many``: an irregular plural, e.g. ``entries``)."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def precision_of(x) -> str:
    """``"half"``, ``"single"`` or ``"double"``: the floating-point precision an answer
    carries (``"double"`` for integers, booleans and anything that is not an array)."""
    try:
        raw = np.asarray(x)
    except (TypeError, ValueError):
        return "double"
    if raw.dtype.kind != "f":
        return "double"
    if raw.dtype.itemsize <= 2:
        return "half"
    if raw.dtype.itemsize == 4:
        return "single"
    if raw.dtype.itemsize == 8:
        vals = raw[np.isfinite(raw)]
        with np.errstate(all="ignore"):
            if vals.size and (vals != np.round(vals)).any() and \
                    (vals.astype(np.float32).astype(np.float64) == vals).all():
                return "single"                # a float32 result, converted afterwards
    return "double"


def tolerance(x, tol: float = TOL64) -> float:
    """The relative tolerance for answer ``x``: ``tol``, or ``TOL32`` for a float32 one."""
    return max(tol, TOL32) if precision_of(x) == "single" else tol


def half_message(what: str) -> str:
    return (f"{what} is float16, which keeps about 3 significant digits and nothing above "
            f"65504: too few for the numbers of this exercise")


HALF_HINT = ("compute in float64, NumPy's default (float32 is accepted too, to a relative "
             "error of 2e-4)")


# --------------------------------------------------------------------------- showing numbers
def _one(x, digits: int) -> str:
    if isinstance(x, np.ndarray):
        if x.size > 16:
            return np.array2string(x.ravel()[:16], precision=digits, floatmode="maxprec") + \
                f" ... (shape {x.shape})"
        return np.array2string(x, precision=digits, floatmode="maxprec")
    if isinstance(x, (float, np.floating)):
        return f"{float(x):.{digits}g}"
    return repr(x)


def fmt(x) -> str:
    """One value as a refusal shows it (6 significant digits)."""
    return _one(x, 6)


def fmt_pair(yours, target) -> tuple[str, str]:
    """Yours and the target, each with as many digits as it takes to show them different
    (they are different: a refusal never shows two equal numbers)."""
    for digits in (6, 9, 12, 17):
        a, b = _one(yours, digits), _one(target, digits)
        if a != b:
            return a, b
    return a, b


def relative_error(yours, target) -> str:
    """``"relative error 1.7e-08"`` for two finite numbers, else ``""``."""
    try:
        y, t = float(yours), float(target)
    except (TypeError, ValueError):
        return ""
    if not (np.isfinite(y) and np.isfinite(t)) or y == t or (y.is_integer() and t.is_integer()):
        return ""                      # counts: yours and the target say it all
    if t == 0:
        return f"absolute error {abs(y):.2g}"
    return f"relative error {abs(y - t) / abs(t):.2g}"


# --------------------------------------------------------------------------- counts that wrapped
_SMALL: list[tuple[type[np.integer], str]] = [
    (np.uint8, "uint8"), (np.int8, "int8"), (np.uint16, "uint16"), (np.int16, "int16"),
    (np.uint32, "uint32"), (np.int32, "int32")]


def wrapped_count(yours, target) -> str | None:
    """The text naming a count that wrapped around in a small integer type, or None."""
    try:
        t = np.asarray(target, dtype=float)
        y = np.asarray(yours)
        yf = y.astype(float)
    except (TypeError, ValueError):
        return None
    if y.shape != t.shape or not np.isfinite(t).all() or (t != np.round(t)).any() or \
            not np.isfinite(yf).all():
        return None
    big = t.astype(np.int64)
    for dtype, name in _SMALL:
        info = np.iinfo(dtype)
        if (big >= info.min).all() and (big <= info.max).all():
            continue                                   # every count fits: no wrap to see
        if np.array_equal(yf, big.astype(dtype).astype(float)):
            idx = tuple(int(i) for i in np.argwhere(yf != t)[0])
            held = f"your array is {name}" if y.dtype == dtype else \
                f"your numbers look like they went through {name}"
            return (f"{held}, which holds only {info.min}..{info.max}: {int(big[idx])} wrapped "
                    f"around to {int(yf[idx])}; keep counts and ids in NumPy's default integer "
                    f"type (int64)")
    return None
