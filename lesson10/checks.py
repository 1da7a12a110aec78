"""Check functions for the exercise notebooks.

Every exercise has one ``check_<exercise>(student_fn)``. It runs the student's
function on fresh random cases (never the ones shown in the notebook) and
compares the result with the reference in :mod:`lesson10.sim`,
:mod:`lesson10.layouts` or :mod:`lesson10.cost`:

* right: prints one line saying what was verified (for example the max error);
* wrong: raises :class:`CheckFailed` (an ``AssertionError``) saying what differs
  and where (rank, round, query, head, expert), yours vs. the target, and a hint;
* still a stub (it raises ``NotImplementedError``): prints "not attempted" and
  returns normally, so an untouched exercise notebook runs top to bottom.

Each call records its outcome ``{"exercise", "passed", "points", "max_points",
"status", "message"}`` in :data:`OUTCOMES` and, when the environment variable
``LESSON10_GRADE_FILE`` names a file, appends it there as one JSON line: that is
how ``python -m lesson10 grade`` collects the results from the notebook's kernel.
"""
from __future__ import annotations

import functools
import json
import math
import os
from dataclasses import dataclass

import numpy as np

__all__ = [
    "CheckFailed",
    "OUTCOMES",
    "EXERCISES",
    "GRADE_FILE_ENV",
    "summary",
    "fallback",
]

GRADE_FILE_ENV = "LESSON10_GRADE_FILE"

#: every outcome recorded in this process, in call order
OUTCOMES: list[dict] = []


class CheckFailed(AssertionError):
    """A check found a wrong answer; the message says what, where and why."""


@dataclass(frozen=True)
class Exercise:
    id: str
    notebook: str
    points: int
    title: str


#: exercise id -> Exercise, filled by the ``@_exercise`` decorator below
EXERCISES: dict[str, Exercise] = {}


# --------------------------------------------------------------------------- recording
def _record(exercise: str, passed: bool, status: str, message: str = "") -> dict:
    ex = EXERCISES[exercise]
    outcome = {
        "exercise": exercise,
        "notebook": ex.notebook,
        "passed": bool(passed),
        "points": ex.points if passed else 0,
        "max_points": ex.points,
        "status": status,              # "passed" | "failed" | "not attempted"
        "message": message,
    }
    OUTCOMES.append(outcome)
    path = os.environ.get(GRADE_FILE_ENV)
    if path:
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps(outcome) + "\n")
        except OSError as exc:        # grading problem, not the student's: say so, go on
            print(f"(could not record this outcome in {GRADE_FILE_ENV}={path!r}: {exc})")
    return outcome


def summary() -> None:
    """Print the outcome of the latest call of every check run in this kernel."""
    latest = {o["exercise"]: o for o in OUTCOMES}
    if not latest:
        print("no check has run yet")
        return
    got = sum(o["points"] for o in latest.values())
    total = sum(o["max_points"] for o in latest.values())
    for o in latest.values():
        print(f"  {o['exercise']:<22s} {o['status']:<14s} {o['points']}/{o['max_points']}")
    print(f"  {'total':<22s} {'':<14s} {got}/{total}")


_FALLBACK_SAID: set = set()


def fallback(student_fn, reference_fn):
    """``student_fn``, or ``reference_fn`` while the student's function is still a stub.

    Notebook cells that *use* an exercise call it through this wrapper, so an untouched
    exercise notebook still runs top to bottom; the first time the reference stands in,
    it says so.
    """
    name = getattr(student_fn, "__name__", "this function")

    @functools.wraps(student_fn)
    def call(*args, **kwargs):
        try:
            return student_fn(*args, **kwargs)
        except NotImplementedError:
            if name not in _FALLBACK_SAID:
                print(f"({name} is not written yet: the course's reference stands in for it)")
                _FALLBACK_SAID.add(name)
            return reference_fn(*args, **kwargs)

    return call


# --------------------------------------------------------------------------- the decorator
class _StudentError(Exception):
    """The student's function raised something other than NotImplementedError."""


def _call(fn, *args, **kwargs):
    """Call the student's function; NotImplementedError passes through, any other error
    becomes a CheckFailed that names the function and the error."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        raise
    except CheckFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - any bug in student code is reported
        name = getattr(fn, "__name__", "your function")
        called = ", ".join(_describe(a) for a in args)
        raise _StudentError(
            f"{name} raised {type(exc).__name__}: {exc}\n"
            f"  it was called with: {called}\n"
            f"hint: the traceback above shows the line; try your function on the example "
            f"in the notebook first") from exc


def _describe(x) -> str:
    if isinstance(x, np.ndarray):
        return f"array{x.shape}"
    if isinstance(x, (list, tuple)) and x and all(isinstance(y, np.ndarray) for y in x):
        shapes = sorted({y.shape for y in x})
        return f"list of {len(x)} arrays of shape {shapes[0] if len(shapes) == 1 else shapes}"
    if callable(x):
        return getattr(x, "__name__", "a function")
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def _exercise(exercise: str, notebook: str, points: int, title: str):
    """Turn ``body(student_fn, rng) -> success text`` into a public check function."""
    EXERCISES[exercise] = Exercise(exercise, notebook, points, title)

    def decorate(body):
        @functools.wraps(body)
        def check(student_fn, *, seed: int | None = None) -> None:
            if not callable(student_fn):
                raise TypeError(
                    f"check_{exercise} takes your function itself, e.g. check_{exercise}({exercise}), "
                    f"not the result of calling it (got {type(student_fn).__name__})")
            module = getattr(student_fn, "__module__", "") or ""
            if module.startswith("lesson10."):
                msg = (f"check_{exercise}: {module}.{getattr(student_fn, '__name__', '?')} is the "
                       f"course's reference, not your function; pass the function you wrote")
                _record(exercise, False, "failed", msg)
                raise CheckFailed(msg)
            rng = np.random.default_rng(seed)
            try:
                verified = body(student_fn, rng)
            except NotImplementedError:
                _record(exercise, False, "not attempted")
                print(f"check_{exercise}: not attempted (your function, or one it calls, still "
                      f"raises NotImplementedError; write it and run this cell again)")
                return None
            except CheckFailed as exc:
                _record(exercise, False, "failed", str(exc))
                raise
            except _StudentError as exc:
                msg = f"check_{exercise} failed: {exc}"
                _record(exercise, False, "failed", msg)
                raise CheckFailed(msg) from exc.__cause__
            except Exception as exc:
                _record(exercise, False, "failed", f"check error: {type(exc).__name__}: {exc}")
                raise
            _record(exercise, True, "passed", verified)
            print(f"check_{exercise} passed: {verified}")
            return None

        del check.__wrapped__                  # help() shows check(student_fn, *, seed=None)
        check.exercise = exercise
        return check

    return decorate


# --------------------------------------------------------------------------- comparing
def _fail(exercise: str, where: str, what: str, yours=None, target=None, hint: str = "",
          show: bool = True):
    lines = [f"check_{exercise} failed: {where + ': ' if where else ''}{what}"]
    if show:
        lines.append(f"  yours : {_fmt(yours)}")
        lines.append(f"  target: {_fmt(target)}")
    if hint:
        lines.append(f"hint: {hint}")
    raise CheckFailed("\n".join(lines))


def _fmt(x) -> str:
    if isinstance(x, np.ndarray):
        if x.size > 16:
            return np.array2string(x.ravel()[:16], precision=4) + f" ... (shape {x.shape})"
        return np.array2string(x, precision=4)
    if isinstance(x, (float, np.floating)):
        return f"{float(x):.6g}"
    return repr(x)


def _as_array(exercise, x, where, what) -> np.ndarray:
    try:
        _real_only(x)
        arr = np.asarray(x, dtype=float)
    except (TypeError, ValueError) as exc:
        _fail(exercise, where, f"{what} is not an array of real numbers ({type(x).__name__}: {exc})",
              show=False, hint="return NumPy arrays of real numbers")
    return arr


def _locate(index, axes) -> str:
    parts = []
    for name, i in zip(axes, index):
        if name:
            parts.append(f"{name} {i}")
    return ", ".join(parts)


def _compare(exercise, yours, target, *, where: str, what: str, axes=(), tol=1e-9,
             hint: str = "", exact: bool = False) -> float:
    """Compare arrays: shape, then non-finite values, then values. Returns the max error."""
    target = np.asarray(target, dtype=float)
    yours = _as_array(exercise, yours, where, what)
    if yours.shape != target.shape:
        _fail(exercise, where, f"{what} has shape {yours.shape}, expected {target.shape}",
              show=False, hint=hint)
    same_inf = np.isinf(yours) & np.isinf(target) & (np.sign(yours) == np.sign(target))
    bad_nan = np.isnan(yours) & ~np.isnan(target)
    if bad_nan.any():
        idx = tuple(int(i) for i in np.argwhere(bad_nan)[0])
        _fail(exercise, where, f"{what} has NaN at {_locate(idx, axes) or idx}",
              yours[idx], target[idx], hint)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(same_inf, 0.0, np.abs(yours - target))
    diff = np.where(np.isnan(diff), np.inf, diff)
    limit = 0.0 if exact else tol * (1.0 + np.where(np.isfinite(target), np.abs(target), 0.0))
    wrong = diff > limit
    if wrong.any():
        idx = tuple(int(i) for i in np.argwhere(wrong)[0])
        n_wrong = int(wrong.sum())
        _fail(exercise, where,
              f"{what} differs at {_locate(idx, axes) or idx} ({n_wrong} of {wrong.size} entries wrong)",
              yours[idx] if yours.ndim else yours, target[idx] if target.ndim else target, hint)
    finite = diff[np.isfinite(diff)]
    return float(finite.max()) if finite.size else 0.0


def _as_list(exercise, out, n, where, what) -> list:
    if isinstance(out, np.ndarray) and out.ndim >= 1 and out.dtype != object:
        out = list(out)
    if not isinstance(out, (list, tuple)):
        _fail(exercise, where, f"{what} should be a list with one array per rank, got "
              f"{type(out).__name__}", show=False)
    if len(out) != n:
        _fail(exercise, where, f"{what} should hold {n} arrays (one per rank), got {len(out)}",
              show=False)
    return list(out)


def _compare_shards(exercise, yours, target, *, where, what, axes, tol=1e-9, hint="",
                    exact=False) -> float:
    """Compare lists of per-rank arrays; the location names the rank."""
    yours = _as_list(exercise, yours, len(target), where, what)
    err = 0.0
    for r, (y, t) in enumerate(zip(yours, target)):
        err = max(err, _compare(exercise, y, t, where=f"{where}, rank {r}" if where else f"rank {r}",
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
        _fail(exercise, where, f"{what} should be a real number, got {type(x).__name__} ({exc})",
              show=False)
    return val


def _close_number(exercise, yours, target, *, where, what, rel=1e-9, hint=""):
    yours = _number(exercise, yours, where, what)
    if not (math.isfinite(yours) and abs(yours - target) <= rel * max(1.0, abs(target))):
        _fail(exercise, where, f"{what} differs", yours, float(target), hint)


# =========================================================================== 01 sequence parallel
NB01 = "01_sequence_parallel"


def _sp_case(rng):
    t = int(rng.choice([2, 3, 4]))
    c = int(rng.integers(1, 4))
    h = int(rng.integers(2, 7))
    s = t * c
    if s == h:          # keep s != h so an axis mix-up shows in the shape
        h += 1
    xs = [rng.standard_normal((s, h)) for _ in range(t)]
    return t, s, h, xs


def _one_per_rank(exercise, out, where, shape, hint):
    """A single 2-D array where a list of per-rank arrays is due: say that plainly (a
    generic check would count its rows as ranks)."""
    if isinstance(out, np.ndarray) and out.ndim == 2:
        _fail(exercise, where, f"you returned one array of shape {out.shape}; return a list "
              f"with one {shape} array per rank", show=False, hint=hint)


@_exercise("reduce_scatter", NB01, 1, "reduce-scatter along the sequence")
def check_reduce_scatter(reduce_scatter, rng):
    """``reduce_scatter(xs) -> list``: ``xs[r]`` is rank r's ``(s, h)`` partial sum; rank r
    must get the sum over ranks of rows ``r*s/t .. (r+1)*s/t - 1``."""
    from .sim.comm import SimGroup
    err, cases = 0.0, 6
    for case in range(cases):
        t, s, h, xs = _sp_case(rng)
        target = SimGroup(t).reduce_scatter([x.copy() for x in xs], axis=0)
        out = _call(reduce_scatter, [x.copy() for x in xs])
        _one_per_rank("reduce_scatter", out, f"case {case} (t={t}, s={s}, h={h})", "(s/t, h)",
                      hint="rank i gets only block i (rows i*s/t .. (i+1)*s/t - 1) of the sum")
        err = max(err, _compare_shards(
            "reduce_scatter", out, target, where=f"case {case} (t={t}, s={s}, h={h})",
            what="the summed shard", axes=("token", "hidden"),
            hint="rank r keeps the tokens r*s/t .. (r+1)*s/t - 1, summed over all t ranks; "
                 "the split is along the sequence (axis 0), the sum is over ranks"))
    return f"{cases} random cases (t in 2..4), max error {err:.1e}"


@_exercise("all_gather", NB01, 1, "all-gather along the sequence")
def check_all_gather(all_gather, rng):
    """``all_gather(shards) -> list``: every rank gets the ``t`` shards concatenated in
    rank order along the sequence axis."""
    from .sim.comm import SimGroup
    err, cases = 0.0, 6
    for case in range(cases):
        t, s, h, xs = _sp_case(rng)
        shards = [x[: s // t] for x in xs]
        target = SimGroup(t).all_gather([x.copy() for x in shards], axis=0)
        out = _call(all_gather, [x.copy() for x in shards])
        _one_per_rank("all_gather", out, f"case {case} (t={t}, s={s}, h={h})", "(t*c, h)",
                      hint="every rank ends with its own copy of the full tensor, e.g. "
                           "[full.copy() for _ in shards]")
        err = max(err, _compare_shards(
            "all_gather", out, target, where=f"case {case} (t={t}, s={s}, h={h})",
            what="the gathered tensor", axes=("token", "hidden"),
            hint="every rank ends with all shards, rank 0's tokens first, stacked along the "
                 "sequence (axis 0)"))
    return f"{cases} random cases, every rank holds all tokens in rank order, max error {err:.1e}"


def _layer_norm(x):
    mu = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5)


@_exercise("sp_forward", NB01, 2, "SP: reduce-scatter, token-wise op, all-gather")
def check_sp_forward(sp_forward, rng):
    """``sp_forward(partials, op) -> list``: the row-parallel partial sums go through
    reduce-scatter, ``op`` on each rank's ``s/t`` tokens, and all-gather. Must equal
    ``op(sum(partials))`` on every rank, and ``op`` must never see more than ``s/t`` tokens."""
    err, cases = 0.0, 5
    for case in range(cases):
        t, s, h, xs = _sp_case(rng)
        c = s // t
        scale = rng.uniform(0.5, 2.0, size=h)
        calls = []

        def op(x, _scale=scale, _calls=calls):
            x = np.asarray(x)
            _calls.append(x.shape)
            return np.tanh(_layer_norm(x) * _scale)

        full = np.tanh(_layer_norm(np.sum(xs, axis=0)) * scale)
        out = _call(sp_forward, [x.copy() for x in xs], op)
        where = f"case {case} (t={t}, s={s}, h={h})"
        err = max(err, _compare_shards(
            "sp_forward", out, [full] * t, where=where, what="the layer output",
            axes=("token", "hidden"),
            hint="sum the partials first (reduce-scatter), then apply op to each rank's summed "
                 "s/t tokens, then all-gather so that every rank returns the full (s, h) "
                 "tensor; op is not linear, so op(partial) summed is wrong"))
        if not calls:
            _fail("sp_forward", where, "op was never called", show=False,
                  hint="each rank applies op to its own s/t tokens")
        too_big = [shape for shape in calls if len(shape) < 1 or shape[0] != c]
        if too_big:
            _fail("sp_forward", where,
                  f"op was called on {too_big[0][0] if too_big[0] else '?'} tokens; under SP each "
                  f"rank runs it on its own s/t = {c} tokens",
                  too_big[0], (c, h),
                  hint="that is plain TP (all-reduce, then op on all s tokens on every rank): "
                       "apply op after the reduce-scatter, before the all-gather")
        if len(calls) != t:
            _fail("sp_forward", where, f"op was called {len(calls)} times, expected once per rank",
                  len(calls), t, hint="one call per rank, on that rank's shard")
    return (f"{cases} random cases: equals op(all-reduce) on every rank, op saw only s/t tokens "
            f"per rank, max error {err:.1e}")


@_exercise("sp_bytes", NB01, 1, "bytes of TP vs TP + SP")
def check_sp_bytes(sp_bytes, rng):
    """``sp_bytes(s, h, t, e=2) -> (tp_bytes, sp_bytes)``: bytes each GPU sends per layer in
    the forward pass with plain TP (2 all-reduces) and with TP + SP (2 reduce-scatters and
    2 all-gathers) of the ``s x h`` activation."""
    from . import cost
    cases = [(int(rng.integers(1, 64)) * t, int(rng.integers(8, 512)), t, int(e))
             for t, e in zip(rng.choice([2, 4, 8, 16], size=5), rng.choice([1, 2, 4], size=5))]
    cases.append((8192, 4096, 8, 2))        # the notebook's sizes; e = 2 so a missing e shows
    for s, h, t, e in cases:
        out = _call(sp_bytes, s, h, t, e)
        where = f"s={s}, h={h}, t={t}, e={e}"
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            _fail("sp_bytes", where, "return a pair (tp_bytes, sp_bytes)", out, "(tp, sp)",
                  show=False)
        target = cost.comm_bytes("sp", s, h, t, e=e)
        ar = cost.all_reduce_bytes(s * h * e, t)
        _close_number("sp_bytes", out[0], 2 * ar, where=where, what="TP bytes (2 all-reduces)",
                      hint="a ring all-reduce of n bytes sends 2 (t-1)/t n per GPU; the layer has two")
        _close_number("sp_bytes", out[1], target, where=where, what="TP + SP bytes (2 RS + 2 AG)",
                      hint="each reduce-scatter or all-gather of the s x h activation (n = s h e "
                           "bytes) sends (t-1)/t n per GPU")
    return f"{len(cases)} sizes: TP and TP + SP both send 4 (t-1)/t s h e bytes per GPU"


# =========================================================================== 02 ring attention
NB02 = "02_ring_attention"


def _qkv(rng, s, a, d, a_kv=None, scale=1.0):
    a_kv = a if a_kv is None else a_kv
    q = rng.standard_normal((s, a, d)) * scale
    k = rng.standard_normal((s, a_kv, d)) * scale
    v = rng.standard_normal((s, a_kv, d))
    return q, k, v


@_exercise("block_attention", NB02, 1, "attention of one block, with positions, mask and lse")
def check_block_attention(block_attention, rng):
    """``block_attention(q, k, v, q_pos, k_pos, causal=True) -> (out, lse)`` for ``q`` of
    shape ``(sq, a, d)`` and ``k, v`` of shape ``(sk, a, d)``; query i may see key j when
    ``k_pos[j] <= q_pos[i]`` (causal). A query that sees no key: out 0, lse -inf."""
    from .sim.attention import attention
    err = 0.0
    kinds = ["random positions, causal", "random positions, not causal",
             "later keys: some queries see no key", "all keys after all queries", "large scores",
             "diagonal block: keys at the same positions as the queries"]
    for case, kind in enumerate(kinds):
        a, d = int(rng.integers(1, 4)), int(rng.integers(2, 6))
        sq, sk = int(rng.integers(2, 6)), int(rng.integers(2, 6))
        if kind.startswith("diagonal"):
            sk = sq                                # a rank's own block: key j == query j
        causal = "not causal" not in kind
        q = rng.standard_normal((sq, a, d)) * (6.0 if kind == "large scores" else 1.0)
        k = rng.standard_normal((sk, a, d)) * (6.0 if kind == "large scores" else 1.0)
        v = rng.standard_normal((sk, a, d))
        perm = rng.permutation(sq + sk + 4)
        q_pos, k_pos = np.sort(perm[:sq]), np.sort(perm[sq:sq + sk])
        if kind.startswith("later keys"):
            q_pos = np.arange(sq) * 2 + 1          # query 0 (pos 1) sees only keys at 0/1
            k_pos = np.arange(sk) * 2 + 2          # so query 0 sees nothing
        if kind.startswith("all keys after"):
            q_pos, k_pos = np.arange(sq), np.arange(sk) + sq
        if kind.startswith("diagonal"):
            k_pos = q_pos.copy()                   # key == query is visible (<=, not <)
        q_pos, k_pos = rng.permutation(q_pos), rng.permutation(k_pos)   # any order must work
        o_t, l_t = attention(q, k, v, causal=causal, q_pos=q_pos, k_pos=k_pos)
        out = _call(block_attention, q.copy(), k.copy(), v.copy(), q_pos.copy(), k_pos.copy(), causal)
        where = f"case {case} ({kind}, sq={sq}, sk={sk}, a={a}, d={d})"
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            _fail("block_attention", where, "return a pair (out, lse)", show=False)
        hint = ("scores = q.k / sqrt(d) per head; mask key j for query i when k_pos[j] > q_pos[i] "
                "(use the positions, not the row numbers; a key at the query's own position is "
                "visible); subtract the row max before exp; a row with no visible key has out 0 "
                "and lse -inf")
        err = max(err, _compare("block_attention", out[1], l_t, where=where, what="lse",
                                axes=("query", "head"), hint=hint))
        err = max(err, _compare("block_attention", out[0], o_t, where=where, what="out",
                                axes=("query", "head", "dim"), hint=hint))
    return (f"{len(kinds)} random cases (shuffled positions, empty rows, large scores, a diagonal "
            f"block), max error {err:.1e}")


@_exercise("merge", NB02, 1, "the logsumexp merge of two partial results")
def check_merge(merge, rng):
    """``merge(o1, lse1, o2, lse2) -> (o, lse)`` with ``o`` of shape ``(s, a, d)`` and ``lse``
    of shape ``(s, a)``: the exact attention over the union of two disjoint key sets."""
    from .sim.attention import merge as ref_merge
    err = 0.0
    kinds = ["ordinary", "large lse (about +800)", "small lse (about -800)",
             "one side saw no key (lse -inf)", "both sides saw no key"]
    for case, kind in enumerate(kinds):
        s, a, d = int(rng.integers(2, 6)), int(rng.integers(1, 4)), int(rng.integers(2, 5))
        o1, o2 = rng.standard_normal((s, a, d)), rng.standard_normal((s, a, d))
        l1, l2 = rng.standard_normal((s, a)) * 2, rng.standard_normal((s, a)) * 2
        if kind.startswith("large"):
            l1, l2 = l1 + 800, l2 + 800
        if kind.startswith("small"):
            l1, l2 = l1 - 800, l2 - 800
        if kind.startswith("one side"):
            mask = rng.random((s, a)) < 0.5
            mask[0, 0] = True
            l2 = np.where(mask, -np.inf, l2)
            o2 = np.where(mask[..., None], 0.0, o2)
        if kind.startswith("both"):
            l1 = np.where(np.arange(s)[:, None] % 2 == 0, -np.inf, l1)
            o1 = np.where(np.isinf(l1)[..., None], 0.0, o1)
            l2 = l1.copy()
            o2 = np.where(np.isinf(l2)[..., None], 0.0, o2)
        o_t, l_t = ref_merge(o1, l1, o2, l2)
        out = _call(merge, o1.copy(), l1.copy(), o2.copy(), l2.copy())
        where = f"case {case} ({kind})"
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            _fail("merge", where, "return a pair (o, lse)", show=False)
        hint = ("lse = m + log(exp(lse1 - m) + exp(lse2 - m)) with m = max(lse1, lse2), so exp never "
                "overflows; o = exp(lse1 - lse) o1 + exp(lse2 - lse) o2; where both lse are -inf, "
                "use m = 0 (or np.where) so you get lse = -inf and o = 0, not NaN")
        err = max(err, _compare("merge", out[1], l_t, where=where, what="lse", axes=("query", "head"),
                                hint=hint))
        err = max(err, _compare("merge", out[0], o_t, where=where, what="o",
                                axes=("query", "head", "dim"), hint=hint))
    return f"{len(kinds)} random cases (incl. lse of +-800 and -inf), max error {err:.1e}"


def _diagnose(exercise, out, candidates: dict, where: str) -> None:
    """If the answer equals a known mistake (attention without the mask, the mask on row
    numbers instead of global positions), say so: clearer than a wrong number."""
    try:
        yours = [np.asarray(o, dtype=float) for o in out]
    except (TypeError, ValueError):
        return
    for name, cand in candidates.items():
        if len(cand) == len(yours) and all(y.shape == c.shape and np.allclose(y, c, atol=1e-9)
                                           for y, c in zip(yours, cand)):
            _fail(exercise, where, f"your output equals {name}", show=False,
                  hint="query i may see key j only when the global position of j is <= that of "
                       "i: compare the token ids passed in `positions`, not row numbers")


def _mask_mistakes(q, k, v, pos, local_rows: bool):
    """Outputs of the two classic mask mistakes, split per rank like the answer."""
    from .sim.attention import attention
    out = {"attention without the causal mask": [attention(q, k, v)[0][p] for p in pos]}
    order = np.concatenate(pos)
    if local_rows:      # ring: each block's rows numbered 0..c-1
        k_loc = np.concatenate([np.arange(len(p)) for p in pos])
        out["the causal mask on row numbers within each block"] = [
            attention(q[p], k[order], v[order], causal=True, q_pos=np.arange(len(p)),
                      k_pos=k_loc)[0] for p in pos]
    else:               # Ulysses: the gathered tokens numbered 0..s-1 in stacking order
        o = attention(q[order], k[order], v[order], causal=True)[0]
        bounds = np.cumsum([0] + [len(p) for p in pos])
        out["the causal mask on row numbers 0..s-1 instead of the positions"] = [
            o[bounds[r]:bounds[r + 1]] for r in range(len(pos))]
    return out


def _ring_cases(rng):
    cases = []
    for layout in ("contiguous", "zigzag", "striped"):
        for causal in (True, False):
            n = int(rng.choice([2, 3, 4]))
            s = 2 * n * int(rng.integers(1, 3))
            cases.append((layout, causal, n, s))
    return cases


@_exercise("ring_attention", NB02, 2, "the ring loop")
def check_ring_attention(ring_attention, rng):
    """``ring_attention(q_shards, k_shards, v_shards, positions, causal=True) -> list`` of
    output shards; ``positions[r]`` are the global token ids of rank r. Must equal
    full attention on the whole sequence."""
    from .layouts import shard_positions
    from .sim.attention import attention
    err = 0.0
    cases = _ring_cases(rng)
    for layout, causal, n, s in cases:
        a, d = int(rng.integers(1, 3)), int(rng.integers(2, 5))
        q, k, v = _qkv(rng, s, a, d, scale=1.5)
        pos = shard_positions(s, n, layout)
        out_full, _ = attention(q, k, v, causal=causal)
        target = [out_full[p] for p in pos]
        out = _call(ring_attention, [q[p].copy() for p in pos], [k[p].copy() for p in pos],
                    [v[p].copy() for p in pos], [p.copy() for p in pos], causal)
        try:
            err = max(err, _compare_shards(
                "ring_attention", out, target,
                where=f"{layout} layout, causal={causal}, N_c={n}, s={s}", what="output",
                axes=("local query", "head", "dim"),
                hint="n rounds; in round k rank r uses the K/V block of rank (r - k) mod n with the "
                     "global positions of both blocks (the mask compares positions), then merges "
                     "(out, lse) into its running result, starting from out = 0, lse = -inf"))
        except CheckFailed:
            if causal:      # name the classic mistakes when they are the cause
                _diagnose("ring_attention", out, _mask_mistakes(q, k, v, pos, local_rows=True),
                          f"{layout} layout, causal=True, N_c={n}, s={s}")
            raise
    return (f"{len(cases)} random cases (contiguous/zigzag/striped, causal and not, N_c in 2..4) "
            f"match full attention, max error {err:.1e}")


# =========================================================================== 03 load balance
NB03 = "03_load_balance"


@_exercise("zigzag_positions", NB03, 1, "the zig-zag layout")
def check_zigzag_positions(zigzag_positions, rng):
    """``zigzag_positions(s, n) -> list`` of ``n`` int arrays: rank r holds chunk r and chunk
    2n-1-r of the 2n chunks of s/(2n) tokens, in increasing order."""
    from .layouts import shard_positions
    cases = [(2 * n * m, n) for n, m in zip(rng.integers(2, 9, size=5), rng.integers(1, 5, size=5))]
    cases.append((8, 4))
    for s, n in cases:
        s, n = int(s), int(n)
        target = shard_positions(s, n, "zigzag")
        out = _call(zigzag_positions, s, n)
        _compare_shards("zigzag_positions", out, target, where=f"s={s}, N_c={n}",
                        what="token id", axes=("slot",), exact=True,
                        hint=f"cut the sequence into 2n = {2 * n} chunks of s/(2n) = {s // (2 * n)} "
                             f"tokens; rank r takes chunk r and chunk 2n-1-r (rank 0: the first "
                             f"and the last chunk), chunk r's ids first, so each array is sorted")
    return f"{len(cases)} cases (N_c in 2..8): every rank holds chunks r and 2N_c-1-r"


@_exercise("causal_work", NB03, 2, "causal work per round and rank")
def check_causal_work(causal_work, rng):
    """``causal_work(positions) -> array (rounds, ranks)``: ``work[k, r]`` counts the pairs
    (query in ``positions[r]``, key in ``positions[(r-k) % n]``) with key <= query."""
    from .layouts import causal_work as ref_work, shard_positions
    cases = []
    for layout in ("contiguous", "zigzag", "striped"):
        n = int(rng.integers(3, 7))
        cases.append((layout, n, 2 * n * int(rng.integers(1, 4))))
    for layout, n, s in cases:
        target = ref_work(n, layout, s=s)
        out = _call(causal_work, [p.copy() for p in shard_positions(s, n, layout)])
        _compare("causal_work", out, target, where=f"{layout} layout, s={s}, N_c={n}",
                 what="work", axes=("round", "rank"), exact=True,
                 hint="rows are rounds, columns are ranks; in round k rank r holds the K/V of "
                      "rank (r - k) mod N_c; count pairs with key <= query (the diagonal counts)")
    return f"{len(cases)} random cases (contiguous, zigzag, striped; N_c in 3..6) match pair counts"


@_exercise("ring_time", NB03, 1, "ring time")
def check_ring_time(ring_time, rng):
    """``ring_time(work) -> number``: every round lasts as long as its busiest rank, so the
    ring takes ``sum over rounds of max over ranks``."""
    from .layouts import causal_work as ref_work, ring_time as ref_time
    cases = [rng.integers(0, 20, size=(int(n), int(n))) for n in rng.integers(3, 7, size=4)]
    cases += [ref_work(n, lay) for n, lay in ((4, "contiguous"), (5, "zigzag"))]
    for i, work in enumerate(cases):
        out = _call(ring_time, work.copy())
        _close_number("ring_time", out, ref_time(work), where=f"case {i} (work of shape {work.shape})",
                      what="ring time",
                      hint="work[k, r] is round k, rank r; all ranks wait for the slowest in each "
                           "round: sum over rounds (axis 0) of the max over ranks (axis 1)")
    return f"{len(cases)} cases (random work matrices and the lesson's layouts)"


# =========================================================================== 04 Ulysses
NB04 = "04_ulysses"


def _ulysses_case(rng, gqa=False):
    n = int(rng.choice([2, 3, 4]))
    c = int(rng.integers(1, 3))
    a_kv = n * int(rng.integers(1, 3))
    a = a_kv * (2 if gqa else 1)
    d = int(rng.integers(2, 4))
    return n, n * c, a, a_kv, d


@_exercise("seq_to_heads", NB04, 1, "all-to-all: sequence shards -> head shards")
def check_seq_to_heads(seq_to_heads, rng):
    """``seq_to_heads(shards) -> list``: ``shards[r]`` is ``(s/n, a, d)`` (tokens of rank r,
    every head); rank r must end with ``(s, a/n, d)``: every token, heads ``r a/n ..``."""
    from .sim.comm import SimGroup
    from .sim.ulysses import seq_to_heads as ref
    cases = 5
    for case in range(cases):
        n, s, a, _, d = _ulysses_case(rng)
        x = rng.standard_normal((s, a, d))
        shards = np.split(x, n, axis=0)
        target = ref([y.copy() for y in shards], SimGroup(n))
        out = _call(seq_to_heads, [y.copy() for y in shards])
        _compare_shards("seq_to_heads", out, target, where=f"case {case} (n={n}, s={s}, a={a})",
                        what="head shard", axes=("token", "local head", "dim"), exact=True,
                        hint="rank i cuts its tokens by head groups and sends group j to rank j; "
                             "rank j stacks what it receives along the token axis, rank 0's "
                             "tokens first")
    return f"{cases} random cases: rank r holds all tokens of heads r a/n .. (r+1) a/n - 1"


@_exercise("heads_to_seq", NB04, 1, "all-to-all: head shards -> sequence shards")
def check_heads_to_seq(heads_to_seq, rng):
    """``heads_to_seq(shards) -> list``: the inverse of ``seq_to_heads``."""
    from .sim.comm import SimGroup
    from .sim.ulysses import heads_to_seq as ref
    cases = 5
    for case in range(cases):
        n, s, a, _, d = _ulysses_case(rng)
        x = rng.standard_normal((s, a, d))
        shards = np.split(x, n, axis=1)
        target = ref([y.copy() for y in shards], SimGroup(n))
        out = _call(heads_to_seq, [y.copy() for y in shards])
        _compare_shards("heads_to_seq", out, target, where=f"case {case} (n={n}, s={s}, a={a})",
                        what="sequence shard", axes=("local token", "head", "dim"), exact=True,
                        hint="rank i cuts its (s, a/n, d) tensor into n token blocks and sends "
                             "block j to rank j; rank j stacks what it receives along the head "
                             "axis, rank 0's heads first")
    return f"{cases} random cases: heads_to_seq undoes seq_to_heads"


@_exercise("ulysses_attention", NB04, 2, "Ulysses attention")
def check_ulysses_attention(ulysses_attention, rng):
    """``ulysses_attention(q_shards, k_shards, v_shards, positions, causal=True) -> list``
    of sequence-sharded outputs; K/V may have fewer heads than Q (GQA, ``a_kv`` a multiple
    of ``n``). Must equal full attention."""
    from .layouts import shard_positions
    from .sim.attention import attention
    err = 0.0
    cases = [("contiguous", True, False), ("zigzag", True, False), ("contiguous", False, False),
             ("zigzag", True, True)]
    for layout, causal, gqa in cases:
        n, s, a, a_kv, d = _ulysses_case(rng, gqa)
        s = 2 * s
        q, k, v = _qkv(rng, s, a, d, a_kv=a_kv, scale=1.5)
        pos = shard_positions(s, n, layout)
        out_full, _ = attention(q, k, v, causal=causal)
        target = [out_full[p] for p in pos]
        out = _call(ulysses_attention, [q[p].copy() for p in pos], [k[p].copy() for p in pos],
                    [v[p].copy() for p in pos], [p.copy() for p in pos], causal)
        try:
            err = max(err, _compare_shards(
                "ulysses_attention", out, target,
                where=f"{layout} layout, causal={causal}, n={n}, a={a}, a_kv={a_kv}", what="output",
                axes=("local query", "head", "dim"),
                hint="seq_to_heads on q, k and v; gather the positions of all tokens in the order "
                     "seq_to_heads stacks them; attention per rank on its heads; heads_to_seq back"
                     + ("; with GQA query head i reads K/V head i // g, which is what attention() "
                        "does when K/V have fewer heads (no np.tile of K/V)" if a_kv < a else "")))
        except CheckFailed:
            if causal:      # name the classic mistakes when they are the cause
                _diagnose("ulysses_attention", out, _mask_mistakes(q, k, v, pos, local_rows=False),
                          f"{layout} layout, causal=True, n={n}, a={a}, a_kv={a_kv}")
            raise
    return (f"{len(cases)} random cases (contiguous and zigzag, causal and not, GQA) match full "
            f"attention, max error {err:.1e}")


@_exercise("ulysses_bytes", NB04, 1, "bytes of Ulysses vs ring attention")
def check_ulysses_bytes(ulysses_bytes, rng):
    """``ulysses_bytes(s, h, n, g=1, e=2) -> float``: bytes each GPU sends per layer in the
    forward pass: four all-to-alls (Q, K, V, output); K and V have ``h/g`` columns."""
    from . import cost
    cases = []
    for n, g, e in zip(rng.choice([2, 4, 8], size=5), rng.choice([1, 2, 4, 8], size=5),
                       rng.choice([1, 2, 4], size=5)):
        cases.append((int(n) * int(rng.integers(1, 100)) * 8, int(g) * int(rng.integers(2, 64)),
                      int(n), int(g), int(e)))
    cases.append((4096, 1024, 4, 4, 2))          # always one GQA case
    for s, h, n, g, e in cases:
        out = _call(ulysses_bytes, s, h, n, g, e)
        _close_number("ulysses_bytes", out, cost.comm_bytes("ulysses", s, h, n, g=g, e=e),
                      where=f"s={s}, h={h}, N_c={n}, g={g}, e={e}", what="bytes per GPU",
                      hint="each rank holds s/N_c tokens; an all-to-all sends (N_c-1)/N_c of its "
                           "local tensor; Q and the output have h columns, K and V h/g")
    return f"{len(cases)} random sizes (with GQA) match (N_c-1)/N_c (2 + 2/g) s h e / N_c"


# =========================================================================== 05 MoE dispatch
NB05 = "05_moe_dispatch"


def _skewed_choices(rng, N, E, k, skew):
    """Top-k expert choices of N tokens whose router prefers a few experts."""
    logits = skew * rng.standard_normal(E)[None, :] + rng.gumbel(size=(N, E))
    return np.argsort(-logits, axis=1, kind="stable")[:, :k]


@_exercise("route_topk", NB05, 1, "top-k routing")
def check_route_topk(route_topk, rng):
    """``route_topk(logits, k) -> (experts, gates)``: for ``logits (T, E)``, the ``k`` experts
    with the largest logits per token (best first) and their gates, a softmax over the
    ``k`` chosen logits."""
    from .sim.moe import route_topk as ref
    cases = [(int(rng.integers(3, 9)), int(rng.integers(k + 2, 10)), k) for k in (1, 2, 3)]
    err = 0.0
    for T, E, k in cases:
        logits = rng.standard_normal((T, E)) * 2
        e_t, g_t = ref(logits, k)
        out = _call(route_topk, logits.copy(), k)
        where = f"T={T}, E={E}, k={k}"
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            _fail("route_topk", where, "return a pair (experts, gates)", show=False)
        experts = _as_array("route_topk", out[0], where, "experts")
        if experts.shape != e_t.shape:
            _fail("route_topk", where, f"experts has shape {experts.shape}, expected {e_t.shape}",
                  show=False, hint="one row per token, k expert ids per row")
        # any order of the k choices is fine, as long as the gates follow the experts
        order_y, order_t = np.argsort(experts, axis=1), np.argsort(e_t, axis=1)
        ey = np.take_along_axis(experts, order_y, 1)
        et = np.take_along_axis(e_t, order_t, 1)
        _compare("route_topk", ey, et, where=where, what="the set of chosen experts",
                 axes=("token", "choice"), exact=True,
                 hint="take the k largest logits of each token (np.argsort(-logits, axis=1)[:, :k])")
        gates = _as_array("route_topk", out[1], where, "gates")
        if gates.shape != g_t.shape:
            _fail("route_topk", where, f"gates has shape {gates.shape}, expected {g_t.shape}",
                  show=False, hint="one gate per chosen expert")
        gy = np.take_along_axis(gates, order_y, 1)
        gt = np.take_along_axis(g_t, order_t, 1)
        if not np.allclose(gy, gt, rtol=1e-9, atol=1e-9) and \
                np.allclose(np.sort(gates, 1), np.sort(g_t, 1), rtol=1e-9, atol=1e-9):
            t = int(np.argmax(~np.isclose(gy, gt, rtol=1e-9, atol=1e-9).all(1)))
            _fail("route_topk", where, f"token {t}: the gate values are right but they do not "
                  f"follow your experts (experts {experts[t].astype(int).tolist()})",
                  gates[t], gt[t][np.argsort(np.argsort(experts[t]))],
                  hint="gates[t, j] must be the gate of experts[t, j]: sort or reorder both "
                       "arrays together (np.take_along_axis with the same indices)")
        err = max(err, _compare("route_topk", gy, gt, where=where,
                                what="gate (in the order of your experts)", axes=("token", "choice"),
                                hint="gates = softmax over the k chosen logits only, so each row "
                                     "sums to 1 (not the softmax over all E experts)"))
    return f"{len(cases)} random cases (k = 1, 2, 3): right experts, gates max error {err:.1e}"


@_exercise("capacity", NB05, 2, "capacity factor: which copies are dropped")
def check_capacity(capacity_keep, rng):
    """``capacity_keep(experts, E, capacity_factor) -> bool (N, k)``: every expert accepts at
    most ``C = ceil(capacity_factor * k * N / E)`` copies, first come first served in token
    order; ``capacity_factor=None`` keeps everything."""
    from .sim.moe import capacity_keep as ref_keep, expert_capacity
    cases = [(N, E, k, cf) for (N, E, k), cf in zip(
        [(int(rng.integers(3, 9)) * 8, 8, 2), (60, 6, 1), (int(rng.integers(2, 6)) * 16, 16, 2),
         (40, 4, 3), (36, 8, 2), (24, 4, 2)],
        [1.0, 1.25, 1.5, 0.75, 1.25, None])]
    cases.append((10, 4, 1, 1.0))      # C = ceil(2.5) = 3, and expert 0 is wanted by all
    for N, E, k, cf in cases:
        experts = _skewed_choices(rng, N, E, k, skew=1.5)
        if (N, E, k, cf) == (10, 4, 1, 1.0):
            experts = np.zeros((N, 1), dtype=int)
            experts[rng.permutation(N)[:3], 0] = rng.integers(1, E, size=3)
        C = expert_capacity(N, E, k, cf)
        target = ref_keep(experts, E, C)
        out = _call(capacity_keep, experts.copy(), E, cf)
        where = f"N={N} tokens, E={E}, k={k}, capacity_factor={cf} (C = {C})"
        yours = _as_array("capacity", out, where, "keep")
        if yours.shape != target.shape:
            _fail("capacity", where, f"keep has shape {yours.shape}, expected {target.shape}",
                  show=False, hint="one True/False per (token, choice)")
        kept = [int(((experts == i) & (yours > 0.5)).sum()) for i in range(E)]
        want = [int(((experts == i) & target).sum()) for i in range(E)]
        if kept != want:
            i = int(np.argmax(np.array(kept) != np.array(want)))
            _fail("capacity", where, f"expert {i} keeps {kept[i]} copies",
                  kept[i], want[i],
                  hint="C = ceil(capacity_factor * k * N / E) (math.ceil), and an expert keeps a "
                       "copy while fewer than C copies have arrived before it")
        _compare("capacity", yours > 0.5, target, where=where, what="keep",
                 axes=("token", "choice"), exact=True,
                 hint="first come, first served in token order: token 0's choices, then token "
                      "1's, ...; an expert that is full drops every later copy")
    return f"{len(cases)} skewed routings (capacity factor 0.75 .. 1.5 and None) drop the right copies"


def _moe_case(rng, Ne, E, k, T, h, cf, e):
    """Route a random batch through the reference expert-parallel layer; return the
    choices, the kept copies, the byte ledger of its two all-to-alls and its stats."""
    from .sim.comm import SimGroup
    from .sim.moe import capacity_keep, expert_capacity, moe_layer, route_topk
    bias = 1.5 * rng.standard_normal(E)                  # a few popular experts
    x = [rng.standard_normal((T, h)) for _ in range(Ne)]
    W = rng.standard_normal((h, E))
    identity = [lambda z: z for _ in range(E)]           # the bytes do not depend on the experts
    group = SimGroup(Ne, e=e)
    _, stats = moe_layer(x, W, identity, k, capacity_factor=cf, group=group, bias=bias,
                         return_stats=True)
    chosen, _ = route_topk(np.concatenate(x) @ W, k, bias=bias)
    keep = capacity_keep(chosen, E, expert_capacity(Ne * T, E, k, cf))
    return chosen, keep, group.bytes_sent.copy(), stats


@_exercise("moe_stats", NB05, 2, "drops, all-to-all bytes and load per GPU")
def check_moe_stats(moe_stats, rng):
    """``moe_stats(experts, keep, Ne, E, h, e=2) -> dict`` with ``drop_rate`` (fraction of
    the ``N k`` copies dropped), ``bytes_per_gpu`` (array ``(Ne,)``: bytes each GPU sends in
    the dispatch and the combine; a kept copy whose expert is on another GPU costs ``h e``
    each way, a local or dropped copy nothing) and ``load_per_gpu`` (kept copies each GPU's
    experts compute). GPU ``g`` holds tokens ``g N/Ne .. (g+1) N/Ne - 1``; expert ``i`` is
    on GPU ``i // (E/Ne)``. Checked against the byte ledger of ``lesson10.sim.moe_layer``."""
    cases = [(4, 8, 2, 12, 4, 1.0, 2), (2, 4, 1, 10, 3, 1.25, 1), (4, 4, 2, 8, 5, None, 2),
             (3, 6, 2, 10, 4, 0.75, 4)]
    for Ne, E, k, T, h, cf, e in cases:
        chosen, keep, ledger, stats = _moe_case(rng, Ne, E, k, T, h, cf, e)
        out = _call(moe_stats, chosen.copy(), keep.copy(), Ne, E, h, e)
        where = (f"Ne={Ne} GPUs, E={E}, k={k}, {T} tokens per GPU, h={h}, e={e}, "
                 f"capacity_factor={cf}")
        if not isinstance(out, dict) or not {"drop_rate", "bytes_per_gpu", "load_per_gpu"} <= set(out):
            _fail("moe_stats", where, "return a dict with keys drop_rate, bytes_per_gpu, "
                  "load_per_gpu", show=False)
        _close_number("moe_stats", out["drop_rate"], stats["dropped"] / (Ne * T * k), where=where,
                      what="drop_rate", hint="dropped copies / (N k), with N tokens in total")
        _compare("moe_stats", out["load_per_gpu"], stats["load_per_gpu"], where=where,
                 what="load_per_gpu", axes=("GPU",),
                 hint="count the kept copies whose expert lives on each GPU (expert i is on GPU "
                      "i // (E/Ne)); dropped copies are not computed")
        _compare("moe_stats", out["bytes_per_gpu"], ledger, where=where, what="bytes_per_gpu",
                 axes=("GPU",),
                 hint="dispatch: GPU g sends h e bytes per kept copy of its tokens that goes to "
                      "another GPU; combine: it sends back h e bytes per copy it computed for "
                      "another GPU; local and dropped copies cost nothing")
    return f"{len(cases)} random routings: drops, loads and bytes match the simulated all-to-alls"


@_exercise("aux_loss", NB05, 1, "the Switch load-balancing loss")
def check_aux_loss(switch_aux_loss, rng):
    """``switch_aux_loss(probs, experts, alpha=1e-2) -> float``: ``alpha E sum_i f_i P_i`` with
    ``f_i`` the fraction of the ``T k`` copies routed to expert ``i`` and ``P_i`` the mean
    router probability of expert ``i``."""
    from .sim.moe import route_topk, router_probs, switch_aux_loss as ref
    cases = []
    for k, skew in ((1, 0.0), (2, 1.0), (2, 3.0), (3, 2.0)):
        T, E = int(rng.integers(16, 64)), int(rng.integers(4, 9))
        logits = skew * rng.standard_normal(E)[None, :] + rng.standard_normal((T, E))
        experts, _ = route_topk(logits, k)
        cases.append((router_probs(logits), experts, float(rng.choice([1e-2, 1e-3, 0.1]))))
    for probs, experts, alpha in cases:
        out = _call(switch_aux_loss, probs.copy(), experts.copy(), alpha)
        _close_number("aux_loss", out, ref(probs, experts, alpha),
                      where=f"T={probs.shape[0]}, E={probs.shape[1]}, k={experts.shape[1]}, "
                            f"alpha={alpha}", what="loss",
                      hint="f_i = (copies sent to expert i) / (T k) so that sum_i f_i = 1; P_i = "
                           "probs[:, i].mean(); loss = alpha * E * sum_i f_i P_i (= alpha when "
                           "routing is uniform)")
    return f"{len(cases)} random routings (k = 1..3, skewed): matches alpha E sum f_i P_i"


__all__ += [f"check_{name}" for name in EXERCISES]
