"""A crash inside the student's function: the hint names the likely mistake.

:func:`crash_hint` reads the exception (its type's name and its message) and the shapes of
the arguments the check passed, and says what the crash most likely means: an axis that
``np.split`` cannot cut (the wrong axis), arrays joined or combined with sizes that do not
match (a count from ``np.bincount`` without ``minlength``), a reshape that does not keep the
entries, an index past the end, a value that overflows a small integer dtype, a list of
shards of different lengths stacked into one array, a ``None`` used as a number. The
grader's judge sees only what crosses its wire (the type's name and the message, never the
traceback or the student's source), so these are the only inputs: the check cell and the
grader give the same words. The texts name the mistake and the lesson's rule, not the code.
"""
from __future__ import annotations

import re

import numpy as np

#: the axes of an exercise's sharded argument, the axis it cuts into one block per rank and
#: the axis it joins the blocks along (None: it does not)
AXES: dict[str, tuple[tuple[str, ...], int | None, int | None]] = {
    "reduce_scatter": (("tokens", "hidden size"), 0, None),
    "all_gather": (("tokens", "hidden size"), None, 0),
    "seq_to_heads": (("tokens", "heads", "head dim"), 1, 0),
    "heads_to_seq": (("tokens", "heads", "head dim"), 0, 1),
}

#: the exercises that count per expert or per GPU (where np.bincount is at hand)
COUNTING = ("capacity", "moe_stats", "aux_loss")
_BINCOUNT = ("if one of them counts something per expert or GPU, np.bincount returns only "
             "largest id + 1 counts, fewer when the last ids never occur (pass minlength)")


def _shards(args) -> list | None:
    """The first argument that is a list of arrays (one per rank), or None."""
    for a in args:
        if isinstance(a, (list, tuple)) and a and all(isinstance(x, np.ndarray) for x in a):
            return list(a)
    return None


def _split(exercise, args) -> str:
    shards = _shards(args)
    general = ("np.split cuts an axis into n equal blocks only when n divides its length: check "
               "which axis you split, and into how many blocks")
    names, want, _ = AXES.get(exercise, ((), None, None))
    if shards is None or want is None:
        return general
    n, shape = len(shards), shards[0].shape
    bad = [f"the {names[i]} (axis {i}, length {shape[i]})" for i in range(min(len(shape), len(names)))
           if shape[i] % n]
    if len(shape) != len(names) or not bad or shape[want] % n:
        return general
    return (f"np.split cannot cut an axis into {n} equal blocks unless {n} divides its length: "
            f"with {n} ranks and shards of shape {shape} that fails for {' and '.join(bad)}, so "
            f"you likely split the wrong axis; {exercise} cuts the {names[want]} (axis {want}) "
            f"into one block per rank")


def _join(exercise, message) -> str:
    m = re.search(r"along dimension (\d+), the array at index (\d+) has size (\d+) and the array "
                  r"at index (\d+) has size (\d+)", message)
    if not m:
        return ("the arrays you stacked or joined do not have matching shapes (np.stack needs "
                "one shape, np.concatenate equal sizes on every axis but the one it joins): "
                "check the shape of each block")
    d, i, a, j, b = map(int, m.groups())
    text = (f"the blocks you joined differ along axis {d} (block {i} has {a}, block {j} has {b}), "
            f"and np.concatenate allows a difference only along the axis it joins")
    names, _, join = AXES.get(exercise, ((), None, None))
    if join == d:
        text += f": you likely joined along another axis; {exercise} joins along the {names[d]} (axis {d})"
    return text + "; check the axis you join along"


def _mismatch(exercise, message) -> str | None:
    counting = exercise in COUNTING
    m = re.search(r"broadcast together with (?:remapped )?shapes (\([\d,]*\)) (\([\d,]*\))", message)
    if m:
        return (f"two arrays of shapes {m.group(1)} and {m.group(2)} met in one operation (+, *, a "
                f"comparison): their sizes must match (or be 1); " +
                (_BINCOUNT if counting else _lined_up(_shape(m.group(1)), _shape(m.group(2)))))
    m = re.search(r"size (\d+) is different from (\d+)\)|(\d+) \(dim \d+\) != (\d+) \(dim \d+\)", message)
    if m:
        a, b = [g for g in m.groups() if g is not None]
        return (f"a matrix product (@, np.dot, np.matmul) of arrays whose inner sizes differ ({a} "
                f"and {b}): " + (_BINCOUNT if counting else "the last axis of the left one meets "
                                 "the second-to-last of the right one; check which axes you "
                                 "multiply (a transpose of the wrong axes?)"))
    return None


def _shape(text: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", text))


def _lined_up(a: tuple, b: tuple) -> str:
    """What to check when shapes ``a`` and ``b`` do not broadcast: NumPy lines shapes up from
    the last axis, so a shape that is the start of the other needs trailing axes."""
    short, long_ = sorted((a, b), key=len)
    if len(short) < len(long_) and long_[:len(short)] == short:
        return (f"NumPy lines shapes up from the last axis, so {short} meets the last axes of "
                f"{long_}, not the first: it needs a trailing axis of length 1 to line up")
    return "check the shape each of them should have"


def _reshape(message) -> str | None:
    m = re.search(r"cannot reshape array of size (\d+) into shape (\(.*?\))", message)
    if not m:
        return None
    shape = m.group(2).replace("newaxis", "-1")
    holds = "" if "-1" in shape else f", which holds {int(np.prod(_shape(shape)))}"
    return (f"a reshape keeps every entry: {m.group(1)} entries do not fit the shape {shape}"
            f"{holds}; check the sizes you computed from the shapes above (the tokens per rank, "
            f"the heads per group, ...)")


def _index(message) -> str:
    m = re.search(r"index (-?\d+) is out of bounds for axis (\d+) with size (\d+)", message)
    if m:
        i, axis, n = map(int, m.groups())
        return (f"index {i} is past the end of axis {axis}, whose {n} entries are 0..{n - 1}: a "
                f"loop or an index formula runs one too far, or takes one size for another "
                f"(ranks, tokens, rounds)")
    if "list index out of range" in message:
        return ("an index ran past the end of a list: a list of shards has one entry per rank, "
                "0..n-1; check each index formula (and its wrap-around) on the shapes above")
    if "too many indices" in message:
        return "you index an array with more indices than it has axes: check its shape"
    return ("an index is out of range or not an integer: check each index formula on the shapes "
            "above (ids used as indices must be integers)")


def _overflow(message) -> str | None:
    m = re.search(r"integer (-?\d+) out of bounds for (u?int(?:8|16|32|64))\b", message)
    if not m:
        return None
    info = np.iinfo(np.dtype(m.group(2)))
    return (f"{m.group(1)} does not fit your array's dtype {m.group(2)}, which holds only "
            f"{info.min}..{info.max}: counts grow fast with the sizes; keep them in NumPy's default "
            f"integer (int64)")


def _is_ragged(args) -> bool:
    return len({x.shape for x in _shards(args) or []}) > 1


def _ragged(args) -> str:
    shards = _shards(args)
    shapes = sorted({x.shape for x in shards}) if shards else []
    lengths = f" (here {', '.join(str(s) for s in shapes)})" if len(shapes) > 1 else ""
    return (f"one array made of arrays of different lengths (np.array, np.stack, np.column_stack "
            f"...): the ranks may hold different numbers of tokens{lengths}; keep them as a list "
            f"and work on each rank's array")


def crash_hint(exercise: str, type_name: str, message: str, args) -> str | None:
    """The hint for the student's function raising ``type_name: message`` when called with
    ``args`` in a case of ``exercise``, or None (no likely mistake is known, or the message
    or an argument is too odd to read: the check's general hint then stands)."""
    try:
        return _named(exercise, str(type_name), str(message)[:4000], tuple(args))
    except Exception:  # noqa: BLE001 - a hint never breaks the verdict
        return None


def _named(exercise: str, type_name: str, message: str, args: tuple) -> str | None:
    if type_name == "ValueError" and "array split does not result in an equal division" in message:
        return _split(exercise, args)
    joined = "input array dimensions" in message or "input arrays must have" in message
    if type_name == "ValueError" and ("inhomogeneous shape" in message or joined and _is_ragged(args)):
        return _ragged(args)
    if type_name == "ValueError" and joined:
        return _join(exercise, message)
    if type_name == "ValueError" and (found := _mismatch(exercise, message) or _reshape(message)):
        return found
    if type_name == "IndexError":
        return _index(message)
    if type_name == "OverflowError":
        return _overflow(message)
    if type_name in ("TypeError", "ValueError", "AttributeError") and any(a is None for a in args) \
            and "None" in message:
        return ("your function used a None argument as a number or a string: this case passes "
                "None on purpose (see \"it was called with\"); the exercise says what None means")
    return None
