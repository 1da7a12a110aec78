"""Checks of notebook 02: ring attention."""
from __future__ import annotations

import numpy as np

from .core import CheckFailed, _exercise, _call, _compare, _compare_shards, _fail


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
    from ..sim.attention import attention
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
    from ..sim.attention import merge as ref_merge
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
    from ..sim.attention import attention
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
    from ..layouts import shard_positions
    from ..sim.attention import attention
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
