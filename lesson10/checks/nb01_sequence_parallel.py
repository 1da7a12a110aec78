"""Checks of notebook 01: sequence parallelism."""
from __future__ import annotations

import numpy as np

from .core import _exercise, _call, _close_number, _compare_shards, _fail


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
    from ..sim.comm import SimGroup
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
    from ..sim.comm import SimGroup
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
    from .. import cost
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
