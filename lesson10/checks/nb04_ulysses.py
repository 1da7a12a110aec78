"""Checks of notebook 04: Ulysses."""
from __future__ import annotations

import numpy as np

from .core import (CheckFailed, _StudentError, _close_number, _compare_shards, _exercise,
                   _fail, _run)
from .nb02_ring_attention import _diagnose, _mask_mistakes, _qkv


NB04 = "04_ulysses"


# (N_c, c tokens per rank, a heads, integer data): N_c = 1, c = 1, a/N_c = 1, c > 1 and a/N_c > 1
_FIXED_A2A = [(1, 3, 2, False), (2, 1, 2, False), (2, 2, 4, False), (3, 2, 6, False),
              (4, 1, 8, False), (2, 3, 2, True), (4, 2, 4, False)]


def _a2a_cases(rng, n_random=6):
    cases = list(_FIXED_A2A)
    for _ in range(n_random):
        n = int(rng.integers(2, 5))
        cases.append((n, int(rng.integers(1, 4)), n * int(rng.integers(1, 4)), False))
    out = []
    for n, c, a, integer in cases:
        d = int(rng.integers(1, 4))
        shape = (n * c, a, d)
        x = rng.integers(-50, 50, size=shape) if integer else rng.standard_normal(shape)
        out.append((f"N_c={n}, s={n * c}, a={a}, d={d}{', integer data' if integer else ''}", n, x))
    return out


@_exercise("seq_to_heads", NB04, 1, "all-to-all: sequence shards -> head shards")
def check_seq_to_heads(seq_to_heads, rng):
    """``seq_to_heads(shards) -> list``: ``shards[r]`` is ``(s/n, a, d)`` (tokens of rank r,
    every head); rank r must end with ``(s, a/n, d)``: every token, heads ``r a/n ..``.
    When ``a`` is not a multiple of ``n`` it must raise an error (not return empty shards)."""
    from ..sim.comm import SimGroup
    from ..sim.ulysses import seq_to_heads as ref
    cases = _a2a_cases(rng)
    for where, n, x in cases:
        shards = np.split(x, n, axis=0)
        target = ref([y.astype(float) for y in shards], SimGroup(n))
        out = _run("seq_to_heads", seq_to_heads, ("shards",), shards)
        _compare_shards("seq_to_heads", out, target, where=where,
                        what="head shard", axes=("token", "local head", "dim"), exact=True,
                        hint="rank i cuts its tokens by head groups (heads j a/n .. (j+1) a/n - 1, "
                             "a contiguous group) and sends group j to rank j; rank j stacks what "
                             "it receives along the token axis, rank 0's tokens first")
    for n, a in ((4, 2), (2, 3)):
        shards = [rng.standard_normal((1, a, 2)) for _ in range(n)]
        where = f"N_c={n} ranks but a={a} heads"
        try:
            out = _run("seq_to_heads", seq_to_heads, ("shards",), shards)
        except _StudentError:
            continue                       # it raised: right
        shapes = [np.shape(o) for o in out] if isinstance(out, (list, tuple)) else np.shape(out)
        _fail("seq_to_heads", where, f"{a} heads cannot be split into {n} equal groups, yet your "
              f"function returned (shapes {shapes}) instead of raising an error", show=False,
              hint="np.split(x, n, axis=1) raises a ValueError by itself; with slicing, check "
                   "a % n first and raise ValueError(...) yourself")
    return f"{len(cases)} cases: rank r holds all tokens of heads r a/n .. (r+1) a/n - 1; a % n != 0 raises"


@_exercise("heads_to_seq", NB04, 1, "all-to-all: head shards -> sequence shards")
def check_heads_to_seq(heads_to_seq, rng):
    """``heads_to_seq(shards) -> list``: the inverse of ``seq_to_heads``."""
    from ..sim.comm import SimGroup
    from ..sim.ulysses import heads_to_seq as ref
    cases = _a2a_cases(rng)
    for where, n, x in cases:
        shards = np.split(x, n, axis=1)
        target = ref([y.astype(float) for y in shards], SimGroup(n))
        out = _run("heads_to_seq", heads_to_seq, ("shards",), shards)
        _compare_shards("heads_to_seq", out, target, where=where,
                        what="sequence shard", axes=("local token", "head", "dim"), exact=True,
                        hint="rank j cuts its (s, a/n, d) tensor into n token blocks and sends "
                             "block i to rank i; rank i stacks what it receives along the head "
                             "axis, rank 0's heads first")
    return f"{len(cases)} cases: heads_to_seq undoes seq_to_heads"


def _ulysses_cases(rng, n_random=4):
    """(layout, causal, N_c, c, a, a_kv): fixed cases, then random ones; causal None =
    not passed (the default, True)."""
    cases = [("contiguous", True, 2, 2, 4, 4), ("zigzag", True, 2, 4, 4, 2),
             ("zigzag", True, 2, 2, 8, 4), ("striped", True, 3, 2, 3, 3),
             ("contiguous", False, 4, 1, 4, 4), ("contiguous", True, 1, 4, 2, 2),
             ("zigzag", None, 4, 2, 4, 4)]
    for _ in range(n_random):
        n = int(rng.integers(2, 5))
        a_kv = n * int(rng.integers(1, 3))
        cases.append((str(rng.choice(["contiguous", "zigzag", "striped"])), bool(rng.random() < 0.7),
                      n, 2 * int(rng.integers(1, 3)), a_kv * int(rng.integers(1, 3)), a_kv))
    return cases


@_exercise("ulysses_attention", NB04, 2, "Ulysses attention")
def check_ulysses_attention(ulysses_attention, rng):
    """``ulysses_attention(q_shards, k_shards, v_shards, positions, causal=True) -> list``
    of sequence-sharded outputs; K/V may have fewer heads than Q (GQA, ``a_kv`` a multiple
    of ``n``). Must equal full attention."""
    from ..layouts import shard_positions
    from ..sim.attention import attention
    err = 0.0
    cases = _ulysses_cases(rng)
    for layout, causal, n, c, a, a_kv in cases:
        s, d = n * c, int(rng.integers(1, 4))
        q, k, v = _qkv(rng, s, a, d, a_kv=a_kv, scale=1.5)
        pos = shard_positions(s, n, layout)
        causal_ = causal is not False
        out_full, _ = attention(q, k, v, causal=causal_)
        target = [out_full[p] for p in pos]
        args = ([q[p] for p in pos], [k[p] for p in pos], [v[p] for p in pos], [p.copy() for p in pos])
        out = _run("ulysses_attention", ulysses_attention,
                   ("q_shards", "k_shards", "v_shards", "positions"),
                   *args, *(() if causal is None else (causal,)))
        where = (f"{layout} layout, causal={causal_}{' (not passed: the default)' if causal is None else ''}"
                 f", N_c={n}, s={s}, a={a}, a_kv={a_kv}")
        try:
            err = max(err, _compare_shards(
                "ulysses_attention", out, target, where=where, what="output",
                axes=("local query", "head", "dim"),
                hint="seq_to_heads on q, k and v; gather the positions of all tokens in the order "
                     "seq_to_heads stacks them; attention per rank on its heads, passing causal; "
                     "heads_to_seq back"
                     + ("; with GQA query head i reads K/V head i // g, which is what attention() "
                        "does when K/V have fewer heads (no np.tile of K/V)" if a_kv < a else "")))
        except CheckFailed:
            if causal_:      # name the classic mistakes when they are the cause
                _diagnose("ulysses_attention", out, _mask_mistakes(q, k, v, pos, local_rows=False),
                          where)
            raise
    return (f"{len(cases)} cases (contiguous, zigzag and striped, causal and not, GQA, N_c in 1..4) "
            f"match full attention, max error {err:.1e}")


@_exercise("ulysses_bytes", NB04, 1, "bytes of Ulysses vs ring attention")
def check_ulysses_bytes(ulysses_bytes, rng):
    """``ulysses_bytes(s, h, n, g=1, e=2) -> float``: bytes each GPU sends per layer in the
    forward pass: four all-to-alls (Q, K, V, output); K and V have ``h/g`` columns."""
    from .. import cost
    # (s, h, N_c, g, e); None: not passed, the default (g = 1, e = 2)
    cases = [(4096, 1024, 4, 4, 2), (16, 8, 1, 1, 2), (64, 32, 2, 1, 2), (64, 32, 2, 2, 1),
             (96, 48, 3, 1, 4), (131072, 4096, 8, 1, 2), (80, 16, 4, None, None), (48, 24, 3, 2, None)]
    for n, g, e in zip(rng.choice([2, 3, 4, 8], size=8), rng.choice([1, 2, 4, 8], size=8),
                       rng.choice([1, 2, 4], size=8)):
        cases.append((int(n) * int(rng.integers(1, 100)) * 8, int(g) * int(rng.integers(2, 64)),
                      int(n), int(g), int(e)))
    for s, h, n, g, e in cases:
        args = tuple(x for x in (s, h, n, g, e) if x is not None)
        g, e = (1 if g is None else g), (2 if e is None else e)
        out = _run("ulysses_bytes", ulysses_bytes, (), *args)
        passed = "" if len(args) == 5 else f" ({', '.join(('g', 'e')[len(args) - 3:])} not passed)"
        _close_number("ulysses_bytes", out, cost.comm_bytes("ulysses", s, h, n, g=g, e=e),
                      where=f"s={s}, h={h}, N_c={n}, g={g}, e={e}{passed}", what="bytes per GPU",
                      hint="each rank holds s/N_c tokens; an all-to-all sends (N_c-1)/N_c of its "
                           "local tensor; Q and the output have h columns, K and V h/g")
    return f"{len(cases)} sizes (N_c = 1..8, GQA, e = 1, 2, 4) match (N_c-1)/N_c (2 + 2/g) s h e / N_c"
