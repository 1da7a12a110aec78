"""Checks of notebook 05: MoE dispatch. ``T`` is the number of tokens per GPU, ``N`` the
number of tokens routed together (all GPUs, or one batch), as in the notebook."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import mistakes
from .capacity_edges import fixed_float32_traps, float32_capacities, float32_traps, float_mistakes
from .core import (
    Cases,
    as_pair,
    bool_array,
    close_number,
    compare_arrays,
    fail_check,
    int_array,
    log_int,
    register_exercise,
    run_student,
)
from .parts import in_part, recognised
from .precision import plural

NB05 = "05_moe_dispatch"


def _logits(rng, N, E, skew=0.0, hot=0, cold=0):
    """Router logits ``(N, E)``: Gumbel noise plus a per-expert skew; the first ``hot`` of
    a random choice of tokens put expert 0 first, and the last ``cold`` experts are never
    chosen (they stay empty)."""
    z = skew * rng.standard_normal(E)[None, :] + rng.gumbel(size=(N, E))
    if hot:
        z[rng.permutation(N)[:hot], 0] += 100.0
    if cold:
        z[:, E - cold:] -= 100.0
    return z


def _choices(rng, N, E, k, **kw):
    """Top-k expert ids ``(N, k)`` of :func:`_logits` (distinct per token, best first)."""
    return np.argsort(-_logits(rng, N, E, **kw), axis=1, kind="stable")[:, :k]


def _route_cases(rng, n_random=8):
    """(label, logits, k): ties, +-1000, logits hundreds apart, k = 1 and k = E, one token,
    integer-valued logits."""
    E = 6
    apart = np.full((E, E), 0.0)               # row t: expert (t + j) % E has logit -400 j
    for t in range(E):
        apart[t, (t + np.arange(E)) % E] = -400.0 * np.arange(E)
    cases = [("ties: integer-valued logits in 0..2", rng.integers(0, 3, size=(12, 6)).astype(float), 2),
             ("ties: every logit equal", np.full((3, 5), 0.5), 3),
             ("ties at the k-th place", np.array([[2.0, 1.0, 1.0, 0.0], [0.0, 1.0, 2.0, 1.0],
                                                  [1.0, 1.0, 1.0, 3.0]]), 2),
             ("large logits (about +-1000)", 1000.0 * np.where(rng.random((5, 1)) < 0.5, -1, 1)
              + 3 * rng.standard_normal((5, 6)), 3),
             ("logits hundreds apart (their softmax probabilities underflow to 0)", apart, 4),
             ("logits thousands apart, the chosen ones too", 2.5 * apart[:5, :5], 3),
             ("k = 1", rng.standard_normal((6, 5)) * 2, 1),
             ("k = E", rng.standard_normal((4, 4)) * 2, 4),
             ("one token", rng.standard_normal((1, 8)), 2)]
    for i in range(n_random):
        T, E = int(rng.integers(1, 13)), int(rng.integers(2, 11))
        k = int(rng.integers(1, min(E, 4) + 1))
        z = rng.standard_normal((T, E)) * float(rng.choice([1.0, 3.0, 300.0]))
        if rng.random() < 0.3:
            z = np.round(z)                                  # some ties
        cases.append((f"random {i}", z, k))
    return cases


def _softmax_rows(z):
    z = np.asarray(z, dtype=float)
    w = np.exp(z - z.max(axis=1, keepdims=True))
    return w / w.sum(axis=1, keepdims=True)


@recognised
def _route_mistake(logits, k, experts, gates):
    """The known mistakes that this (experts, gates) answer looks like, or None."""
    z = np.asarray(logits, dtype=float)
    try:
        gates = np.asarray(gates, dtype=float)
    except (TypeError, ValueError):
        return None
    if gates.shape != experts.shape:
        return None
    chosen = np.take_along_axis(z, experts, axis=1)
    big = np.abs(z).max() > 700 if z.size else False

    def unless(flag, make):
        return lambda: make() if flag else None
    with np.errstate(all="ignore"):
        raw = np.exp(chosen)
        found = mistakes.first(gates, [
            ("your gates look like the softmax over all E logits, taken at the chosen experts: "
             "the gates are a softmax over the k chosen logits only, so each row sums to 1",
             unless(k < z.shape[1], lambda: np.take_along_axis(_softmax_rows(z), experts, axis=1))),
            ("your gates look like the chosen logits divided by their sum: a softmax normalises "
             "exp(logit), not the logits", lambda: chosen / chosen.sum(axis=1, keepdims=True)),
            ("exp of logits of about 1000 overflows: subtract the row maximum first",
             unless(big, lambda: raw / raw.sum(axis=1, keepdims=True))),
        ])
    with np.errstate(all="ignore"):
        mean = np.exp(chosen - chosen.mean(axis=1, keepdims=True))
        mean = mean / mean.sum(axis=1, keepdims=True)
        plain = raw / raw.sum(axis=1, keepdims=True)          # no shift at all
    finite = np.isfinite(gates)
    if finite.all():
        return found
    texts, as_mean = [], np.array_equal(finite, np.isfinite(mean))
    if big and (np.array_equal(finite, np.isfinite(plain)) or not as_mean):
        texts.append("your gates are not finite where the logits are about 1000: exp(1000) "
                     "overflows; subtract the row's largest chosen logit before exp")
    if as_mean:
        texts.append("your gates are not finite where the chosen logits lie thousands apart, as "
                     "a softmax shifted by the mean of the chosen logits is: the largest logit "
                     "minus the mean is still in the thousands and its exp overflows; subtract "
                     "the row's largest chosen logit, so that no exp exceeds 1")
    return mistakes.Diagnosis(texts + list(getattr(found, "mistakes", ()))) if texts else found


def _wrong_experts(z, k, t, yours_z, want_z):
    """(what, hint) for token t, whose chosen experts are not the right ones."""
    if sorted(yours_z[t].tolist()) == sorted(want_z[t].tolist()):
        return (f"token {t}: the right experts, but not best first (their logits in your order: "
                f"{np.round(yours_z[t], 4).tolist()})", "order the k experts from the largest logit down")
    if np.array_equal(np.sort(yours_z[t]), np.sort(z[t])[:k]):
        return (f"token {t}: these are the experts with the {plural(k, 'smallest logit')}",
                "your sort is ascending: the router keeps the largest logits")
    p = _softmax_rows(z[t:t + 1])[0]
    with np.errstate(all="ignore"):
        py, pw = np.exp(yours_z[t] - z[t].max()) / np.exp(z[t] - z[t].max()).sum(), \
            np.exp(want_z[t] - z[t].max()) / np.exp(z[t] - z[t].max()).sum()
    if (p == 0).any() and np.array_equal(np.sort(py), np.sort(pw)):
        return (f"token {t}: these are not the {plural(k, 'expert')} with the largest logits, best first",
                "your experts tie where their softmax probabilities underflow to 0 (logits "
                "hundreds below the row's best): rank the experts by what stays distinct")
    return (f"token {t}: these are not the {plural(k, 'expert')} with the largest logits, best first",
            "the router keeps, for every token, the k experts whose logits are the largest")


def _route_case(route_topk, label, logits, k) -> float:
    from ..sim.moe import route_topk as ref
    T, E = logits.shape
    e_t, g_t = ref(logits, k)
    out = run_student("route_topk", route_topk, ("logits",), logits, k)
    where = f"{label} (T={T}, E={E}, k={k})"
    experts, gates = as_pair("route_topk", out, where, "(experts, gates)")
    experts = int_array("route_topk", experts, where, "experts",
                         hint="expert ids are integers: keep the integer indices that "
                              "sorting gives you (no float conversion)")
    if experts.shape != e_t.shape:
        fail_check("route_topk", where, f"experts has shape {experts.shape}, expected {e_t.shape}",
              show=False, hint="one row per token, k expert ids per row")
    if experts.size and (experts.min() < 0 or experts.max() >= E):
        fail_check("route_topk", where, f"expert ids must lie in 0..{E - 1}",
              show=False, hint="experts holds column indices of logits, not logit values")
    twice = [t for t in range(T) if len(set(experts[t].tolist())) < k]
    if twice:
        t = twice[0]
        fail_check("route_topk", where, f"token {t} chose an expert twice", experts[t], e_t[t],
              hint="a token's k experts are k different columns of its row")
    z = np.asarray(logits, dtype=float)
    yours_z, want_z = np.take_along_axis(z, experts, axis=1), np.take_along_axis(z, e_t, axis=1)
    bad = np.flatnonzero((yours_z != want_z).any(axis=1))
    if bad.size:
        what, hint = _wrong_experts(z, k, int(bad[0]), yours_z, want_z)
        fail_check("route_topk", where, what, experts[int(bad[0])], e_t[int(bad[0])],
              hint=hint + " (experts with exactly equal logits may come in any order)")
    return compare_arrays(
        "route_topk", gates, g_t, where=where, what="gate (in the order of your experts)",
        axes=("token", "choice"),
        hint=lambda: mistakes.explain(_route_mistake(logits, k, experts, gates), (
            "gates[t, j] belongs to experts[t, j]: a softmax over the token's k chosen logits "
            "(each row sums to 1), which must stay finite for logits of about 1000")))


@register_exercise("route_topk", NB05, "top-k routing", "route_topk",
                   withholds={
                       "lesson10.sim.moe.route_topk": "adapter:route_topk"})
def check_route_topk(route_topk, rng):
    """``route_topk(logits, k) -> (experts, gates)``: for ``logits (T, E)``, the ids of the
    ``k`` experts with the largest logits per token (an integer array, best first; experts
    with exactly equal logits may come in any order) and their gates, a softmax over the
    ``k`` chosen logits."""
    err = 0.0
    cases = _route_cases(rng)
    run = Cases("route_topk")
    for label, logits, k in cases:
        with run.case():
            err = max(err, _route_case(route_topk, label, logits, k))
    run.verdict()
    return (f"{len(cases)} cases (ties, logits of +-1000 and hundreds apart, k = 1 .. E): right "
            f"experts best first, gates max error {err:.1e}")


def _capacity_cases(rng, n_random=6):
    """(label, N, E, k, capacity_factor, experts)."""
    cases = []
    fixed: list[tuple[Any, ...]] = [  # exact products that are integers where floats land a hair above
        # (together every order of the float product, and Fraction(cf), gives C + 1 in one of
        # the first four); and products that are exact in floats too (1.5, 1.25, 1.0)
        ("CF 1.1 * 360 / 6 = 66 exactly", 360, 6, 1, 1.1, dict(hot=80)),
        ("CF 1.1 * 50 / 5 = 11 exactly", 50, 5, 1, 1.1, dict(hot=20)),
        ("CF 1.1 * 2 * 75 / 3 = 55 exactly", 75, 3, 2, 1.1, dict(hot=75)),
        ("CF 1.35 * 2 * 20 / 6 = 9 exactly", 20, 6, 2, 1.35, dict(hot=15)),
        ("CF 1.5 * 2 * 12 / 4 = 9, exact in floats too", 12, 4, 2, 1.5, dict(hot=12)),
        ("CF 1.25 * 48 / 6 = 10, exact in floats too", 48, 6, 1, 1.25, dict(hot=30)),
        ("k = 3, CF < 1", 40, 4, 3, 0.75, dict(skew=1.5)),
        ("an expert nobody chooses", 24, 6, 2, 1.0, dict(hot=12, cold=1)),
        ("every token wants expert 0", 10, 4, 1, 1.0, dict(hot=10)),
        ("no capacity limit", 20, 4, 2, None, dict(skew=2.0)),
        ("CF 4: nothing dropped", 16, 8, 2, 4.0, dict(skew=1.0))]
    for label, N, E, k, cf, kw in fixed:
        cases.append((label, N, E, k, cf, _choices(rng, N, E, k, **kw)))
    traps = float32_traps()       # searched, not drawn: float32(cf) lands on C + 1
    drawn = [("random, ", traps[int(i)]) for i in rng.choice(len(traps), size=2, replace=False)]
    for how, (cf, N, E, k, C) in [("", t) for t in fixed_float32_traps()] + drawn:
        cases.append((f"{how}CF {cf} * {k} * {N} / {E} = {C} exactly, and float32({cf}) is a "
                      f"little above {cf}", N, E, k, cf, _choices(rng, N, E, k, hot=N)))
    for i in range(n_random):    # any 2-decimal factor and size: no table of C covers them
        E = log_int(rng, 2, 64)
        k = int(rng.integers(1, min(E, 4) + 1))
        N = log_int(rng, 1, 300, upper=i % 2 == 1)
        cf = round(float(rng.uniform(0.25, 4.0)), 2)
        cases.append((f"random {i}, skewed router", N, E, k, cf, _choices(rng, N, E, k, skew=1.5)))
    return cases


@recognised
def _capacity_mistake(yours, experts, E, k, N, cf, C):
    """The known mistakes the kept copies look like (a Diagnosis), or None; ``C`` is the
    exact capacity, the only right one."""
    from fractions import Fraction

    from ..sim.moe import keep_within_capacity as ref_keep
    trivial = [f"you keep {'every' if yours.all() else 'no'} copy: each expert keeps its first "
               f"C = {C} copies and drops the later ones, whatever the routing; only "
               f"capacity_factor=None keeps them all"] if yours.all() or not yours.any() else []
    x = Fraction(repr(float(cf))) * k * N / E
    floats = float_mistakes(N, E, k, cf)
    texts = {"float": lambda c: f"your experts keep {c} copies, C = {C}: CF k N / E is {C} "
                                f"exactly, but computed from the float {cf} it comes out {C} + "
                                f"{float(floats[c]):.1e} and rounds up to {c}; compute C exactly, "
                                f"reading the factor as the decimal it is written as (a float, "
                                f"and Fraction of one, carry its binary rounding)",
             "float32": lambda c: f"your experts keep {c} copies, C = {C}: that is CF k N / E "
                                  f"computed from float32({cf}) = {float(np.float32(cf)):.9g}, a "
                                  f"little above {cf}, so the product lands just above {C} and "
                                  f"rounds up; compute C exactly",
             "floor": lambda c: f"your experts keep {c} copies: that is CF k N / E rounded down; "
                                f"the capacity rounds up",
             "plus one": lambda c: f"your experts keep one copy more than C = {C}: a copy is kept "
                                   f"while fewer than C copies came before it (< C, not <= C)",
             "nearest": lambda c: f"your experts keep {c} copies: CF k N / E rounded to the "
                                  f"nearest integer; the capacity rounds up",
             "without k": lambda c: "your capacity leaves out k: every token sends k copies, so "
                                    "the mean load per expert is k N / E"}
    firsts = [("float", c) for c in sorted(floats)] + [
        ("float32", c) for c in sorted(float32_capacities(N, E, k, cf))] + [
        ("floor", math.floor(x)), ("plus one", C + 1), ("nearest", round(x)),
        ("without k", math.ceil(Fraction(repr(float(cf))) * N / E))]
    found = trivial + [texts[name](c) for name, c in firsts
                       if c != C and np.array_equal(yours, ref_keep(experts, E, c))]
    flat = np.asarray(experts).ravel()
    orders = ((np.arange(flat.size)[::-1], "the last copies first (the queue runs from the end)"),
              (np.arange(flat.size).reshape(N, k).T.ravel(),
               "choice by choice (every token's first choice, then every token's second)"))
    right = ref_keep(experts, E, C)
    for order, text in orders:
        for c in sorted({C} | {c for _, c in firsts}):
            seen, keep = np.zeros(E, dtype=int), np.zeros(flat.size, dtype=bool)
            for idx in order:
                keep[idx] = seen[flat[idx]] < c
                seen[flat[idx]] += 1
            if np.array_equal(yours.ravel(), keep) and not np.array_equal(keep.reshape(N, k), right):
                found.append(f"your queue serves {text}: it is first come, first served in token "
                             f"order, each token's k choices together")
                break
    return mistakes.Diagnosis(found) if found else None


def _drops(N, E, k, cf, experts) -> bool:
    """Whether the capacity drops a copy: the part a case belongs to."""
    from ..sim.moe import expert_capacity
    from ..sim.moe import keep_within_capacity as ref_keep
    return not ref_keep(experts, E, expert_capacity(N, E, k, cf)).all()


def _capacity_case(capacity_keep, label, N, E, k, cf, experts, which=True):
    """One routing: the copies each expert keeps, and (``which``) which ones."""
    from ..sim.moe import expert_capacity
    from ..sim.moe import keep_within_capacity as ref_keep
    C = expert_capacity(N, E, k, cf)
    target = ref_keep(experts, E, C)
    out = run_student("capacity", capacity_keep, ("experts",), experts, E, cf)
    where = f"{label} (N={N} tokens, E={E}, k={k}, capacity_factor={cf}, so C = {C})"
    yours = bool_array("capacity", out, where, "keep")
    if yours.shape != experts.shape:
        fail_check("capacity", where, f"keep has shape {yours.shape}, expected {experts.shape}",
              show=False, hint="one True/False per (token, choice)")
    if np.array_equal(yours, target):
        return
    kept = [int((yours & (experts == i)).sum()) for i in range(E)]
    want = [int((target & (experts == i)).sum()) for i in range(E)]

    def hint(general):
        return lambda: mistakes.explain(
            None if cf is None else _capacity_mistake(yours, experts, E, k, N, cf, C), general)
    if kept != want:
        i = int(np.argmax(np.array(kept) != np.array(want)))
        fail_check("capacity", where, f"expert {i} keeps {plural(kept[i], 'copy', 'copies')}",
                   kept[i], want[i], hint=hint(
                       "capacity_factor=None means no limit at all" if cf is None else
                       "an expert keeps a copy while fewer than C copies have reached it, C "
                       "being CF k N / E rounded up, computed exactly: all N tokens count, with "
                       "their k copies"))
    if not which:
        return
    compare_arrays("capacity", yours, target, where=where, what=(
                       f"keep (the right number of copies per expert, C = {C}, but not the right "
                       f"copies)"), axes=("token", "choice"), exact=True,
                   hint=hint("first come, first served in token order, token 0's choices, then "
                             "token 1's, ...; an expert that is full drops every later copy"))


#: the parts of the capacity exercise: how many copies each expert keeps (every routing:
#: no limit, no drops, drops), and which copies (the routings with drops); each is lost by
#: an answer that keeps every copy, or none
CAPACITY_PARTS = ("copies kept per expert", "which copies are dropped")


@register_exercise("capacity", NB05, "capacity factor: which copies are dropped", "capacity_keep",
                   parts=CAPACITY_PARTS,
                   withholds={
                       "lesson10.sim.capacity.keep_within_capacity": "adapter:keep_within_capacity",
                       "lesson10.sim.capacity._queues": None, "lesson10.sim.capacity.arrival_order": None,
                       "lesson10.cost.expert_capacity": "adapter:expert_capacity",
                       "lesson10.rules.MoEConfig.capacity": "adapter:moe_capacity"})
def check_capacity(capacity_keep, rng):
    """``capacity_keep(experts, E, capacity_factor) -> bool (N, k)``: every expert accepts at
    most ``C = ceil(capacity_factor * k * N / E)`` copies, first come first served in token
    order; ``capacity_factor=None`` keeps everything. C is exact, the factor read as the
    decimal it is written as (1.1 is 11/10): where that product is an integer a float product
    (in any order), ``Fraction`` of the float or float32 can land a hair above it and round
    up to C + 1, and fixed cases hold such sizes."""
    cases = _capacity_cases(rng)
    run = Cases("capacity")
    for label, N, E, k, cf, experts in cases:
        count = in_part(CAPACITY_PARTS[0])
        which = _drops(N, E, k, cf, experts) and in_part(CAPACITY_PARTS[1])
        if not (count or which):
            continue
        with run.case():
            _capacity_case(capacity_keep, label, N, E, k, cf, experts, which)
    run.verdict()
    return (f"{len(cases)} routings (C exact where a float product lands a hair above an "
            f"integer, factors that float32 rounds across one, empty experts, None) drop the "
            f"right copies")


def _moe_case(rng, Ne, E, k, T, h, cf, e, logits=None):
    """Route a batch through the reference expert-parallel layer; return the choices, the
    kept copies, the byte ledger of its two all-to-alls and its stats. With ``logits``
    (N, E) the tokens are those logits and the router the identity, so h = E."""
    from ..sim.comm import SimGroup
    from ..sim.moe import expert_capacity, keep_within_capacity, moe_layer, route_topk
    if logits is None:
        bias = 1.5 * rng.standard_normal(E)                  # a few popular experts
        x = [rng.standard_normal((T, h)) for _ in range(Ne)]
        W = rng.standard_normal((h, E))
    else:
        bias, x, W = None, np.split(logits, Ne), np.eye(E)
    identity = [lambda z: z for _ in range(E)]               # the bytes do not depend on the experts
    group = SimGroup(Ne, e=e)
    _, stats = moe_layer(x, W, identity, k, capacity_factor=cf, group=group, bias=bias,
                         return_stats=True)
    chosen, _ = route_topk(np.concatenate(x) @ W, k, bias=bias)
    keep = keep_within_capacity(chosen, E, expert_capacity(Ne * T, E, k, cf))
    return chosen, keep, group.bytes_sent.copy(), stats


@register_exercise("moe_stats", NB05, "drops, all-to-all bytes and load per GPU", "moe_stats",
                   parts=("drops and load", "all-to-all bytes"),
                   withholds={
                       "lesson10.sim.moe._kept_per_source": None, "lesson10.sim.moe.moe_layer": None,
                       "lesson10.sim.moe.moe_reference": None,
                       "lesson10.sim.moe.simulate_moe": "adapter:simulate_moe",
                       "lesson10.sim.nodes.one_hop_copies": "adapter:one_hop_copies"})
def check_moe_stats(moe_stats, rng):
    """``moe_stats(experts, keep, Ne, E, h, e=2) -> dict`` with ``drop_rate`` (fraction of
    the ``N k`` copies dropped), ``bytes_per_gpu`` (array ``(Ne,)``: bytes each GPU sends in
    the dispatch and the combine; a kept copy whose expert is on another GPU costs ``h e``
    each way, a local or dropped copy nothing) and ``load_per_gpu`` (kept copies each GPU's
    experts compute). GPU ``g`` holds tokens ``g T .. (g+1) T - 1``; expert ``i`` is
    on GPU ``i // (E/Ne)``. Checked against the byte ledger of ``lesson10.sim.moe_layer``."""
    # (label, Ne, E, k, T, h, cf, e, logits kw); h None: the crafted logits are the tokens (h = E)
    fixed: list[tuple[Any, ...]] = [("the last GPU's experts get no copy", 4, 8, 2, 6, None, None, 2, dict(cold=2)),
             ("E/Ne = 2, every token wants expert 0", 2, 4, 1, 5, None, 1.0, 1, dict(hot=10)),
             ("one GPU: nothing travels", 1, 4, 2, 6, None, 1.0, 2, dict(skew=1.0)),
             ("heavy drops, k = 3", 2, 6, 3, 4, None, 0.5, 4, dict(skew=2.0)),
             ("E = Ne", 4, 4, 2, 5, None, 0.75, 2, dict(skew=1.0)),
             ("loads above 255", 2, 4, 2, 160, None, None, 2, dict(skew=1.0)),
             ("loads and bytes above 65535", 2, 2, 1, 33000, None, None, 1, dict(hot=66000))]
    cases = []
    for label, Ne, E, k, T, _h, cf, e, kw in fixed:
        cases.append((label, Ne, E, k, T, E, cf, e, _logits(rng, Ne * T, E, **kw)))
    for i, (Ne, E, k, T, h, cf, e) in enumerate([(4, 8, 2, 12, 4, 1.0, 2), (2, 4, 1, 10, 3, 1.25, 1),
                                                 (4, 4, 2, 8, 5, None, 2), (3, 6, 2, 10, 4, 0.75, 4)]):
        cases.append((f"random {i}", Ne, E, k, T, h, cf, e, None))
    run = Cases("moe_stats")
    for label, Ne, E, k, T, h, cf, e, logits in cases:
        with run.case():
            _moe_stats_case(moe_stats, _moe_case(rng, Ne, E, k, T, h, cf, e, logits),
                            label, Ne, E, k, T, h, cf, e)
    run.verdict()
    return (f"{len(cases)} routings (empty GPUs, drops, one GPU, loads above 65535): drops, loads "
            f"and bytes match the simulated all-to-alls")


def _moe_stats_case(moe_stats, routed, label, Ne, E, k, T, h, cf, e):
    chosen, keep, ledger, stats = routed
    args = (chosen, keep, Ne, E, h) + (() if e == 2 and label.startswith("E = Ne") else (e,))
    out = run_student("moe_stats", moe_stats, ("experts", "keep"), *args)
    where = (f"{label} (Ne={Ne} GPUs, E={E}, k={k}, T={T} tokens per GPU, h={h}, e={e}"
             f"{' not passed' if len(args) == 5 else ''}, capacity_factor={cf})")
    if not isinstance(out, dict) or not {"drop_rate", "bytes_per_gpu", "load_per_gpu"} <= set(out):
        fail_check("moe_stats", where, "return a dict with keys drop_rate, bytes_per_gpu, "
              "load_per_gpu", show=False,
              hint='return {"drop_rate": ..., "bytes_per_gpu": ..., "load_per_gpu": ...}')
    e_passed = len(args) == 6

    def hint(key, general):
        return lambda: mistakes.explain(mistakes.moe_stats_mistake(
            key, out[key], chosen, keep, Ne, E, h, e, e_passed), general)
    if in_part("drops and load"):
        _drops_and_load(out, stats, hint, where, Ne, T, k)
    if in_part("all-to-all bytes"):
        compare_arrays("moe_stats", out["bytes_per_gpu"], ledger, where=where, what="bytes_per_gpu",
                       axes=("GPU",),
                       hint=hint("bytes_per_gpu", "a GPU sends h e bytes for each kept copy of its own "
                                                  "tokens bound for another GPU (dispatch) and h e for "
                                                  "each copy it computed for another GPU (combine)"))


def _drops_and_load(out, stats, hint, where, Ne, T, k):
    close_number("moe_stats", out["drop_rate"], stats.dropped / (Ne * T * k), where=where,
                  what="drop_rate", hint=hint("drop_rate", "the fraction of all copies that "
                                                           "were dropped"))
    compare_arrays("moe_stats", out["load_per_gpu"], stats.load_per_gpu, where=where,
             what="load_per_gpu", axes=("GPU",),
             hint=hint("load_per_gpu", "the load of a GPU is the number of kept copies its "
                                       "experts compute; expert i lives on GPU i // (E/Ne)"))


@register_exercise("aux_loss", NB05, "the Switch load-balancing loss", "switch_aux_loss",
                   withholds={
                       "lesson10.sim.moe.switch_aux_loss": "switch_aux_loss"})
def check_aux_loss(switch_aux_loss, rng):
    """``switch_aux_loss(probs, experts, alpha=1e-2) -> float``: ``alpha E sum_i f_i P_i`` with
    ``f_i`` the fraction of the ``N k`` copies routed to expert ``i`` and ``P_i`` the mean
    router probability of expert ``i``, for ``probs (N, E)`` and ``experts (N, k)``."""
    from ..sim.moe import route_topk, router_probs
    from ..sim.moe import switch_aux_loss as ref
    # (label, N, E, k, alpha, logits kw); alpha None: not passed (the default 1e-2)
    spec: list[tuple[Any, ...]] = [("uniform router, k = 1", 16, 4, 1, 1e-2, dict()),
            ("skewed, k = 2", 20, 6, 2, 0.1, dict(skew=2.0)),
            ("the last two experts are never chosen", 12, 6, 2, 1e-2, dict(cold=2)),
            ("alpha not passed (default 1e-2)", 10, 5, 2, None, dict(skew=1.0)),
            ("k = 3", 5, 8, 3, 0.1, dict(skew=1.0)),
            ("one token", 1, 3, 2, 1e-3, dict())]
    for i in range(6):
        E = int(rng.integers(3, 10))
        spec.append((f"random {i}", int(rng.integers(1, 40)), E, int(rng.integers(1, min(E, 4) + 1)),
                     float(rng.choice([1e-2, 1e-3, 0.1])), dict(skew=float(rng.uniform(0, 3)))))
    run = Cases("aux_loss")
    for label, N, E, k, alpha, kw in spec:
        logits = _logits(rng, N, E, **kw)
        experts, _ = route_topk(logits, k)
        probs = router_probs(logits)
        with run.case():
            _aux_case(switch_aux_loss, ref, label, probs, experts, alpha)
    run.verdict()
    return f"{len(spec)} routings (k = 1..3, skewed, empty experts): matches alpha E sum f_i P_i"


def _aux_case(switch_aux_loss, ref, label, probs, experts, alpha):
    N, E = probs.shape
    args = (probs, experts) + (() if alpha is None else (alpha,))
    out = run_student("aux_loss", switch_aux_loss, ("probs", "experts"), *args)
    a = 1e-2 if alpha is None else alpha
    close_number("aux_loss", out, ref(probs, experts, a),
                  where=f"{label} (N={N}, E={E}, k={experts.shape[1]}, alpha={alpha})", what="loss",
                  hint=lambda: mistakes.explain(mistakes.aux_loss_mistake(
                      probs, experts, a, out, alpha is not None),
                      "f_i is the fraction of the N k copies routed to expert i (0 for an expert "
                      "nobody chose), P_i the mean router probability of expert i; the loss "
                      "equals alpha when routing is uniform"))
