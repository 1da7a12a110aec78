"""Checks of notebook 04: Ulysses."""
from __future__ import annotations

import numpy as np

from .core import CheckFailed, _exercise, _call, _close_number, _compare_shards
from .nb02_ring_attention import _diagnose, _mask_mistakes, _qkv


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
    from ..sim.comm import SimGroup
    from ..sim.ulysses import seq_to_heads as ref
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
    from ..sim.comm import SimGroup
    from ..sim.ulysses import heads_to_seq as ref
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
    from ..layouts import shard_positions
    from ..sim.attention import attention
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
    from .. import cost
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
