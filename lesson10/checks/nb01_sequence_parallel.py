"""Checks of notebook 01: sequence parallelism."""
from __future__ import annotations

import numpy as np

from .core import _close_number, _compare_shards, _exercise, _fail, _log_int, _pair, _run


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
        _fail(exercise, where, f"you returned one array of shape {out.shape}; return a list "
              f"with one {shape} array per rank", show=False, hint=hint)


@_exercise("reduce_scatter", NB01, 1, "reduce-scatter along the sequence")
def check_reduce_scatter(reduce_scatter, rng):
    """``reduce_scatter(xs) -> list``: ``xs[r]`` is rank r's ``(s, h)`` partial sum; rank i
    must get the sum over ranks of rows ``i*s/t .. (i+1)*s/t - 1``."""
    from ..sim.comm import SimGroup
    err, cases = 0.0, _cases(rng)
    for where, t, c, h, xs in cases:
        target = SimGroup(t).reduce_scatter([x.astype(float) for x in xs], axis=0)
        out = _run("reduce_scatter", reduce_scatter, ("xs",), xs)
        _one_per_rank("reduce_scatter", out, where, "(s/t, h)",
                      hint="rank i gets only block i (rows i*s/t .. (i+1)*s/t - 1) of the sum")
        err = max(err, _compare_shards(
            "reduce_scatter", out, target, where=where, what="the summed shard",
            axes=("token", "hidden"),
            hint="rank i keeps the tokens i*s/t .. (i+1)*s/t - 1 (a contiguous block), summed "
                 "over all t ranks; the split is along the sequence (axis 0), the sum over ranks"))
    return f"{len(cases)} cases (t = 1..5, c = 1..4, integer inputs), max error {err:.1e}"


@_exercise("all_gather", NB01, 1, "all-gather along the sequence")
def check_all_gather(all_gather, rng):
    """``all_gather(shards) -> list``: every rank gets the ``t`` shards concatenated in
    rank order along the sequence axis."""
    from ..sim.comm import SimGroup
    err, cases = 0.0, _cases(rng)
    for where, t, c, h, xs in cases:
        shards = [x[:c].copy() for x in xs]
        target = SimGroup(t).all_gather([x.astype(float) for x in shards], axis=0)
        out = _run("all_gather", all_gather, ("shards",), shards)
        _one_per_rank("all_gather", out, where, "(t*c, h)",
                      hint="every rank ends with its own copy of the full tensor, e.g. "
                           "[full.copy() for _ in shards]")
        err = max(err, _compare_shards(
            "all_gather", out, target, where=where, what="the gathered tensor",
            axes=("token", "hidden"),
            hint="every rank ends with all shards one after the other, rank 0's c tokens first, "
                 "stacked along the sequence (axis 0): np.concatenate(shards, axis=0)"))
    return f"{len(cases)} cases (t = 1..5, c = 1..4): every rank holds all tokens in rank order"


def _layer_norm(x):
    mu = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5)


@_exercise("sp_forward", NB01, 2, "SP: reduce-scatter, token-wise op, all-gather")
def check_sp_forward(sp_forward, rng):
    """``sp_forward(partials, op) -> list``: the row-parallel partial sums go through
    reduce-scatter, ``op`` on each rank's ``s/t`` tokens, and all-gather. Must equal
    ``op(sum(partials))`` on every rank, and ``op`` must see exactly ``s/t`` tokens, once
    per rank."""
    err, cases = 0.0, _cases(rng, n_random=6)
    for where, t, c, h, xs in cases:
        scale = rng.uniform(0.5, 2.0, size=h)
        calls = []

        def op(x, _scale=scale, _calls=calls):
            x = np.asarray(x, dtype=float)
            _calls.append(x.shape)
            return np.tanh(_layer_norm(x) * _scale + 0.1)

        full = np.tanh(_layer_norm(np.sum(xs, axis=0).astype(float)) * scale + 0.1)
        out = _run("sp_forward", sp_forward, ("partials",), xs, op)
        err = max(err, _compare_shards(
            "sp_forward", out, [full] * t, where=where, what="the layer output",
            axes=("token", "hidden"),
            hint="sum the partials first (reduce-scatter), then apply op to each rank's summed "
                 "s/t tokens, then all-gather so that every rank returns the full (s, h) "
                 "tensor; op is not linear, so op(partial) summed is wrong"))
        if not calls:
            _fail("sp_forward", where, "op was never called", show=False,
                  hint="each rank applies op to its own s/t tokens")
        wrong = [shape for shape in calls if len(shape) != 2 or shape[0] != c]
        if wrong:
            _fail("sp_forward", where,
                  f"op was called on an array of shape {wrong[0]}; under SP each rank runs it on "
                  f"its own s/t = {c} tokens, shape ({c}, {h})", show=False,
                  hint="that is plain TP (all-reduce, then op on all s tokens on every rank) "
                       "or op on single tokens: call op once per rank, after the reduce-scatter, "
                       "before the all-gather")
        if len(calls) != t:
            _fail("sp_forward", where, f"op was called {len(calls)} times, expected once per rank",
                  len(calls), t, hint="one call per rank, on that rank's shard")
    return (f"{len(cases)} cases: equals op(all-reduce) on every rank, op saw s/t tokens once "
            f"per rank, max error {err:.1e}")


@_exercise("sp_bytes", NB01, 1, "bytes of TP vs TP + SP")
def check_sp_bytes(sp_bytes, rng):
    """``sp_bytes(s, h, t, e=2) -> (tp_bytes, sp_bytes)``: bytes each GPU sends per layer in
    the forward pass with plain TP (2 all-reduces) and with TP + SP (2 reduce-scatters and
    2 all-gathers) of the ``s x h`` activation. Any pair (tuple, list, array) is accepted."""
    from .. import cost
    cases = [(8192, 4096, 8, 2), (12, 5, 1, 2), (6, 7, 2, 1), (40, 3, 4, 4), (64, 16, 16, 2),
             (9, 2, 3, 1), (30, 10, 5, None)]      # None: called without e, the default is 2
    for i in range(8):       # t up to 1024, s up to ~8M, h up to 16K: no table covers them
        big = i % 2 == 1
        t = _log_int(rng, 2, 1024, big)
        cases.append((t * _log_int(rng, 1, 8192, big), _log_int(rng, 1, 16384, big), t,
                      int(rng.choice([1, 2, 4]))))
    for s, h, t, e in cases:
        args = (s, h, t) if e is None else (s, h, t, e)
        e = 2 if e is None else e
        out = _run("sp_bytes", sp_bytes, (), *args)
        where = f"s={s}, h={h}, t={t}, " + (f"e={e}" if len(args) == 4 else "e not passed (default 2)")
        tp, sp = _pair("sp_bytes", out, where, "(tp_bytes, sp_bytes)")
        _close_number("sp_bytes", tp, 2 * cost.all_reduce_bytes(s * h * e, t), where=where,
                      what="TP bytes (2 all-reduces)",
                      hint="a ring all-reduce of n = s h e bytes sends 2 (t-1)/t n per GPU; the "
                           "layer has two of them")
        _close_number("sp_bytes", sp, cost.comm_bytes("sp", s, h, t, e=e), where=where,
                      what="TP + SP bytes (2 RS + 2 AG)",
                      hint="each reduce-scatter or all-gather of the s x h activation (n = s h e "
                           "bytes) sends (t-1)/t n per GPU; there are two of each")
    return f"{len(cases)} sizes (t = 1..1024, e = 1, 2, 4): TP and TP + SP both send 4 (t-1)/t s h e"
