"""Checks of notebook 01: sequence parallelism."""
from __future__ import annotations

import numpy as np

from . import mistakes
from .core import (
    Cases,
    as_pair,
    close_number,
    compare_shards,
    fail_check,
    log_int,
    register_exercise,
    run_student,
)
from .diagnosis import Diagnosis
from .network import Referee, served_call, substituted
from .parts import in_part
from .served_sp import ServedSP

NB01 = "01_sequence_parallel"

# (t ranks, c tokens per rank, h, integer inputs): t = 1, c = 1, c > 1, h = 1, integers
_FIXED = [(1, 3, 2, False), (2, 1, 3, False), (3, 2, 5, False), (4, 3, 2, True), (2, 4, 1, False),
          (4, 2, 3, False)]
_RANDOM = 10


def _sizes(rng):
    t, c, h = int(rng.integers(2, 6)), int(rng.integers(1, 5)), int(rng.integers(1, 7))
    return t, c, h + (t * c == h), bool(rng.random() < 0.2)     # s != h: an axis mix-up shows


def _cases(rng, n_random=_RANDOM):
    """``(label, t, c, h, xs)``: the fixed cases, then the random batch; ``xs`` are t
    arrays (s, h) with s = t c (integers in some cases)."""
    out = []
    for i, size in enumerate(list(_FIXED) + [_sizes(rng) for _ in range(n_random)]):
        t, c, h, integer = size
        shape = (t * c, h)
        xs = [rng.integers(-9, 10, size=shape) if integer else rng.standard_normal(shape)
              for _ in range(t)]
        kind = "fixed" if i < len(_FIXED) else "random"
        out.append((f"{kind} case (t={t}, s={t * c}, h={h}{', integer inputs' if integer else ''})",
                    t, c, h, xs))
    return out


def _one_per_rank(exercise, out, where, shape, hint):
    """A single 2-D array where a list of per-rank arrays is due: say that plainly (a
    generic check would count its rows as ranks)."""
    if isinstance(out, np.ndarray) and out.ndim == 2:
        fail_check(exercise, where, f"you returned one array of shape {out.shape}; return a list "
              f"with one {shape} array per rank", show=False, hint=hint)


_ALIAS_HINT = ("aliasing: a result that is (or is a view of) an input array changes when the "
               "caller changes that input, and the other way round; at t = 1 the sum or the "
               "gather of one shard holds the same values as the shard, but the notebook's "
               "rule holds there too: build new arrays for your results (a copy where "
               "nothing else creates one)")


def aliased(out, inputs, name, where) -> str | None:
    """What a returned array shares memory with among the caller's ``inputs`` (the arrays
    ``name[i]``), as the text of a failure, or None: the exercise asks for new arrays, at
    t = 1 too. The check reports it after the values (a wrong value is the clearer lead)."""
    try:
        results = [o for o in out if isinstance(o, np.ndarray)]
    except TypeError:
        return None
    for r, o in enumerate(results):
        for i, x in enumerate(inputs):
            if isinstance(x, np.ndarray) and np.shares_memory(o, x):
                return (f"{where}: the result of rank {r} is your input {name}[{i}] itself (it "
                        f"shares its memory), not a new array")
    return None


def refuse_aliases(exercise, found) -> None:
    """Fail with the first aliasing that :func:`aliased` found, if any."""
    if found:
        fail_check(exercise, "", found[0], show=False, hint=_ALIAS_HINT)


def reduce_scatter_dtype_mistake(xs, out) -> str | None:
    """An integer accumulator: float partials summed into an integer array (every sum cut
    to a whole number), whether the result stays integer or is converted back."""
    parts = [np.asarray(x) for x in xs]
    if not parts or any(p.dtype.kind != "f" for p in parts):
        return None
    t = len(parts)
    total = np.sum([p.astype(float) for p in parts], axis=0)
    c = total.shape[0] // t
    blocks = [total[i * c:(i + 1) * c] for i in range(t)]
    try:
        arrs = [np.asarray(o) for o in out]
    except (TypeError, ValueError):
        return None
    text = ("your sums are whole numbers though the partials are floats: the accumulator has an "
            "integer dtype, so each addition is cut to an integer; give it the dtype of the "
            "partials")
    if len(arrs) == t and any(a.dtype.kind in "iu" for a in arrs):
        return text
    with np.errstate(all="ignore"):
        stepwise = [np.zeros_like(b) for b in blocks]
        for p in parts:
            stepwise = [np.trunc(acc + p[i * c:(i + 1) * c]) for i, acc in enumerate(stepwise)]
    if mistakes.same(arrs, [np.trunc(b) for b in blocks]) or mistakes.same(arrs, stepwise):
        return text
    return None


def _rs_hint(xs, out):
    """Every mistake the reduce-scatter of this case equals (the integer accumulator
    first), with the general hint."""
    def hint():
        general = ("rank i ends with one contiguous block of s/t tokens, block i, summed over "
                   "the partials of all t ranks")
        found = mistakes.explain(mistakes.reduce_scatter_mistake(xs, out), general).mistakes
        dtype = reduce_scatter_dtype_mistake(xs, out)
        return Diagnosis(((dtype,) if dtype else ()) + found, general)
    return hint


def _ag_hint(shards, out):
    return lambda: mistakes.explain(mistakes.all_gather_mistake(shards, out), (
        "every rank ends with the same (t c, h) tensor: all shards one after the other along "
        "the sequence axis, in rank order"))


@register_exercise("reduce_scatter", NB01, "reduce-scatter along the sequence",
                   withholds={
                       "lesson10.sim.comm.SimGroup.reduce_scatter": "adapter:group_reduce_scatter",
                       "lesson10.sim.comm.SimGroup.all_reduce": "adapter:group_all_reduce",
                       "lesson10.sim.comm.SimGroup._sum": None})
def check_reduce_scatter(reduce_scatter, rng):
    """``reduce_scatter(xs) -> list``: ``xs[r]`` is rank r's ``(s, h)`` partial sum; rank i
    must get the sum over ranks of rows ``i*s/t .. (i+1)*s/t - 1``."""
    from ..sim.comm import SimGroup
    err, cases, run, alias = 0.0, _cases(rng), Cases("reduce_scatter"), []
    for where, t, _c, _h, xs in cases:
        with run.case():
            target = SimGroup(t).reduce_scatter([x.astype(float) for x in xs], axis=0)
            out = run_student("reduce_scatter", reduce_scatter, ("xs",), xs)
            _one_per_rank("reduce_scatter", out, where, "(s/t, h)",
                          hint="each rank keeps only its own block of the summed rows")
            err = max(err, compare_shards(
                "reduce_scatter", out, target, where=where, what="the summed shard",
                axes=("token", "hidden"), hint=_rs_hint(xs, out)))
            alias += [a for a in [aliased(out, xs, "xs", where)] if a]
    run.verdict()
    refuse_aliases("reduce_scatter", alias)
    return (f"{len(cases)} cases (t = 1..5, c = 1..4, integer inputs; new arrays, at t = 1 "
            f"too), max error {err:.1e}")


@register_exercise("all_gather", NB01, "all-gather along the sequence",
                   withholds={
                       "lesson10.sim.comm.SimGroup.all_gather": "adapter:group_all_gather"})
def check_all_gather(all_gather, rng):
    """``all_gather(shards) -> list``: every rank gets the ``t`` shards concatenated in
    rank order along the sequence axis."""
    from ..sim.comm import SimGroup
    err, cases, run, alias = 0.0, _cases(rng), Cases("all_gather"), []
    for where, t, c, _h, xs in cases:
        with run.case():
            shards = [x[:c].copy() for x in xs]
            target = SimGroup(t).all_gather([x.astype(float) for x in shards], axis=0)
            out = run_student("all_gather", all_gather, ("shards",), shards)
            _one_per_rank("all_gather", out, where, "(t*c, h)",
                          hint="every rank ends with its own copy of the full tensor")
            err = max(err, compare_shards(
                "all_gather", out, target, where=where, what="the gathered tensor",
                axes=("token", "hidden"), hint=_ag_hint(shards, out)))
            alias += [a for a in [aliased(out, shards, "shards", where)] if a]
    run.verdict()
    refuse_aliases("all_gather", alias)
    return (f"{len(cases)} cases (t = 1..5, c = 1..4; new arrays, at t = 1 too): every rank "
            f"holds all tokens in rank order")


_SP_CALL = "sp_forward(partials, op, reduce_scatter=..., all_gather=...)"


@register_exercise("sp_forward", NB01, "SP: reduce-scatter, token-wise op, all-gather",
                   parts=("output", "op on s/t tokens"),
                   withholds={
                       "lesson10.sim.sp.sp_forward": "sp_forward",
                       "lesson10.sim.sp.tp_forward": "adapter:tp_forward"},
                   use_instead="use the reduce_scatter, all_gather and op the check passes in")
def check_sp_forward(sp_forward, rng):
    """``sp_forward(partials, op, reduce_scatter=..., all_gather=...) -> list``: the
    row-parallel partial sums go through ``reduce_scatter``, ``op`` on each rank's ``s/t``
    tokens, and ``all_gather``. The check serves all three and watches them: one
    reduce-scatter of the partials, ``op`` once per rank on exactly the shard the
    reduce-scatter delivered, one all-gather of what ``op`` returned; the answer is what
    the all-gather delivered. In some random cases the collectives deliver other values
    (a secret offset), so only an answer that uses them gets the target."""
    cases = _cases(rng, n_random=6)
    swapped = {len(cases) - 6 + i for i in substituted(rng, 6)}
    err, run = 0.0, Cases("sp_forward")
    for i, (where, _t, _c, h, xs) in enumerate(cases):
        served = ServedSP(xs, rng.uniform(0.5, 2.0, size=h), rng if i in swapped else None)
        if i in swapped:
            where += ", the collectives deliver other values than a plain sum"
        out = served_call(Referee("sp_forward", where), "sp_forward", sp_forward, ("partials",),
                          xs, served.op, reduce_scatter=served.reduce_scatter,
                          all_gather=served.all_gather, calls=_SP_CALL)
        in_part("op on s/t tokens")                   # counts this case for that part
        broken = served.problem()
        if broken is not None:      # a broken rule of the served collectives: not a diagnosis
            fail_check("sp_forward", where, broken[0], show=False, hint=broken[1])
        if not in_part("output"):
            continue
        with run.case():
            err = max(err, compare_shards(
                "sp_forward", out, served.target(), where=where, what="the layer output",
                axes=("token", "hidden"), hint=_sp_hint(served, xs, out)))
    run.verdict()
    return (f"{len(cases)} cases ({len(swapped)} with substituted collectives): one "
            f"reduce-scatter, op once per rank on the shard it delivered, one all-gather; the "
            f"output matches, max error {err:.1e}")


def _sp_hint(served, xs, out):
    return lambda: mistakes.explain(
        served.rs_off is None and mistakes.sp_forward_mistake(xs, served.op, out) or None,
        "return what all_gather delivered: every rank holds op(P_0 + ... + P_{t-1}) for all s "
        "tokens")


@register_exercise("sp_bytes", NB01, "bytes of TP vs TP + SP",
                   withholds={
                       "lesson10.cost.comm_bytes": "adapter:comm_bytes",
                       "lesson10.cost.all_reduce_bytes": None,
                       "lesson10.cost.reduce_scatter_bytes": None,
                       "lesson10.cost.all_gather_bytes": None,
                       "lesson10.cost.moe_a2a_bytes": None})
def check_sp_bytes(sp_bytes, rng):
    """``sp_bytes(s, h, t, e=2) -> (tp_bytes, sp_bytes)``: bytes each GPU sends per layer in
    the forward pass with plain TP (2 all-reduces) and with TP + SP (2 reduce-scatters and
    2 all-gathers) of the ``s x h`` activation. Any pair (tuple, list, array) is accepted."""
    from .. import cost
    cases = [(8192, 4096, 8, 2), (12, 5, 1, 2), (6, 7, 2, 1), (40, 3, 4, 4), (64, 16, 16, 2),
             (9, 2, 3, 1), (30, 10, 5, None)]      # None: called without e, the default is 2
    for i in range(8):       # t up to 1024, s up to ~8M, h up to 16K: no table covers them
        big = i % 2 == 1
        t = log_int(rng, 2, 1024, big)
        cases.append((t * log_int(rng, 1, 8192, big), log_int(rng, 1, 16384, big), t,
                      int(rng.choice([1, 2, 4]))))
    run = Cases("sp_bytes")
    for s, h, t, e in cases:
        with run.case():
            _sp_bytes_case(sp_bytes, cost, s, h, t, e)
    run.verdict()
    return f"{len(cases)} sizes (t = 1..1024, e = 1, 2, 4): TP and TP + SP both send 4 (t-1)/t s h e"


def _sp_bytes_case(sp_bytes, cost, s, h, t, e):
    args = (s, h, t) if e is None else (s, h, t, e)
    e = 2 if e is None else e
    out = run_student("sp_bytes", sp_bytes, (), *args)
    where = f"s={s}, h={h}, t={t}, " + (f"e={e}" if len(args) == 4 else "e not passed (default 2)")
    tp, sp = as_pair("sp_bytes", out, where, "(tp_bytes, sp_bytes)")
    target = cost.comm_bytes("sp", s, h, t, e=e)
    close_number("sp_bytes", tp, 2 * cost.all_reduce_bytes(s * h * e, t), where=where,
                  what="TP bytes (2 all-reduces)",
                  hint=lambda: mistakes.explain(
                      mistakes.bytes_mistake(tp, target, s, h, t, e, "TP", len(args) == 4),
                      "a ring all-reduce of n = s h e bytes over t GPUs: how much of it does "
                      "each GPU send? The layer has two all-reduces"))
    close_number("sp_bytes", sp, target, where=where, what="TP + SP bytes (2 RS + 2 AG)",
                  hint=lambda: mistakes.explain(
                      mistakes.bytes_mistake(sp, target, s, h, t, e, "SP", len(args) == 4),
                      "which collectives does TP + SP run per layer, and what does each put on "
                      "the wire? Section 3 compares them with an all-reduce"))
