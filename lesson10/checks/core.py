"""Check functions for the exercise notebooks.

Every exercise has one ``check_<exercise>(student_fn, *, seed=None)``. It runs the
student's function on two sets of cases and compares the results with the reference in
:mod:`lesson10.sim`, :mod:`lesson10.layouts` or :mod:`lesson10.cost`:

* a fixed list of targeted cases, always run: the edge cases of the exercise (empty and
  fully masked rows, scores of +-800, ties, empty experts, uneven sizes, integer-valued
  inputs);
* a random batch drawn from ``seed``. With ``seed=None`` the seed is fixed per check, so a
  given answer gets the same verdict on every run; the grader passes its own secret
  generator to :attr:`Exercise.body` instead.

Besides the values it checks the types the exercise asks for (integer ids, boolean masks)
and that the function left its inputs unchanged. Numbers follow one precision rule
(:mod:`.precision`): float64 to 1e-9, float32 to 2e-4, float16 refused, counts exact.

Where an exercise uses something of the course (the ``op`` of SP, the ring's
``ring_shift``, the all-to-all, the attention kernel of Ulysses), the check passes it in as
an argument that it serves and watches (:mod:`.network`), so the method is checked, not
only the output; in some random cases what it serves is substituted, so that only an
answer that uses it gets the target. Where an exercise has few possible inputs (sizes of
a formula, a layout), the random batch comes from a range too large to tabulate. The
outcome:

* right: prints one line saying what was verified (for example the max error);
* wrong: says what differs and where (rank, round, query, head, expert), yours vs. the
  target, and a hint that names the mistake the answer looks like (a check that runs its
  cases through :class:`~.diagnosis.Cases` names the one that explains every failing case). In a notebook it shows
  this text and returns, so Run All goes on; elsewhere (a script, pytest) it raises
  :class:`CheckFailed` (an ``AssertionError``) with the same text (:mod:`.feedback`);
* still a stub (it raises ``NotImplementedError``): prints "not attempted" and
  returns normally, so an untouched exercise notebook runs top to bottom.

Each call records its outcome ``{"exercise", "passed", "points", "max_points",
"status", "message"}`` in :data:`OUTCOMES`, for :func:`summary`. These are the student's
feedback, not the score: ``python -m lesson10 grade`` scores with its own judge, which
drives :attr:`Exercise.body` on hidden cases outside the student's kernel.
"""
from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Sequence

import numpy as np

from . import crashes, depends, feedback, refused, returns
from .diagnosis import Cases, Diagnosis, parts, with_wrapped_count
from .exercises import EXERCISES, Exercise, counts, seed_of, shown_status
from .feedback import CheckFailed, fallback
from .precision import (
    HALF_HINT,
    fmt_pair,
    half_message,
    plural,
    precision_of,
    relative_error,
    tolerance,
)
from .verdict import Status, StudentError, Verdict, judge_body

__all__ = [
    "Cases",
    "CheckFailed",
    "Diagnosis",
    "OUTCOMES",
    "EXERCISES",
    "summary",
    "fallback",
]

#: every outcome recorded in this process, in call order
OUTCOMES: list[dict] = []


# --------------------------------------------------------------------------- recording
def _record(v: Verdict) -> dict:
    """Keep ``v`` in :data:`OUTCOMES` (as a dict: the report's keys and the notebook)."""
    outcome = {**v.as_dict(), "notebook": EXERCISES[v.exercise].notebook}
    OUTCOMES.append(outcome)
    return outcome


def summary() -> None:
    """Print the outcome of the latest call of every check run in this kernel."""
    latest = {o["exercise"]: o for o in OUTCOMES}
    if not latest:
        print("no check has run yet")
        return
    got = sum(o["points"] for o in latest.values())
    total = sum(o["max_points"] for o in latest.values() if counts(o["exercise"]))
    for o in latest.values():
        name = EXERCISES[o["exercise"]].function or o["exercise"]
        shown = shown_status(o["exercise"], o["status"])
        print(f"  {name:<22s} {shown:<24s} {o['points']}/{o['max_points']}")
    print(f"  {'total':<22s} {'':<24s} {got}/{total}")


def _judged(fn, v: Verdict) -> None:
    """Record the verdict for :func:`summary` and for :func:`fallback` (which function)."""
    _record(v)
    feedback.JUDGED[v.exercise] = (fn, v.status.value)


def worth(exercise: str) -> str:
    """What an exercise is worth in the course file in force, in words: ``2 points``,
    ``optional practice`` or ``bonus, 1 point``."""
    ex = EXERCISES[exercise]
    if ex.optional:
        return "optional practice"
    n = f"{ex.points} point{'s' if ex.points != 1 else ''}"
    return f"bonus, {n}" if ex.status == "bonus" else n


def _show(v: Verdict) -> None:
    """The end of a check cell: print the verdict, or raise it (see :mod:`.feedback`)."""
    if v.status is Status.PASSED:
        print(f"check_{v.exercise} passed ({worth(v.exercise)}): {v.message}")
    elif v.status is Status.NOT_ATTEMPTED:
        msg = f"check_{v.exercise}: not attempted ({v.message})"
        if feedback.strict():             # a solution notebook: every exercise passes
            raise CheckFailed(msg + f"\n({feedback.ENV}=1: every check must pass)")
        print(msg)
    elif v.raised:
        feedback.show_or_raise(feedback.with_traceback(v.message, v.cause), v.cause)
    else:
        feedback.show_or_raise(v.message, v.cause)


# --------------------------------------------------------------------------- the decorator
def _call(fn, *args, exercise: str = "", **kwargs):
    """Call the student's function; NotImplementedError passes through, any other error
    becomes a StudentError that names the function and the error, with a hint that names
    the likely mistake (:mod:`.crashes`; ``exercise``, keyword only, is the check's, never
    passed on) where one is known. What it returns is taken
    by the return rule (:func:`.returns.plain`: exact numbers, torch tensors ... converted,
    the same as in the grader; :class:`~.returns.ReturnRefused` otherwise)."""
    refused.rearm()           # the grader's rule on course code (a refusal caught removed it)
    try:
        out = fn(*args, **kwargs)
    except (NotImplementedError, CheckFailed, returns.ReturnRefused):
        raise                 # (a ReturnRefused here: the grader's sandbox applied the rule)
    except Exception as exc:  # any bug in student code is reported (re-raised below)
        name = getattr(fn, "__name__", "your function")
        called = ", ".join(describe_value(a) for a in args)
        hint = crashes.crash_hint(exercise, type(exc).__name__, str(exc), args) or (
            "the traceback shows the line of your code that raised; try your function on the "
            "example in the notebook first")
        raise StudentError(f"{name} raised {type(exc).__name__}: {exc}\n"
                           f"  it was called with: {called}\nhint: {hint}") from exc
    return returns.plain(out)         # the return rule, as the grader applies it (:mod:`.returns`)


def describe_value(x) -> str:
    if isinstance(x, np.ndarray):
        return f"array{x.shape}"
    if isinstance(x, (list, tuple)) and x and all(isinstance(y, np.ndarray) for y in x):
        shapes = sorted({y.shape for y in x})
        return f"list of {plural(len(x), 'array')} of shape {shapes[0] if len(shapes) == 1 else shapes}"
    if callable(x):
        return getattr(x, "__name__", "a function")
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def register_exercise(exercise: str, notebook: str, title: str, function: str = "",
                      parts: tuple = (), *, uses: tuple = (), withholds: dict | None = None,
                      use_instead: str = ""):
    """Turn ``body(student_fn, rng) -> success text`` into a public check function, and
    write the exercise's record (:class:`.exercises.Exercise`: every fact of it but its points,
    which are the course file's). ``parts``: the names of the parts the grader scores on their
    own, sharing the exercise's points (the body asks :func:`lesson10.checks.parts.in_part` of
    each case); ``uses``: the exercises whose functions it calls; ``withholds``: ``{qualified
    name: stand-in}`` of the course functions that give its answer; ``use_instead``: what to
    write instead of them."""
    def decorate(body):
        EXERCISES[exercise] = Exercise(exercise, notebook, title, body,
                                       function or exercise, tuple(parts), tuple(uses),
                                       tuple((withholds or {}).items()), use_instead)

        @functools.wraps(body)
        def check(student_fn, *, seed: int | None = None) -> None:
            ex = EXERCISES[exercise]
            if not callable(student_fn):
                msg = (f"check_{exercise} takes your function itself, e.g. "
                       f"check_{exercise}({function or exercise}), not the result of calling it "
                       f"(got {type(student_fn).__name__})")
                _record(Verdict.of(ex, Status.FAILED, msg))
                if feedback.raising():
                    raise TypeError(msg)
                print(msg)
                return None
            module = getattr(student_fn, "__module__", "") or ""
            if module.startswith("lesson10."):
                msg = (f"check_{exercise} failed: {module}.{getattr(student_fn, '__name__', '?')} is "
                       f"the course's reference, not your function; pass the function you wrote")
                verdict = Verdict.of(ex, Status.FAILED, msg)
            else:
                rng = np.random.default_rng(seed_of(exercise) if seed is None else seed)
                with refused.guard(exercise, notebook):   # the grader's rule on course code
                    verdict = judge_body(ex, student_fn, rng, name="your function",
                                         run=lambda fn, r: depends.run_body(exercise, body, fn, r))
                unseen = refused.helper_note()            # a file the grader would not have
                if unseen is not None and verdict.status is not Status.NOT_ATTEMPTED:
                    verdict = Verdict.of(ex, Status.FAILED, f"check_{exercise} failed: {unseen}")
            _judged(student_fn, verdict)
            return _show(verdict)

        del check.__wrapped__                  # help() shows check(student_fn, *, seed=None)
        check.exercise = exercise  # type: ignore[attr-defined]
        check.__doc__ = (body.__doc__ or "") + (
            "\n\n    ``seed=None`` uses a seed fixed for this check (same verdict every run); "
            "pass an integer to draw another random batch.")
        return check

    return decorate


# --------------------------------------------------------------------------- comparing
#: a hint: its text, or a function called only when the check fails that returns it
Hint = str | Callable[[], str | None]


def failure_message(exercise: str, where: str, what: str, yours=None, target=None, hint: Hint = "",
             show: bool = True) -> str:
    """The text of a failure: ``check_X failed: where: what``, then yours / target (when
    ``show``, with the digits that tell them apart and their relative error) and the hint.
    ``hint`` may be a function that returns it: called only when the check fails, it can
    look at the answer to name the mistake it looks like (a :class:`Diagnosis`)."""
    return _failure(exercise, where, what, yours, target, hint, show)[0]


def _failure(exercise, where, what, yours, target, hint, show):
    """(text, head, mistakes, general) of a failure."""
    if callable(hint):
        hint = hint() or ""
    lines = [f"check_{exercise} failed: {where + ': ' if where else ''}{what}"]
    if show:
        a, b = fmt_pair(yours, target)
        err = relative_error(yours, target)
        lines.append(f"  yours : {a}" + (f"   ({err})" if err else ""))
        lines.append(f"  target: {b}")
    head = "\n".join(lines)
    mistakes, general = parts(hint)
    return (head + (f"\nhint: {hint}" if hint else "")), head, mistakes, general


def fail_check(exercise: str, where: str, what: str, yours=None, target=None, hint: Hint = "",
          show: bool = True):
    text, head, mistakes, general = _failure(exercise, where, what, yours, target, hint, show)
    exc = CheckFailed(text)
    exc.head, exc.mistakes, exc.general = head, mistakes, general
    raise exc


def _as_array(exercise, x, where, what) -> np.ndarray:
    try:
        _real_only(x)
        arr = np.asarray(x, dtype=float)
    except (TypeError, ValueError) as exc:
        fail_check(exercise, where, f"{what} is not an array of real numbers ({type(x).__name__}: {exc})",
              show=False, hint="return NumPy arrays of real numbers")
    if precision_of(x) == "half":
        fail_check(exercise, where, half_message(what), show=False, hint=HALF_HINT)
    return arr


def _locate(index, axes) -> str:
    parts = []
    for name, i in zip(axes, index):
        if name:
            parts.append(f"{name} {i}")
    return ", ".join(parts)


def compare_arrays(exercise, yours, target, *, where: str, what: str, axes=(), tol=1e-9,
             hint: Hint = "", exact: bool = False) -> float:
    """Compare arrays: shape, then non-finite values, then values. Returns the max error.
    ``tol`` is relative (to 1 + |target|); a float32 answer gets the float32 tolerance
    (:mod:`.precision`). A count that wrapped around in a small integer type is named."""
    raw, single = yours, precision_of(yours) == "single"
    tol = tolerance(raw, tol)
    target = np.asarray(target, dtype=float)
    yours = _as_array(exercise, yours, where, what)
    if yours.shape != target.shape:
        fail_check(exercise, where, f"{what} has shape {yours.shape}, expected {target.shape}",
              show=False, hint=hint)
    same_inf = np.isinf(yours) & np.isinf(target) & (np.sign(yours) == np.sign(target))
    bad_nan = np.isnan(yours) & ~np.isnan(target)
    if bad_nan.any():
        idx = tuple(int(i) for i in np.argwhere(bad_nan)[0])
        fail_check(exercise, where, f"{what} has NaN at {_locate(idx, axes) or idx}",
              yours[idx], target[idx], hint)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(same_inf, 0.0, np.abs(yours - target))
    diff = np.where(np.isnan(diff), np.inf, diff)
    if exact and single and not np.array_equal(target, np.round(target)):
        exact = False          # moved data rounded to float32: the float32 rule (:mod:`.precision`)
    limit = 0.0 if exact else tol * (1.0 + np.where(np.isfinite(target), np.abs(target), 0.0))
    wrong = diff > limit
    if wrong.any():
        idx = tuple(int(i) for i in np.argwhere(wrong)[0])
        n_wrong = int(wrong.sum())
        fail_check(exercise, where,
              f"{what} differs at {_locate(idx, axes) or idx} ({n_wrong} of "
              f"{plural(wrong.size, 'entry', 'entries')} wrong)",
              yours[idx] if yours.ndim else yours, target[idx] if target.ndim else target,
              with_wrapped_count(raw, target, hint))
    finite = diff[np.isfinite(diff)]
    return float(finite.max()) if finite.size else 0.0


def as_shard_list(exercise, out, n, where, what) -> list:
    if isinstance(out, np.ndarray) and out.ndim >= 1 and out.dtype != object:
        out = list(out)
    if not isinstance(out, (list, tuple)):
        fail_check(exercise, where, f"{what} should be a list with one array per rank, got "
              f"{type(out).__name__}", show=False,
              hint="return a Python list: entry r is what rank r holds")
    if len(out) != n:
        fail_check(exercise, where, f"{what} should hold {plural(n, 'array')} (one per rank), got {len(out)}",
              show=False, hint="return a Python list with one entry per rank: entry r is what "
                               "rank r holds")
    return list(out)


def compare_shards(exercise, yours, target, *, where, what, axes, tol=1e-9, hint="",
                    exact=False) -> float:
    """Compare lists of per-rank arrays; the location names the rank."""
    yours = as_shard_list(exercise, yours, len(target), where, what)
    err = 0.0
    for r, (y, t) in enumerate(zip(yours, target)):
        err = max(err, compare_arrays(exercise, y, t, where=f"{where}, rank {r}" if where else f"rank {r}",
                                what=what, axes=axes, tol=tol, hint=hint, exact=exact))
    return err


def _real_only(x) -> None:
    """TypeError for complex numbers or text, which ``float()`` would silently cast or parse."""
    raw = np.asarray(x)
    items = raw.ravel() if raw.dtype.kind == "O" else ()
    if raw.dtype.kind == "c" or any(isinstance(e, (complex, np.complexfloating)) for e in items):
        raise TypeError(f"it holds complex numbers (dtype {raw.dtype}); return real numbers")
    if raw.dtype.kind in "USV" or any(isinstance(e, (str, bytes)) for e in items):
        raise TypeError(f"it holds text (dtype {raw.dtype}), not numbers")


def _number(exercise, x, where, what) -> float:
    try:
        _real_only(x)
        val = float(x)
    except (TypeError, ValueError) as exc:
        fail_check(exercise, where, f"{what} should be a real number, got {type(x).__name__} ({exc})",
              show=False, hint="return one number (a Python float or a NumPy scalar)")
    return val


def close_number(exercise, yours, target, *, where, what, rel=1e-9, hint=""):
    """One number, to a relative error ``rel`` (the float32 one for a float32 answer);
    float16 is refused."""
    rel = tolerance(yours, rel)
    if precision_of(yours) == "half":
        fail_check(exercise, where, half_message(what), show=False, hint=HALF_HINT)
    yours = _number(exercise, yours, where, what)
    if not (math.isfinite(yours) and abs(yours - target) <= rel * max(1.0, abs(target))):
        fail_check(exercise, where, f"{what} differs", yours, float(target), hint)


# --------------------------------------------------------------------------- inputs and types
def _snapshot(x):
    """A copy of the data passed to the student: arrays and (nested) lists/tuples are
    copied, anything else (numbers, a callable op) is kept as it is."""
    if isinstance(x, np.ndarray):
        return x.copy()
    if isinstance(x, (list, tuple)):
        return type(x)(_snapshot(y) for y in x)
    return x


def _changed(before, after, name: str):
    """Where ``after`` differs from the copy ``before`` (e.g. ``"xs[0]"``), or None."""
    if isinstance(before, np.ndarray):
        if not isinstance(after, np.ndarray) or after.shape != before.shape or \
                not np.array_equal(after, before, equal_nan=before.dtype.kind == "f"):
            return name
        return None
    if isinstance(before, (list, tuple)):
        if not isinstance(after, (list, tuple)) or len(after) != len(before):
            n = len(after) if hasattr(after, "__len__") else "?"
            held = plural(n, "entry", "entries") if isinstance(n, int) else f"{n} entries"
            return f"{name} (it now holds {held}, not {len(before)})"
        for i, (b, a) in enumerate(zip(before, after)):
            where = _changed(b, a, f"{name}[{i}]")
            if where:
                return where
    return None


def run_student(exercise: str, fn, names, *args, **kwargs):
    """Call the student's function (through :func:`_call`) on ``args`` and check afterwards
    that it left them unchanged; ``names`` are the parameter names used in the message."""
    kept = [_snapshot(a) for a in args]
    out = _call(fn, *args, exercise=exercise, **kwargs)
    for name, before, after in zip(names, kept, args):
        where = _changed(before, after, name)
        if where:
            fail_check(exercise, "", f"your function changed its input {where} in place", show=False,
                  hint="leave the inputs as they are (the notebook's rule): build new arrays "
                       "and lists for your results; +=, slice assignment, .sort() or .pop() on "
                       "an argument change the caller's data, which later cells still use")
    return out


def as_pair(exercise, out, where, what: str):
    """The two entries of a pair: any sequence or array of length 2 is accepted."""
    if isinstance(out, np.ndarray) and out.ndim >= 1 and out.shape[0] == 2:
        return out[0], out[1]
    if isinstance(out, Sequence) and not isinstance(out, (str, bytes)) and len(out) == 2:
        return out[0], out[1]
    fail_check(exercise, where, f"return a pair {what}; got "
          f"{type(out).__name__}" + (f" of length {len(out)}" if hasattr(out, "__len__") else ""),
          show=False, hint=f"return both values, {what.strip('()')}, as a pair (a tuple; a "
                           f"list or an array of two entries is fine too)")


def int_array(exercise, x, where, what, hint="") -> np.ndarray:
    """``x`` as an array that must already hold integers (ids are integers: a float id
    cannot index an array and hides a bug)."""
    try:
        _real_only(x)
        arr = np.asarray(x)
    except (TypeError, ValueError) as exc:
        fail_check(exercise, where, f"{what} is not an array of integers ({type(x).__name__}: {exc})",
              show=False, hint=hint)
    if arr.dtype.kind not in "iu":
        fail_check(exercise, where, f"{what} must be an integer array, got dtype {arr.dtype}",
              show=False, hint=hint or "ids are integers: build them with np.arange / np.argsort, "
                                       "or convert with .astype(int)")
    return arr


def bool_array(exercise, x, where, what, hint="") -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind != "b":
        fail_check(exercise, where, f"{what} must be a boolean array (True = kept), got dtype {arr.dtype}",
              show=False, hint=hint or "a boolean array (dtype bool, or the result of a comparison); "
                                       "a 0/1 integer array used as a mask picks rows 0 and 1 instead")
    return arr


def log_int(rng, lo: int, hi: int, upper: bool = False) -> int:
    """An integer in ``lo..hi`` drawn log-uniformly: small and large sizes alike, from a range
    far too large to tabulate the answers of. ``upper``: from the upper half of the range on
    a log scale only (``sqrt(lo hi) .. hi``), so that a batch surely holds large cases."""
    if upper:
        lo = int(math.ceil(math.sqrt(lo * hi)))
    return int(min(hi, max(lo, math.floor(float(np.exp(rng.uniform(np.log(lo), np.log(hi + 1))))))))


def _is_number(x) -> bool:
    return isinstance(x, numbers.Real) or (isinstance(x, np.ndarray) and x.ndim == 0)
