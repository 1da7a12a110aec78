"""The common wrong answers, recognised: a hint that names the mistake an answer looks like.

Each ``*_mistake`` function gets the inputs of the case that failed and the student's
answer, computes what each known mistake would have returned on those inputs, and returns
a :class:`~.diagnosis.Diagnosis`: the texts of every one the answer equals, best first
(or None: the check then gives its general hint). A check that runs its cases through
:class:`~.diagnosis.Cases` names the mistake that explains all of its failing cases. The
texts say what went wrong and what the lesson's rule is, never the code of the solution.
The checks call them only when a case has failed (as a hint function), so a right answer
pays nothing for them.
"""
from __future__ import annotations

import numpy as np

from .diagnosis import Diagnosis
from .parts import recognised
from .precision import tolerance


def same(yours, candidate) -> bool:
    """Does the answer equal the candidate? Arrays, or lists of arrays (one per rank), or
    numbers; equal shapes and values (NaN = NaN, inf = inf)."""
    try:
        if isinstance(candidate, (list, tuple)):
            if not isinstance(yours, (list, tuple, np.ndarray)) or len(yours) != len(candidate):
                return False
            return all(same(y, c) for y, c in zip(yours, candidate))
        tol = tolerance(yours)
        y, c = np.asarray(yours, dtype=float), np.asarray(candidate, dtype=float)
    except (TypeError, ValueError):
        return False
    return y.shape == c.shape and bool(np.allclose(y, c, rtol=tol, atol=tol, equal_nan=True))


def first(yours, mistakes) -> Diagnosis | None:
    """Every ``(text, make)`` whose ``make()`` the answer equals, in order (a Diagnosis
    that reads as the first text), or None; a ``make`` that fails (it does not apply to
    this case) is skipped."""
    found = []
    for text, make in mistakes:
        try:
            with np.errstate(all="ignore"):
                candidate = make()
        except Exception:  # noqa: BLE001 - this mistake does not apply here
            continue
        if candidate is not None and same(yours, candidate) and text not in found:
            found.append(text)
    return Diagnosis(found) if found else None


def explain(found, general: str) -> Diagnosis:
    """The hint of a failed case: the mistakes ``found`` (a Diagnosis or None) and the
    general hint of the check."""
    if found and not isinstance(found, Diagnosis):
        return Diagnosis((str(found),), general)     # a mistake function's single text
    return Diagnosis(getattr(found, "mistakes", ()), general)


def unless_right(pairs, right):
    """``(text, make)`` pairs whose value is not the right answer itself (a mistake that
    changes nothing on this case explains nothing)."""
    return [(text, (lambda v=value: None if same(v, right) else v)) for text, value in pairs]


def shape_of(x):
    try:
        return np.shape(x)
    except (TypeError, ValueError):
        return None


# --------------------------------------------------------------------------- 01
def reduce_scatter_mistake(xs, out) -> str | None:
    t = len(xs)
    total = np.sum([np.asarray(x, dtype=float) for x in xs], axis=0)
    s, h = total.shape
    c = s // t
    blocks = [total[i * c:(i + 1) * c] for i in range(t)]
    if out is not None and len(out) == t and shape_of(out[0]) == (s, h // t if h % t == 0 else -1):
        return ("your shards have shape (s, h/t): you split the hidden axis; reduce-scatter along "
                "the sequence splits the tokens")
    return first(out, [
        ("rank i holds only its own partial sum: the reduce-scatter adds block i of every rank's "
         "partial", lambda: [np.asarray(xs[i], dtype=float)[i * c:(i + 1) * c] for i in range(t)]),
        ("your shards are averages: a reduce-scatter sums the partials (the layer's output is "
         "their sum)", lambda: [b / t for b in blocks]),
        ("rank 0 holds the last block: rank i gets block i, in rank order", lambda: blocks[::-1]),
        ("rank i holds the rows i, i + t, i + 2t, ...: its block is a run of s/t consecutive "
         "tokens", lambda: [total[i::t] for i in range(t)]),
    ])


def all_gather_mistake(shards, out) -> str | None:
    t = len(shards)
    sh = [np.asarray(x, dtype=float) for x in shards]
    c, h = sh[0].shape
    if out is not None and len(out) == t:
        got = shape_of(out[0])
        if got == (c, t * h):
            return ("your gathered tensor has shape (c, t h): you joined the shards along the "
                    "hidden axis; the tokens go one after the other")
        if got == (t, c, h):
            return ("your gathered tensor has shape (t, c, h): stacking adds a new axis; the "
                    "tokens of all ranks form one sequence axis of length t c")
        if got == (c, h):
            return "every rank returns its own shard: an all-gather gives every rank all of them"
    return first(out, [
        ("rank r's tensor starts with its own shard: the gathered tensor is the same on every "
         "rank, rank 0's tokens first", lambda: [np.concatenate(sh[r:] + sh[:r]) for r in range(t)]),
        ("the shards are in reverse rank order: rank 0's tokens come first",
         lambda: [np.concatenate(sh[::-1])] * t),
        ("your tokens are interleaved (token 0 of every rank, then token 1, ...): the shards go "
         "one after the other", lambda: [np.stack(sh, axis=1).reshape(-1, h)] * t),
    ])


def sp_forward_mistake(partials, op, out) -> str | None:
    t = len(partials)
    p = [np.asarray(x, dtype=float) for x in partials]
    s, h = p[0].shape
    c = s // t
    if out is not None and len(out) == t and shape_of(out[0]) == (c, h):
        return ("you return each rank's (s/t, h) shard: after the token-wise op an all-gather "
                "gives every rank the full (s, h) tensor again")
    local = [op(sum(x[i * c:(i + 1) * c] for x in p)) for i in range(t)]
    return first(out, [
        ("your output looks like op applied to each rank's partial sum before the reduction: op "
         "is not linear, so op(P_0) + op(P_1) is not op(P_0 + P_1); reduce first",
         lambda: [np.concatenate([sum(op(x[i * c:(i + 1) * c]) for x in p) for i in range(t)])] * t),
        ("rank r's output starts with its own shard: the gathered tensor is the same on every "
         "rank, rank 0's tokens first",
         lambda: [np.concatenate(local[r:] + local[:r]) for r in range(t)]),
    ])


def sp_op_calls_mistake(shape, s, c) -> str:
    if len(shape) == 2 and shape[0] == s and s != c:
        return ("op ran on all s tokens: that is plain TP (all-reduce, then op everywhere); under SP "
                "each rank runs op once, on its own s/t tokens, between the two collectives")
    if len(shape) == 2 and shape[0] == 1 and c != 1:
        return ("op ran on one token at a time: each rank calls op once, on its whole (s/t, h) "
                "shard")
    return "each rank calls op once, on its own (s/t, h) shard of the reduce-scattered sum"


def bytes_mistake(yours, target, s, h, t, e, kind: str, e_passed: bool) -> str | None:
    """``kind``: "TP" or "SP". ``target`` = 4 (t-1)/t s h e for both."""
    n = s * h * e
    cands = []
    if not e_passed:
        cands.append(("e was not passed here: its default is 2 bytes per element (bf16)",
                      None if e != 2 else 4 * (t - 1) / t * s * h))
        cands.append(("e was not passed here: its default is 2 bytes per element (bf16)",
                      4 * (t - 1) / t * s * h * 4))
    if e != 2:
        cands.append((f"your count is for 2 bytes per element: this case passes e = {e}",
                      target * 2 / e))
    cands += [
        ("you left out the (t-1)/t: in a ring collective a GPU sends all but its own share of "
         "the tensor", 4 * n),
        ("1/t instead of (t-1)/t: a ring collective sends all but the GPU's own 1/t share",
         4 * n / t),
        ("your count is 0: in integer division (t - 1) // t is 0; use true division",
         0.0 if t > 1 else None),
    ]
    if kind == "TP":
        cands.append(("your TP count is half the target: each all-reduce is a reduce-scatter "
                      "plus an all-gather, 2 (t-1)/t n bytes, and the layer runs two", target / 2))
    else:
        cands.append(("your TP + SP count is half the target: the layer runs two reduce-scatters "
                      "and two all-gathers", target / 2))
    return first(yours, unless_right([(t, v) for t, v in cands if v is not None], target))


# --------------------------------------------------------------------------- 02
def block_attention_mistake(q, k, v, q_pos, k_pos, causal, causal_passed, out) -> str | None:
    """``out`` is the student's (out, lse) pair."""
    from ..sim.attention import attention
    try:
        o, lse = (np.asarray(x, dtype=float) for x in out)
    except (TypeError, ValueError):
        return None
    ref_o, ref_l = attention(q, k, v, causal=causal, q_pos=q_pos, k_pos=k_pos)
    if o.shape != ref_o.shape or lse.shape != ref_l.shape:
        return None
    empty = np.isneginf(ref_l)
    if np.isnan(o[empty]).any() or np.isnan(lse[empty]).any():
        return ("NaN where a query sees no key in this block: the softmax of a row that is all "
                "-inf divides 0 by 0; such a row has out 0 and lse -inf")
    d = q.shape[-1]
    q_pos, k_pos = np.asarray(q_pos), np.asarray(k_pos)
    no_mask = "your output ignores the causal mask"
    cands = [] if causal_passed else [      # the plain text too: the mistake of other cases
        (no_mask + ": causal was not passed here, and its default is True",
         lambda: attention(q, k, v, causal=False) if causal else None)]
    cands += [
        (no_mask, lambda: attention(q, k, v, causal=False) if causal else None),
        ("your mask compares row numbers, not positions: query i may see key j when "
         "k_pos[j] <= q_pos[i], for the global positions passed in",
         lambda: attention(q, k, v, causal=True) if causal else None),
        ("a key at the query's own position is visible (<=, not <): your mask drops it",
         lambda: attention(q, k, v, causal=True, q_pos=q_pos - 1, k_pos=k_pos) if causal else None),
        ("your scores are scaled by 1/d: attention divides q.k by sqrt(d)",
         lambda: attention(q / np.sqrt(d), k, v, causal=causal, q_pos=q_pos, k_pos=k_pos)),
        ("your scores are not scaled: attention divides q.k by sqrt(d)",
         lambda: attention(q * np.sqrt(d), k, v, causal=causal, q_pos=q_pos, k_pos=k_pos)),
        ("your row maximum includes the masked keys: with a masked key far above the visible "
         "ones, exp(score - max) underflows to 0 for every key the query sees (out 0, lse "
         "-inf); the maximum to subtract is over the keys the query may see",
         lambda: max_over_all_keys(q, k, v, q_pos, k_pos) if causal else None),
    ]
    found = first([o, lse], [(text, lambda m=make: None if (c := m()) is None or
                              same(list(c), [ref_o, ref_l]) else list(c)) for text, make in cands])
    if found:
        return found
    if empty.any() and np.isfinite(lse[empty]).all():
        return ("a query that sees no key got a finite lse: masking with a large negative "
                "number instead of -inf gives such a row a softmax over masked keys; its out "
                "must be 0 and its lse -inf")
    big = bool(q.size and k.size) and \
        np.abs(np.einsum("iad,jad->aij", q, k)).max() / np.sqrt(d) > 500
    if big and not (np.isfinite(o).all() and np.isfinite(lse[~empty]).all()):
        return ("inf or NaN where the scores are about 1000: exp(1000) overflows; subtract the "
                "row maximum of the scores before exp")
    if same(o, ref_o) and q.shape[1] == k.shape[1] and len(k):
        scores = np.einsum("iad,jad->aij", q, k) / np.sqrt(d)
        masked = np.where(k_pos[None, None, :] <= q_pos[None, :, None], scores, -np.inf) \
            if causal else scores
        for m in (masked.max(-1).T, scores.max(-1).T):   # (sq, a)
            with np.errstate(all="ignore"):
                if same(np.where(empty, lse, lse + m), ref_l):
                    return ("your out is right but your lse misses the row maximum you "
                            "subtracted: lse = m + log(sum of exp(x - m))")
    return None


def max_over_all_keys(q, k, v, q_pos, k_pos):
    """(out, lse) of causal attention whose softmax subtracts the row maximum over every key,
    the masked ones too."""
    x = np.einsum("iad,jad->aij", q, k) / np.sqrt(q.shape[-1])
    m = x.max(-1, keepdims=True)
    with np.errstate(all="ignore"):
        p = np.where(np.asarray(k_pos)[None, None, :] <= np.asarray(q_pos)[None, :, None],
                     np.exp(x - m), 0.0)
        tot = p.sum(-1)
        lse = np.where(tot > 0, np.log(np.where(tot > 0, tot, 1.0)) + m[..., 0], -np.inf)
        out = np.einsum("aij,jad->iad", p / np.where(tot > 0, tot, 1.0)[..., None], v)
    return out, lse.T


_NO_SHIFT = ("your merge has no max shift: exp overflows (or underflows to 0) at lse = {}; "
             "subtract the larger of the two lse before exp")


def merge_mistake(o1, l1, o2, l2, out) -> str | None:
    try:
        o, lse = (np.asarray(x, dtype=float) for x in out)
    except (TypeError, ValueError):
        return None
    from ..sim.attention import merge as ref_merge
    ref_o, ref_l = ref_merge(o1, l1, o2, l2)
    if o.shape != ref_o.shape or lse.shape != ref_l.shape:
        return None
    both = np.isneginf(l1) & np.isneginf(l2)
    with np.errstate(all="ignore"):
        top = np.maximum(l1, l2)
        if (np.isnan(lse) | np.isnan(o).any(-1))[both].any():
            unshifted = np.log(np.exp(l1) + np.exp(l2))       # a merge without the max shift
            plain = (np.exp(l1 - unshifted)[..., None] * o1 + np.exp(l2 - unshifted)[..., None] * o2,
                     unshifted)
            return Diagnosis(["NaN where both sides saw no key: the shift is then -inf, and "
                              "-inf - (-inf) is NaN; two empty sides merge to o = 0, lse = -inf"]
                             + ([_NO_SHIFT.format(800)] if same([o, lse], list(plain)) else []))
        bad = ~(np.isfinite(lse) | both) | ~np.isfinite(o).all(-1)
        if bad.any():
            big = float(np.abs(top[bad & np.isfinite(top)]).max()) if (bad & np.isfinite(top)).any() \
                else 0.0
            if big > 300:
                return _NO_SHIFT.format(f"{big:.0f}")
        m = np.where(np.isfinite(top), top, 0.0)
        w1, w2 = np.exp(l1 - m), np.exp(l2 - m)
    tie = (l1 == l2) & np.isfinite(l1)
    cands = [
        ("where lse1 == lse2 your merge keeps side 1: two sides of equal mass weigh 1/2 each "
         "(and the lse grows by log 2); a guard for two empty sides must ask for -inf, not for "
         "equal lse", lambda: (np.where(tie[..., None], o1, ref_o), None)),
        ("you averaged the two outputs: each side's weight is its share of the probability mass, "
         "exp(lse_i - lse)", lambda: ((o1 + o2) / 2, None)),
        ("each weight multiplies the other side's output: exp(lse1 - lse) belongs to o1",
         lambda: (np.exp(l2 - np.where(np.isfinite(ref_l), ref_l, 0))[..., None] * o1 +
                  np.exp(l1 - np.where(np.isfinite(ref_l), ref_l, 0))[..., None] * o2, None)),
        ("your weights exp(lse_i - m) do not add up to 1: divide them by their sum (the weight of "
         "a side is exp(lse_i - lse))", lambda: (w1[..., None] * o1 + w2[..., None] * o2, None)),
        ("your lse is the larger of the two: the merged lse is the log of the summed mass, "
         "log(exp(lse1) + exp(lse2))", lambda: (None, np.maximum(l1, l2))),
        ("your lse misses the m you subtracted: lse = m + log(exp(lse1 - m) + exp(lse2 - m))",
         lambda: (None, np.where(np.isfinite(ref_l), ref_l - m, ref_l))),
    ]
    found = []
    for text, make in cands:
        with np.errstate(all="ignore"):
            co, cl = make()
        if (co is not None and same(o, co) and not same(co, ref_o)) or \
                (cl is not None and same(lse, cl) and not same(cl, ref_l)):
            found.append(text)
    return Diagnosis(found) if found else None


# --------------------------------------------------------------------------- 04
def all_to_all_mistake(delivered, out, axis: int) -> str | None:
    """``delivered[i][j]``: what rank j received from rank i; the right answer of rank j
    joins ``delivered[0][j], delivered[1][j], ...`` along ``axis`` (0: seq_to_heads, the
    token axis; 1: heads_to_seq, the head axis)."""
    n = len(delivered)
    dl = [[np.asarray(b, dtype=float) for b in row] for row in delivered]
    name = "token" if axis == 0 else "head"
    if out is not None and len(out) == n:
        got, want = shape_of(out[0]), np.concatenate([dl[i][0] for i in range(n)], axis=axis).shape
        if got == (n,) + dl[0][0].shape and got != want:
            return (f"your shard has shape {got}: stacking the received blocks adds a new axis; "
                    f"join them along the existing {name} axis")
        other = np.concatenate([dl[0][0]] * n, axis=1 - axis).shape if n > 1 else None
        if got == other and got != want:
            return (f"your shard has shape {got}: you joined the received blocks along the "
                    f"{'head' if axis == 0 else 'token'} axis; they go along the {name} axis")
    return first(out, [
        (f"rank j's blocks are in reverse order: the block from rank 0 comes first along the "
         f"{name} axis", lambda: [np.concatenate([dl[i][j] for i in range(n)][::-1], axis=axis)
                                 for j in range(n)]),
        ("you joined what the other ranks received from rank j, not what rank j received: "
         "all_to_all returns received[j][i], what rank j got from rank i",
         lambda: [np.concatenate([dl[j][i] for i in range(n)], axis=axis) for j in range(n)]),
        (f"your {name}s are interleaved (the first {name} of every block, then the second, ...): "
         f"the received blocks go one after the other",
         lambda: [np.stack([dl[i][j] for i in range(n)], axis=axis + 1).reshape(
             np.concatenate([dl[i][j] for i in range(n)], axis=axis).shape) for j in range(n)]),
    ])


def ulysses_bytes_mistake(s, h, n, g, e, yours, g_passed: bool, e_passed: bool) -> str | None:
    def f(s=s, h=h, n=n, g=g, e=e, kv=2.0, qo=2.0, frac=True):
        return ((n - 1) / n if frac else 1.0) * (qo + kv / g) * s * h * e / n
    right = f()
    cands = []
    if not g_passed:
        cands += [("g was not passed here: its default is 1 (multi-head attention)", f(g=gg))
                  for gg in (2, 4, 8)]
    if not e_passed:
        cands += [("e was not passed here: its default is 2 bytes per element (bf16)", f(e=ee))
                  for ee in (1, 4)]
    cands += [
        (f"your count ignores GQA: with g = {g}, K and V have h/g columns", f(g=1)),
        (f"your count divides all four tensors by g = {g}: only K and V are smaller under GQA",
         f(g=1) / g),
        (f"your count is for 2 bytes per element: this case passes e = {e}", f(e=2)),
        ("your count is N_c times too large: each rank holds s/N_c tokens of each tensor",
         f() * n),
        ("you left out (N_c-1)/N_c: an all-to-all keeps the block a rank sends to itself",
         f(frac=False)),
        ("1/N_c instead of (N_c-1)/N_c: an all-to-all sends all blocks but the rank's own",
         f(frac=False) / n),
        ("K and V are counted once: they are two tensors, each with h/g columns", f(kv=1.0)),
        ("three all-to-alls: the output goes back through a fourth one", f(qo=1.0)),
    ]
    return first(yours, unless_right(cands, right))


# --------------------------------------------------------------------------- 05
def _moe_variant(experts, keep, Ne, E, h, e, *, dropped_sent=False, local_sent=False, combine=True,
                 load_all=False, expert_gpu="block", token_gpu="block"):
    experts, keep = np.asarray(experts), np.asarray(keep, dtype=bool)
    N, k = experts.shape
    T = N // Ne
    tok = np.arange(N)
    src = ((tok // T) if token_gpu == "block" else tok % Ne)[:, None] * np.ones(k, dtype=int)
    dst = experts // (E // Ne) if expert_gpu == "block" else experts % Ne
    sent = np.ones_like(keep) if dropped_sent else keep
    remote = sent if local_sent else sent & (src != dst)
    out = np.bincount(src[remote], minlength=Ne) * h * e
    if combine:
        out = out + np.bincount(dst[remote], minlength=Ne) * h * e
    load = np.bincount(dst[np.ones_like(keep) if load_all else keep], minlength=Ne)
    return out, load


_MODULO = ("you put expert i on GPU i mod Ne: the experts of a GPU are consecutive, E/Ne per "
           "GPU")


def moe_stats_mistake(key, yours, experts, keep, Ne, E, h, e, e_passed) -> str | None:
    v = lambda **kw: _moe_variant(experts, keep, Ne, E, h, e, **kw)
    if key == "drop_rate":
        N, k = np.shape(experts)
        dropped = int((~np.asarray(keep, dtype=bool)).sum())
        return first(yours, [
            ("your drop rate divides by the N tokens: it is a fraction of the N k copies",
             lambda: dropped / N if k > 1 else None),
            ("that is the fraction kept: the drop rate counts the dropped copies",
             lambda: 1 - dropped / (N * k)),
        ])
    if key == "load_per_gpu":
        return first(yours, [
            ("your load counts the dropped copies too: a dropped copy is never computed",
             lambda: v(load_all=True)[1]),
            (_MODULO, lambda: v(expert_gpu="modulo")[1] if Ne < E else None),
        ]) or (f"your load has {shape_of(yours)[0]} entries: one per GPU, with 0 for a GPU whose "
               f"experts got no copy" if shape_of(yours) not in (None, (Ne,)) and
               len(shape_of(yours)) == 1 else None)
    if shape_of(yours) not in (None, (Ne,)) and len(shape_of(yours) or ()) == 1:
        return (f"your bytes have {shape_of(yours)[0]} entries: one per GPU, with 0 for a GPU that "
                f"sends nothing")
    cands = []
    if not e_passed:
        cands.append(("e was not passed here: its default is 2 bytes per element (bf16)",
                      lambda: _moe_variant(experts, keep, Ne, E, h, 1)[0]))
    cands += [
        ("your bytes count the dropped copies: a dropped copy is never sent",
         lambda: v(dropped_sent=True)[0]),
        ("your bytes count the copies whose expert is on the token's own GPU: those stay put",
         lambda: v(local_sent=True)[0]),
        ("your bytes count the dispatch only: the outputs travel back in the combine, h e bytes "
         "per copy, sent by the expert's GPU", lambda: v(combine=False)[0]),
        (_MODULO, lambda: v(expert_gpu="modulo")[0] if Ne < E else None),
        ("your bytes put token t on GPU t mod Ne: GPU g holds the T consecutive tokens "
         "g T .. (g+1) T - 1", lambda: v(token_gpu="modulo")[0] if Ne > 1 else None),
    ]
    return first(yours, cands)


def aux_loss_mistake(probs, experts, alpha, yours, alpha_passed) -> Diagnosis | None:
    probs, experts = np.asarray(probs, dtype=float), np.asarray(experts)
    N, E = probs.shape
    k = experts.shape[1]
    counts = np.bincount(experts.ravel(), minlength=E)
    f, P = counts / (N * k), probs.mean(axis=0)
    right = alpha * E * float(f @ P)
    cands = [
        ("your f_i counts copies per token (divided by N): f_i is a fraction of the N k copies, "
         "so the f_i add up to 1", alpha * E * float(counts / N @ P)),
        ("your loss has no factor E (or it averages f_i P_i over the experts instead of summing "
         "them): it is alpha E sum f_i P_i, which equals alpha for uniform routing",
         alpha * float(f @ P)),
        ("your P_i are the hard fractions f_i: P_i is the mean router probability of expert i",
         alpha * E * float(f @ f)),
        ("your f_i count only each token's first choice: f_i counts all k copies",
         alpha * E * float(np.bincount(experts[:, 0], minlength=E) / N @ P)),
        ("your P_i sum the probabilities over the tokens: P_i is their mean",
         alpha * E * float(f @ probs.sum(axis=0))),
    ]
    if not alpha_passed:
        cands += [("alpha was not passed here: its default is 1e-2", alpha_ * E * float(f @ P))
                  for alpha_ in (1e-3, 0.1, 1.0)]
    return first(yours, unless_right(cands, right))


# every hint function above notes the mistake it recognised (see lesson10.checks.parts)
for _name in [n for n in list(globals()) if n.endswith("_mistake")]:
    globals()[_name] = recognised(globals()[_name])
del _name
