"""The return rule: what an exercise's function may return, one rule for the check cell and
the grader.

Both apply :func:`plain` to what the student's function returns before anything looks at
it: the check cell in Jupyter (:func:`lesson10.checks.core.run_student`), and the grader's
sandbox before the value crosses the wire (the runner, which gets a copy of this file as
``_lesson10_returns``: it imports only the standard library and NumPy). So an answer gets
one verdict whatever of these it returns::

    None, bool, int, float, str, NumPy arrays and scalars   kept as they are
    an exact number: Fraction (and other Rationals)         int when whole, else float
                     Decimal, any other Real number         float
    a CPU torch tensor (also one that requires grad)        NumPy array (a 0-d one: a scalar)
    an object NumPy array of real numbers                   float array
    anything with __array__ (pandas, JAX, ...)              NumPy array
    range                                                   list of ints
    list, tuple, dict                                       the same, each entry by this rule
                                                            (the object itself if none changed)

A torch tensor on a GPU, a bfloat16 tensor, or any other object is refused in both places
with one sentence (:class:`ReturnRefused`) that says what to return.

What the check serves (a kernel, a merge, a collective, a network) answers only in the
process the check called the student's function in; threads of that process may call it.
Called from another process (a forked or spawned ``multiprocessing`` pool worker), both
paths raise :class:`ServedElsewhere` with :func:`other_process`'s sentence.
"""
from __future__ import annotations

import decimal
import fractions
import numbers
import os
import sys

import numpy as np

__all__ = ["ReturnRefused", "ServedElsewhere", "plain", "other_process", "same_process",
           "WHAT_TO_RETURN"]

WHAT_TO_RETURN = ("the checks take NumPy arrays or numbers (a Python float or int, a NumPy "
                  "scalar), or lists, tuples or dicts of them")

MAX_DEPTH = 32


class ReturnRefused(Exception):
    """What the student's function returned follows no case of the return rule (the whole
    check fails with its sentence: no case can use such a value)."""


class ServedElsewhere(RuntimeError):
    """Something the check served was called from another process than the judged one."""


def other_process(what: str) -> str:
    """The sentence of :class:`ServedElsewhere` for the served ``what`` (its name)."""
    return (f"the check's {what} was called from another process (a multiprocessing pool "
            f"worker, forked or spawned?): what the check serves answers only in the process "
            f"that runs your function, where the check sees every call. Call it from your "
            f"function itself, in a loop or from threads (concurrent.futures."
            f"ThreadPoolExecutor), not from a process pool")


class Elsewhere:
    """What a served callable becomes when it is pickled for another process (a spawned pool
    worker): calling it raises :class:`ServedElsewhere`."""

    def __init__(self, what: str):
        self.what = str(what)
        self.__name__ = self.what

    def __call__(self, *args, **kwargs):
        raise ServedElsewhere(other_process(self.what))


def same_process(owner_pid: int, what: str) -> None:
    """:class:`ServedElsewhere` unless this is the process ``owner_pid``."""
    if os.getpid() != owner_pid:
        raise ServedElsewhere(other_process(what))


def _torch(x):
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(x, torch.Tensor):
        return None
    if x.device.type != "cpu":
        raise ReturnRefused(f"your function returned a torch tensor on {x.device}: move it to "
                            f"the CPU (.cpu()); {WHAT_TO_RETURN}")
    if x.dtype == torch.bfloat16:
        raise ReturnRefused("your function returned a bfloat16 torch tensor, which NumPy cannot "
                            "hold: compute in float32 or float64 (.double()); "
                            + WHAT_TO_RETURN)
    arr = np.array(x.detach().resolve_conj().resolve_neg().numpy())
    return arr[()] if arr.ndim == 0 else arr


def _number(x):
    if isinstance(x, numbers.Rational) and not isinstance(x, numbers.Integral):
        return int(x.numerator) if x.denominator == 1 else float(x)
    if isinstance(x, numbers.Integral):
        return int(x)
    return float(x)


def _object_array(x: np.ndarray):
    items = x.ravel().tolist()
    if all(isinstance(e, (numbers.Real, decimal.Decimal)) and not isinstance(e, bool)
           for e in items):
        return np.array([float(e) for e in items], dtype=float).reshape(x.shape)
    return x                       # text, None, ...: the check says what is wrong with it


def plain(x, depth: int = 0):
    """``x`` by the return rule above (a new value where something was converted)."""
    if depth > MAX_DEPTH:
        raise ReturnRefused(f"your function returned values nested more than {MAX_DEPTH} levels "
                            f"deep: {WHAT_TO_RETURN}")
    if x is None or type(x) in (bool, int, float, str, complex):
        return x
    if isinstance(x, np.ndarray):
        return _object_array(x) if x.dtype == object else x
    if isinstance(x, (np.generic, bool, str, bytes, complex)):
        return x
    if isinstance(x, (numbers.Real, decimal.Decimal, fractions.Fraction)):
        return _number(x)
    if isinstance(x, range):
        return list(x)
    if isinstance(x, (list, tuple)):
        items = [plain(y, depth + 1) for y in x]
        if all(a is b for a, b in zip(items, x)):
            return x                   # nothing converted: the same object (aliasing shows)
        return tuple(items) if isinstance(x, tuple) else items
    if isinstance(x, dict):
        values = {k: plain(v, depth + 1) for k, v in x.items()}
        return x if all(values[k] is v for k, v in x.items()) else values
    converted = _torch(x)
    if converted is not None:
        return converted
    if hasattr(type(x), "__array__"):
        try:
            return plain(np.asarray(x), depth + 1)
        except Exception as exc:  # noqa: BLE001 - a strange __array__
            raise ReturnRefused(f"your function returned a {type(x).__name__} that NumPy cannot "
                                f"read ({type(exc).__name__}): {WHAT_TO_RETURN}") from None
    raise ReturnRefused(f"your function returned a {type(x).__name__}: {WHAT_TO_RETURN}")
