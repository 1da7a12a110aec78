"""Checks of notebook 01: sequence parallelism."""
from __future__ import annotations

import numpy as np

from . import mistakes
from .core import as_pair, close_number, compare_shards, fail_check, log_int, register_exercise, run_student
from .parts import in_part

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


@register_exercise("reduce_scatter", NB01, 1, "reduce-scatter along the sequence")
def check_reduce_scatter(reduce_scatter, rng):
    """``reduce_scatter(xs) -> list``: ``xs[r]`` is rank r's ``(s, h)`` partial sum; rank i
    must get the sum over ranks of rows ``i*s/t .. (i+1)*s/t - 1``."""
    from ..sim.comm import SimGroup
    err, cases = 0.0, _cases(rng)
    for where, t, c, h, xs in cases:
        target = SimGroup(t).reduce_scatter([x.astype(float) for x in xs], axis=0)
        out = run_student("reduce_scatter", reduce_scatter, ("xs",), xs)
        _one_per_rank("reduce_scatter", out, where, "(s/t, h)",
                      hint="each rank keeps only its own block of the summed rows")
        err = max(err, compare_shards(
            "reduce_scatter", out, target, where=where, what="the summed shard",
            axes=("token", "hidden"),
            hint=lambda: mistakes.reduce_scatter_mistake(xs, out) or (
                "rank i ends with one contiguous block of s/t tokens, block i, summed over the "
                "partials of all t ranks")))
    return f"{len(cases)} cases (t = 1..5, c = 1..4, integer inputs), max error {err:.1e}"


@register_exercise("all_gather", NB01, 1, "all-gather along the sequence")
def check_all_gather(all_gather, rng):
    """``all_gather(shards) -> list``: every rank gets the ``t`` shards concatenated in
    rank order along the sequence axis."""
    from ..sim.comm import SimGroup
    err, cases = 0.0, _cases(rng)
    for where, t, c, h, xs in cases:
        shards = [x[:c].copy() for x in xs]
        target = SimGroup(t).all_gather([x.astype(float) for x in shards], axis=0)
        out = run_student("all_gather", all_gather, ("shards",), shards)
        _one_per_rank("all_gather", out, where, "(t*c, h)",
                      hint="every rank ends with its own copy of the full tensor")
        err = max(err, compare_shards(
            "all_gather", out, target, where=where, what="the gathered tensor",
            axes=("token", "hidden"),
            hint=lambda: mistakes.all_gather_mistake(shards, out) or (
                "every rank ends with the same (t c, h) tensor: all shards one after the other "
                "along the sequence axis, in rank order")))
    return f"{len(cases)} cases (t = 1..5, c = 1..4): every rank holds all tokens in rank order"


def _layer_norm(x):
    mu = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5)


@register_exercise("sp_forward", NB01, 2, "SP: reduce-scatter, token-wise op, all-gather",
                   parts=(("output", 1), ("op on s/t tokens", 1)))
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
        out = run_student("sp_forward", sp_forward, ("partials",), xs, op)
        if in_part("output"):
            err = max(err, compare_shards(
            "sp_forward", out, [full] * t, where=where, what="the layer output",
            axes=("token", "hidden"),
            hint=lambda: mistakes.sp_forward_mistake(xs, op, out) or (
                "reduce-scatter the partials, run op on each rank's s/t summed tokens, all-gather: "
                "every rank returns op(P_0 + ... + P_{t-1}) for all s tokens")))
        if not in_part("op on s/t tokens"):
            continue
        if not calls:
            fail_check("sp_forward", where, "op was never called", show=False,
                  hint="each rank applies op to its own s/t tokens")
        wrong = [shape for shape in calls if len(shape) != 2 or shape[0] != c]
        if wrong:
            fail_check("sp_forward", where,
                  f"op was called on an array of shape {wrong[0]}; under SP each rank runs it on "
                  f"its own s/t = {c} tokens, shape ({c}, {h})", show=False,
                  hint=mistakes.sp_op_calls_mistake(wrong[0], t * c, c))
        if len(calls) != t:
            fail_check("sp_forward", where, f"op was called {len(calls)} times, expected once per rank",
                  len(calls), t, hint="one call per rank, on that rank's shard")
    return (f"{len(cases)} cases: equals op(all-reduce) on every rank, op saw s/t tokens once "
            f"per rank, max error {err:.1e}")


@register_exercise("sp_bytes", NB01, 1, "bytes of TP vs TP + SP")
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
    for s, h, t, e in cases:
        args = (s, h, t) if e is None else (s, h, t, e)
        e = 2 if e is None else e
        out = run_student("sp_bytes", sp_bytes, (), *args)
        where = f"s={s}, h={h}, t={t}, " + (f"e={e}" if len(args) == 4 else "e not passed (default 2)")
        tp, sp = as_pair("sp_bytes", out, where, "(tp_bytes, sp_bytes)")
        target = cost.comm_bytes("sp", s, h, t, e=e)
        close_number("sp_bytes", tp, 2 * cost.all_reduce_bytes(s * h * e, t), where=where,
                      what="TP bytes (2 all-reduces)",
                      hint=lambda: mistakes.bytes_mistake(tp, target, s, h, t, e, "TP", len(args) == 4)
                      or "a ring all-reduce of n = s h e bytes over t GPUs: how much of it does "
                         "each GPU send? The layer has two all-reduces")
        close_number("sp_bytes", sp, target, where=where,
                      what="TP + SP bytes (2 RS + 2 AG)",
                      hint=lambda: mistakes.bytes_mistake(sp, target, s, h, t, e, "SP", len(args) == 4)
                      or "each reduce-scatter or all-gather of the s x h activation (n = s h e "
                         "bytes) is half a ring all-reduce; the layer has two of each")
    return f"{len(cases)} sizes (t = 1..1024, e = 1, 2, 4): TP and TP + SP both send 4 (t-1)/t s h e"
