"""Checks of notebook 02: ring attention."""
from __future__ import annotations

from typing import Any

import numpy as np

from . import mistakes
from .core import (
    Cases,
    CheckFailed,
    as_pair,
    compare_arrays,
    compare_shards,
    fail_check,
    register_exercise,
    run_student,
)
from .diagnosis import Diagnosis
from .network import Referee, RingNetwork, ServedBlockAttention, ServedMerge, served_call, substituted
from .parts import in_part, note_mistake

NB02 = "02_ring_attention"


def draw_qkv(rng, s, a, d, a_kv=None, scale=1.0):
    a_kv = a if a_kv is None else a_kv
    q = rng.standard_normal((s, a, d)) * scale
    k = rng.standard_normal((s, a_kv, d)) * scale
    v = rng.standard_normal((s, a_kv, d))
    return q, k, v


def _large_qk(rng, sq, sk, a, d):
    """q, k whose scores are +-(900 .. 1100): exp overflows (or underflows to 0 in every
    entry of a row) unless the row maximum is subtracted first."""
    u = rng.standard_normal((a, d))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    amp = np.sqrt(1000.0 * np.sqrt(d))
    sign = np.where(rng.random(sq) < 0.5, -1.0, 1.0)
    sign[0], sign[-1] = 1.0, -1.0
    q = sign[:, None, None] * amp * u[None]
    k = rng.uniform(0.9, 1.1, size=(sk, 1, 1)) * amp * u[None]
    return q, k


_HIDDEN_ABOVE = "masked keys far above the visible ones (scores +1000 masked, -1000 visible)"


def _hidden_above(rng, q_pos, k_pos, a, d):
    """q, k where every query sees only the keys before all queries, at scores of about
    -1000, while the keys it may not see score about +1000: a row maximum taken over all
    keys, masked ones too, makes every visible exp(score - max) underflow to 0."""
    u = rng.standard_normal((a, d))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    amp = np.sqrt(1000.0 * np.sqrt(d))
    sign = np.where(k_pos < q_pos.min(), -1.0, 1.0)
    q = rng.uniform(0.95, 1.05, size=(len(q_pos), 1, 1)) * amp * u[None]
    k = (sign * rng.uniform(0.95, 1.05, size=len(k_pos)))[:, None, None] * amp * u[None]
    return q, k


def _block_cases(rng, n_random=8):
    """(kind, sq, sk, a, d, causal) of the fixed cases, then the random batch."""
    fixed = [("random positions, causal", 3, 5, 2, 4, True),
             ("not causal", 4, 3, 2, 3, False),
             ("later keys: some queries see no key", 4, 3, 3, 2, True),
             ("all keys after all queries: every row empty", 3, 2, 2, 3, True),
             ("large scores (|q.k|/sqrt(d) about 1000), causal", 4, 5, 2, 4, True),
             ("large scores, not causal", 3, 4, 1, 2, False),
             ("diagonal block: keys at the same positions as the queries", 4, 4, 2, 3, True),
             ("integer-valued q, k, v", 3, 4, 2, 2, True),
             ("one query, uneven sizes", 1, 6, 3, 5, True),
             ("causal not passed (default True)", 5, 3, 2, 3, None),
             (_HIDDEN_ABOVE, 3, 5, 2, 3, True)]
    rand = []
    for _ in range(n_random):
        big = rng.random() < 0.25
        rand.append(("random" + (", large scores" if big else ""), int(rng.integers(1, 7)),
                     int(rng.integers(1, 7)), int(rng.integers(1, 4)), int(rng.integers(1, 6)),
                     bool(rng.random() < 0.7)))
    return fixed + rand


@register_exercise("block_attention", NB02, "attention of one block, with positions, mask and lse",
                   withholds={
                       "lesson10.sim.attention.attention": "adapter:attention"})
def check_block_attention(block_attention, rng):
    """``block_attention(q, k, v, q_pos, k_pos, causal=True) -> (out, lse)`` for ``q`` of
    shape ``(sq, a, d)`` and ``k, v`` of shape ``(sk, a, d)``; query i may see key j when
    ``k_pos[j] <= q_pos[i]`` (causal). A query that sees no key: out 0, lse -inf."""
    err, cases, run = 0.0, _block_cases(rng), Cases("block_attention")
    for kind, sq, sk, a, d, causal in cases:
        with run.case():
            err = max(err, _block_case(block_attention, rng, kind, sq, sk, a, d, causal))
    run.verdict()
    return (f"{len(cases)} cases (shuffled positions, empty rows, scores of +-1000, masked keys "
            f"far above the visible ones, a diagonal block, integer-valued inputs, not causal), "
            f"max error {err:.1e}")


def _block_case(block_attention, rng, kind, sq, sk, a, d, causal) -> float:
    """One case of block_attention: its inputs, the call and the comparison; the error."""
    from ..sim.attention import attention
    if kind.startswith("integer"):
        q, k, v = (rng.integers(-3, 4, size=(n, a, d)).astype(float) for n in (sq, sk, sk))
    else:
        q, k, v = (rng.standard_normal((n, a, d)) for n in (sq, sk, sk))
    if "large" in kind:
        q, k = _large_qk(rng, sq, sk, a, d)
    perm = rng.permutation(sq + sk + 4)
    q_pos, k_pos = np.sort(perm[:sq]), np.sort(perm[sq:sq + sk])
    if kind.startswith("later keys"):
        q_pos = np.arange(sq) * 2 + 1          # query 0 (position 1) sees no key,
        k_pos = np.arange(sk) * 2 + 2          # the last queries see some
    if kind.startswith("all keys after"):
        q_pos, k_pos = np.arange(sq), np.arange(sk) + sq
    if kind.startswith("diagonal"):
        k_pos = q_pos.copy()                   # key == query is visible (<=, not <)
    if kind.startswith("integer"):
        q_pos, k_pos = np.arange(sq) + sk, np.arange(sk)   # every query sees every key
    if kind == _HIDDEN_ABOVE:               # keys 0, 1 seen by every query, 5.. by none
        q_pos, k_pos = np.arange(sq) + 2, np.r_[0, 1, np.arange(sk - 2) + sq + 2]
    q_pos, k_pos = rng.permutation(q_pos), rng.permutation(k_pos)   # any order must work
    if kind == _HIDDEN_ABOVE:
        q, k = _hidden_above(rng, q_pos, k_pos, a, d)
    o_t, l_t = attention(q, k, v, causal=causal is not False, q_pos=q_pos, k_pos=k_pos)
    args = (q, k, v, q_pos, k_pos) + (() if causal is None else (causal,))
    out = run_student("block_attention", block_attention, ("q", "k", "v", "q_pos", "k_pos"), *args)
    where = f"{kind} (sq={sq}, sk={sk}, a={a}, d={d}, causal={causal is not False})"
    yours_o, yours_l = as_pair("block_attention", out, where, "(out, lse)")
    hint: Any = (lambda: mistakes.explain(mistakes.block_attention_mistake(
        q, k, v, q_pos, k_pos, causal is not False, causal is not None, (yours_o, yours_l)),
        "go through the formulas above on this case: the scale of the scores, which keys the "
        "mask lets each query see, a softmax at scores of +-1000, and a query that sees no key"))
    err = compare_arrays("block_attention", yours_l, l_t, where=where, what="lse",
                         axes=("query", "head"), hint=hint)
    return max(err, compare_arrays("block_attention", yours_o, o_t, where=where, what="out",
                                   axes=("query", "head", "dim"), hint=hint))


def _merge_cases(rng, n_random=8):
    fixed = ["ordinary", "large lse (about +800)", "small lse (about -800)",
             "lse1 about +800, lse2 about -800", "lse near +-1000, the sign per row",
             "one side saw no key (lse -inf)",
             "both sides saw no key in some rows", "integer-valued o1, o2",
             "equal finite lse on both sides (each side weighs 1/2)"]
    return fixed + [f"random {i}" for i in range(n_random)]


@register_exercise("merge", NB02, "the logsumexp merge of two partial results",
                   withholds={
                       "lesson10.sim.attention.merge": "merge"})
def check_merge(merge, rng):
    """``merge(o1, lse1, o2, lse2) -> (o, lse)`` with ``o`` of shape ``(s, a, d)`` and ``lse``
    of shape ``(s, a)``: the exact attention over the union of two disjoint key sets."""
    from ..sim.attention import merge as ref_merge
    err, kinds, run = 0.0, _merge_cases(rng), Cases("merge")
    for kind in kinds:
        s, a, d = int(rng.integers(2, 6)), int(rng.integers(1, 4)), int(rng.integers(1, 5))
        if s == a:
            s += 1
        o1, o2 = rng.standard_normal((s, a, d)), rng.standard_normal((s, a, d))
        l1, l2 = rng.standard_normal((s, a)) * 2, rng.standard_normal((s, a)) * 2
        if kind.startswith("large"):
            l1, l2 = l1 + 800, l2 + 800
        if kind.startswith("small"):
            l1, l2 = l1 - 800, l2 - 800
        if kind.startswith("lse1 about"):
            l1, l2 = l1 + 800, l2 - 800
        if kind.startswith("lse near"):
            sign = np.where(np.arange(s) % 2 == 0, 1.0, -1.0)[:, None]
            l1, l2 = l1 + 1000 * sign, l2 + 1000 * sign
        if kind.startswith("integer"):
            o1, o2 = (rng.integers(-5, 6, size=(s, a, d)).astype(float) for _ in range(2))
        if kind.startswith("equal"):
            l2 = l1.copy()
        if kind.startswith("random"):
            scale = float(rng.choice([1.0, 300.0, 1000.0]))
            l1, l2 = l1 * scale, l2 * scale + float(rng.normal(0, scale))
            for l, o in ((l1, o1), (l2, o2)):
                empty = rng.random((s, a)) < 0.2
                l[empty] = -np.inf
                o[empty] = 0.0
        if kind.startswith("one side"):
            mask = rng.random((s, a)) < 0.5
            mask[0, 0], mask[-1, -1] = True, False
            l2 = np.where(mask, -np.inf, l2)
            o2 = np.where(mask[..., None], 0.0, o2)
        if kind.startswith("both"):
            l1 = np.where(np.arange(s)[:, None] % 2 == 0, -np.inf, l1)
            o1 = np.where(np.isinf(l1)[..., None], 0.0, o1)
            l2 = np.where(np.isinf(l1), -np.inf, l2)
            o2 = np.where(np.isinf(l2)[..., None], 0.0, o2)
        with run.case():
            err = max(err, _merge_case(merge, ref_merge, kind, o1, l1, o2, l2))
    run.verdict()
    return (f"{len(kinds)} cases (lse of +-800, far apart, equal, -inf on one or both sides), max "
            f"error {err:.1e}")


def _merge_case(merge, ref_merge, kind, o1, l1, o2, l2) -> float:
    """One case of merge: the call and the comparison; the error."""
    s, a, d = o1.shape
    o_t, l_t = ref_merge(o1.astype(float), l1, o2.astype(float), l2)
    out = run_student("merge", merge, ("o1", "lse1", "o2", "lse2"), o1, l1, o2, l2)
    where = f"{kind} (s={s}, a={a}, d={d})"
    yours_o, yours_l = as_pair("merge", out, where, "(o, lse)")
    hint: Any = (lambda: mistakes.explain(mistakes.merge_mistake(
        o1.astype(float), l1, o2.astype(float), l2, (yours_o, yours_l)),
        "work this case through the merge formula above: the merged lse, each side's weight, "
        "large lse values, and rows where a side saw no key"))
    err = compare_arrays("merge", yours_l, l_t, where=where, what="lse", axes=("query", "head"),
                         hint=hint)
    return max(err, compare_arrays("merge", yours_o, o_t, where=where, what="o",
                                   axes=("query", "head", "dim"), hint=hint))


_MASK_HINT = ("query i may see key j only when the global position of j is <= that of i: "
              "compare the token ids passed in `positions`, not row numbers")


def diagnose(exercise, out, candidates: dict, where: str) -> None:
    """If the answer equals a known mistake, say so: clearer than a wrong number (the
    first one it equals, with the hints of all of them as the mistakes of this case).
    ``candidates``: {what the output equals: (its output per rank, hint)}."""
    try:
        yours = [np.asarray(o, dtype=float) for o in out]
    except (TypeError, ValueError):
        return
    found = [(name, hint) for name, (cand, hint) in candidates.items() if mistakes.same(yours, cand)]
    if found:     # every mistake it equals: the check names the one that fits all its cases
        for name, hint in found:
            note_mistake(f"{exercise}: {name}", hint)
        fail_check(exercise, where, f"your output equals {found[0][0]}", show=False,
                   hint=Diagnosis([hint for _, hint in found], found[0][1]))


def mask_mistakes(q, k, v, pos, local_rows: bool):
    """Outputs of the two classic mask mistakes, split per rank like the answer."""
    from ..sim.attention import attention
    out = {"attention without the causal mask": (
        [attention(q, k, v)[0][p] for p in pos],
        "causal=True was passed: pass causal on to the attention of every block")}
    order = np.concatenate(pos)
    if local_rows:      # ring: each block's rows numbered 0..c-1
        k_loc = np.concatenate([np.arange(len(p)) for p in pos])
        out["the causal mask on row numbers within each block (or on the query block's own "
            "positions for every key block)"] = ([
                attention(q[p], k[order], v[order], causal=True, q_pos=np.arange(len(p)),
                          k_pos=k_loc)[0] for p in pos],
                "a key block's positions travel with it: the mask compares the global positions "
                "of the queries with those of the keys of the block the rank holds now")
    else:               # Ulysses: the gathered tokens numbered 0..s-1 in stacking order
        o = attention(q[order], k[order], v[order], causal=True)[0]
        bounds = np.cumsum([0] + [len(p) for p in pos])
        out["the causal mask on row numbers 0..s-1 instead of the positions"] = ([
            o[bounds[r]:bounds[r + 1]] for r in range(len(pos))], _MASK_HINT)
    return out


def _ring_mistakes(q, k, v, pos, causal):
    """Outputs of the ring loop's classic mistakes (not the mask ones), per rank."""
    from ..sim.attention import attention, merge

    def ring(merge_fn=merge, lse0=-np.inf, causal_=causal):
        outs = []
        for r, p in enumerate(pos):
            o, lse = np.zeros((len(p),) + q.shape[1:]), np.full((len(p), q.shape[1]), lse0)
            for t in range(len(pos)):
                j = (r - t) % len(pos)
                ob, lb = attention(q[p], k[pos[j]], v[pos[j]], causal=causal_, q_pos=p,
                                   k_pos=pos[j])
                with np.errstate(all="ignore"):
                    o, lse = merge_fn(o, lse, ob, lb)
            outs.append(o)
        return outs

    cands = {}
    if not causal:
        cands["causal attention, though causal=False was passed"] = (
            ring(causal_=True), "pass causal on to the attention of every block")
    cands["the outputs of the blocks averaged"] = (
        ring(merge_fn=lambda o, lse, ob, lb: ((o + ob) / 2, np.maximum(lse, lb))),
        "merge each block's (out, lse) into the running result with your merge: the blocks "
        "weigh by their share of the probability mass")
    cands["attention that counts one more key with score 0 and value 0"] = (
        ring(lse0=0.0), "the running result starts empty: out = 0 and lse = -inf (no key yet); "
                        "lse = 0 stands for a key with weight e^0")
    return cands


def _ring_cases(rng, n_random=6):
    """(layout, causal, N_c, s, substitute, large): fixed cases (every layout, causal and
    not, N_c = 1, c > 1, causal not passed = None, scores near +-1000), then random ones;
    in at least two random cases the network substitutes the K/V blocks of other ranks and
    the kernel adds an offset to its output."""
    cases: list[tuple] = [("contiguous", True, 4, 8), ("zigzag", True, 3, 12), ("striped", True, 4, 12),
             ("contiguous", False, 3, 6), ("zigzag", False, 2, 8), ("contiguous", True, 1, 3),
             ("zigzag", None, 4, 8)]
    cases = [case + (False, False) for case in cases]
    cases += [("contiguous", True, 4, 8, False, True), ("zigzag", False, 3, 6, False, True)]
    swapped = substituted(rng, n_random)
    for i in range(n_random):
        layout = str(rng.choice(["contiguous", "zigzag", "striped"]))
        n = int(rng.integers(3 if i in swapped else 2, 6))   # N_c >= 3: a block is passed on
        causal = bool(rng.random() < 0.7)
        if i in swapped:             # both parts (non-causal, causal) get substituted cases
            causal = sorted(swapped).index(i) % 2 == 1
        cases.append((layout, causal, n, 2 * n * int(rng.integers(1, 3)), i in swapped, False))
    return cases


_RING_CALL = ("ring_attention(q_shards, k_shards, v_shards, positions[, causal], "
              "block_attention=kernel, merge=merge, group=network)")


def _ring_case(rng, layout, causal, n, s, swap, large):
    """The inputs of one case, its text, and the served network, kernel and merge."""
    from ..layouts import shard_positions
    a, d = int(rng.integers(1, 4)), int(rng.integers(1, 5))
    q, k, v = draw_qkv(rng, s, a, d, scale=1.5)
    if large:            # each query scaled on its own: the ranks' q_shards stay distinct
        q, k = _large_qk(rng, s, s, a, d)
        q = q * rng.uniform(0.9, 1.1, size=(s, 1, 1))
    pos = shard_positions(s, n, layout)
    where = (f"{layout} layout, causal={causal is not False}"
             f"{' (not passed: the default)' if causal is None else ''}, N_c={n}, s={s}, a={a}, d={d}"
             + (", scores near +-1000" if large else "")
             + (", the network delivers other values for the other ranks' K/V blocks and "
                "block_attention adds an offset to its out" if swap else ""))
    ks, vs = [k[p] for p in pos], [v[p] for p in pos]
    fakes = ([rng.standard_normal(x.shape) * 1.5 for x in ks],
             [rng.standard_normal(x.shape) for x in vs]) if swap else (None, None)
    referee = Referee("ring_attention", where)
    net = RingNetwork(referee, ks, vs, pos, *fakes)
    qs = [q[p] for p in pos]
    offsets = [[rng.standard_normal(x.shape) for _ in range(n)] for x in qs] if swap else None
    kernel = ServedBlockAttention(referee, net, qs, offsets, causal=causal is not False)
    return (q, k, v, pos), (qs, ks, vs, [p.copy() for p in pos]), where, referee, net, kernel


@register_exercise("ring_attention", NB02, "the ring loop",
                   parts=("non-causal", "causal"),
                   withholds={
                       "lesson10.sim.ring.ring_attention": "ring_attention"},
                   use_instead="use the group, block_attention and merge the check passes in")
def check_ring_attention(ring_attention, rng):
    """``ring_attention(q_shards, k_shards, v_shards, positions, causal=True, group=None,
    block_attention=..., merge=...) -> list`` of output shards; ``positions[r]`` are the
    global token ids of rank r. The check serves ``group=``, a network with
    ``ring_shift(xs)`` only (rank r sends ``xs[r]`` to rank r + 1), ``block_attention=``, a
    kernel that counts one call per rank and round on the block the rank holds in that
    round, and ``merge=``. The network refuses to move a block before its round's call,
    and wants N_c - 1 steps, one K and one V block per rank and step, each rank passing on
    the block it holds. In some random cases the network delivers other values for the
    blocks of other ranks and the kernel adds a secret offset to its out: the target is the
    merge of what the kernel returned."""
    err, cases, run = 0.0, _ring_cases(rng), Cases("ring_attention")
    for case in cases:
        with run.case():        # a broken rule of the served objects is that case's verdict
            err = max(err, _ring_run(ring_attention, rng, *case))
    run.verdict()
    n_swapped = sum(case[4] for case in cases)
    return (f"{len(cases)} cases (contiguous/zigzag/striped, causal and not, N_c in 1..5, scores "
            f"near +-1000, {n_swapped} with substituted blocks and kernel outputs): one "
            f"block_attention per rank and round on the block it holds, N_c - 1 shifts, and the "
            f"output matches, max error {err:.1e}")


def _ring_run(ring_attention, rng, layout, causal, n, s, swap, large) -> float:
    """One case of the ring loop: the served call, the rules, the output; the error."""
    full_in, args, where, referee, net, kernel = _ring_case(rng, layout, causal, n, s, swap, large)
    if not in_part("non-causal" if causal is False else "causal"):
        return 0.0                  # another part's case (drawn all the same: one random stream)
    out = served_call(referee, "ring_attention", ring_attention,
                      ("q_shards", "k_shards", "v_shards", "positions"),
                      *args, *(() if causal is None else (causal,)), group=net,
                      block_attention=kernel, merge=ServedMerge(referee), calls=_RING_CALL)
    net._finish()
    kernel._finish()
    causal_ = causal is not False
    try:
        return compare_shards(
            "ring_attention", out, kernel._target(causal_), where=where, what="output",
            axes=("local query", "head", "dim"),
            hint="in every round a rank attends with its queries to the block it holds, with "
                 "the global positions of both, and merges that into its running result; "
                 "check it against the text of the exercise step by step")
    except CheckFailed:
        _ring_diagnosis(out, full_in, kernel, causal_, swap, large, where)
        raise


def _ring_diagnosis(out, full_in, kernel, causal, swap, large, where) -> None:
    """Name the mistake when the output equals a known one."""
    from ..sim.attention import attention
    q, k, v, pos = full_in
    if swap:
        full = attention(q, k, v, causal=causal)[0]
        diagnose_plain("ring_attention", out, [full[p] for p in pos], where,
                       "your output is attention over the K/V blocks as k_shards and v_shards "
                       "hold them, not as the network delivered them (here they differ)",
                       "a rank may use only its own k_shards[r], v_shards[r] and what ring_shift "
                       "returned to it: reading k_shards[j] of another rank means reading "
                       "another GPU's memory")
        diagnose_plain("ring_attention", out, kernel._plain_merge(causal), where,
                       "your output is attention over the blocks the ring delivered, but not what "
                       "the block_attention you were given returned (here its out carries an "
                       "offset): the result was computed outside the served kernel",
                       "a rank keeps only its running (out, lse): each round it merges what "
                       "block_attention returned for the block it holds. Keeping the blocks to "
                       "attend over them all at the end is an all-gather, which the ring avoids")
        return
    if large and _not_finite(out):
        fail_check("ring_attention", where, "your output is not finite where the scores are near "
                   "+-1000 (the lse of a block is then about +-1000)", show=False,
                   hint="e^1000 overflows and e^-1000 is 0: a merge that exponentiates the lse "
                        "needs the max shift, as in your merge of exercise 1 (or use the merge "
                        "you were given)")
    known = mask_mistakes(q, k, v, pos, local_rows=True) if causal else {}
    diagnose("ring_attention", out, {**known, **_ring_mistakes(q, k, v, pos, causal)}, where)


def _not_finite(out) -> bool:
    try:
        return any(not np.isfinite(np.asarray(o, dtype=float)).all() for o in out)
    except (TypeError, ValueError):
        return False


def diagnose_plain(exercise, out, plain, where, what, hint):
    """In a substituted case: does the answer equal the plain output, computed from the
    inputs alone (``plain``, one array per rank)? Then it bypassed what it was served: say
    ``what`` instead of a wrong number."""
    try:
        yours = [np.asarray(o, dtype=float) for o in out]
    except (TypeError, ValueError):
        return
    if len(yours) == len(plain) and all(y.shape == p.shape and np.allclose(y, p, atol=1e-9)
                                        for y, p in zip(yours, plain)):
        fail_check(exercise, where, what, show=False, hint=hint)
