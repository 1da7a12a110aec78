"""Checks of notebook 05: MoE dispatch. ``T`` is the number of tokens per GPU, ``N`` the
number of tokens routed together (all GPUs, or one batch), as in the notebook."""
from __future__ import annotations

import numpy as np

from .core import (_bool_array, _close_number, _compare, _exercise, _fail, _int_array, _log_int,
                   _pair, _run)


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
    """(label, logits, k): ties, +-1000, k = 1 and k = E, one token, integer logits."""
    cases = [("ties: integer logits in 0..2", rng.integers(0, 3, size=(12, 6)), 2),
             ("ties: every logit equal", np.full((3, 5), 0.5), 3),
             ("ties at the k-th place", np.array([[2.0, 1.0, 1.0, 0.0], [0.0, 1.0, 2.0, 1.0],
                                                  [1.0, 1.0, 1.0, 3.0]]), 2),
             ("large logits (about +-1000)", 1000.0 * np.where(rng.random((5, 1)) < 0.5, -1, 1)
              + 3 * rng.standard_normal((5, 6)), 3),
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


@_exercise("route_topk", NB05, 1, "top-k routing", "route_topk")
def check_route_topk(route_topk, rng):
    """``route_topk(logits, k) -> (experts, gates)``: for ``logits (T, E)``, the ids of the
    ``k`` experts with the largest logits per token (an integer array, best first, ties to
    the lower id) and their gates, a softmax over the ``k`` chosen logits."""
    from ..sim.moe import route_topk as ref
    err = 0.0
    cases = _route_cases(rng)
    hint_ids = ("np.argsort(-logits, axis=1, kind='stable')[:, :k]: largest first, and equal "
                "logits keep their id order (the default sort does not promise that)")
    for label, logits, k in cases:
        T, E = logits.shape
        e_t, g_t = ref(logits, k)
        out = _run("route_topk", route_topk, ("logits",), logits, k)
        where = f"{label} (T={T}, E={E}, k={k})"
        experts, gates = _pair("route_topk", out, where, "(experts, gates)")
        experts = _int_array("route_topk", experts, where, "experts",
                             hint="expert ids are integers: return np.argsort's result as it is "
                                  "(no float conversion)")
        if experts.shape != e_t.shape:
            _fail("route_topk", where, f"experts has shape {experts.shape}, expected {e_t.shape}",
                  show=False, hint="one row per token, k expert ids per row")
        if experts.size and (experts.min() < 0 or experts.max() >= E):
            _fail("route_topk", where, f"expert ids must lie in 0..{E - 1}",
                  show=False, hint="experts holds column indices of logits, not logit values")
        bad = np.flatnonzero((experts != e_t).any(axis=1))
        if bad.size:
            t = int(bad[0])
            z = np.asarray(logits, dtype=float)[t]
            yours_z, want_z = z[experts[t]], z[e_t[t]]
            if np.array_equal(yours_z, want_z):
                what = (f"token {t}: a tie: experts with equal logits must come in id order, "
                        f"lower id first")
            elif sorted(experts[t].tolist()) == sorted(e_t[t].tolist()):
                what = (f"token {t}: the right experts, but not best first (their logits in your "
                        f"order: {np.round(yours_z, 4).tolist()})")
            else:
                what = f"token {t}: these are not the {k} experts with the largest logits, best first"
            _fail("route_topk", where, what, experts[t], e_t[t], hint=hint_ids)
        err = max(err, _compare("route_topk", gates, g_t, where=where,
                                what="gate (in the order of your experts)", axes=("token", "choice"),
                                hint="gates[t, j] is the gate of experts[t, j]: softmax over the k "
                                     "chosen logits only (each row sums to 1), with the row max "
                                     "subtracted before exp (logits can be about 1000)"))
    return (f"{len(cases)} cases (ties, logits of +-1000, k = 1 .. E): right experts best first, "
            f"gates max error {err:.1e}")


def _capacity_cases(rng, n_random=6):
    """(label, N, E, k, capacity_factor, experts)."""
    cases = []
    fixed = [  # capacity factors where a float product lands just above an integer
        ("CF 1.1 * 360 / 6 = 66 exactly", 360, 6, 1, 1.1, dict(hot=80)),
        ("CF 1.1 * 50 / 5 = 11 exactly", 50, 5, 1, 1.1, dict(hot=20)),
        ("CF 1.1 * 2 * 75 / 3 = 55 exactly", 75, 3, 2, 1.1, dict(hot=75)),
        ("CF 1.35 * 2 * 20 / 6 = 9 exactly", 20, 6, 2, 1.35, dict(hot=15)),
        ("k = 3, CF < 1", 40, 4, 3, 0.75, dict(skew=1.5)),
        ("an expert nobody chooses", 24, 6, 2, 1.0, dict(hot=12, cold=1)),
        ("every token wants expert 0", 10, 4, 1, 1.0, dict(hot=10)),
        ("no capacity limit", 20, 4, 2, None, dict(skew=2.0)),
        ("CF 4: nothing dropped", 16, 8, 2, 4.0, dict(skew=1.0))]
    for label, N, E, k, cf, kw in fixed:
        cases.append((label, N, E, k, cf, _choices(rng, N, E, k, **kw)))
    for i in range(n_random):    # any 2-decimal factor and size: no table of C covers them
        E = _log_int(rng, 2, 64)
        k = int(rng.integers(1, min(E, 4) + 1))
        N = _log_int(rng, 1, 300, upper=i % 2 == 1)
        cf = round(float(rng.uniform(0.25, 4.0)), 2)
        cases.append((f"random {i}, skewed router", N, E, k, cf, _choices(rng, N, E, k, skew=1.5)))
    return cases


@_exercise("capacity", NB05, 2, "capacity factor: which copies are dropped", "capacity_keep")
def check_capacity(capacity_keep, rng):
    """``capacity_keep(experts, E, capacity_factor) -> bool (N, k)``: every expert accepts at
    most ``C = ceil(capacity_factor * k * N / E)`` copies, computed exactly (the factor read
    as the decimal number it is written as), first come first served in token order;
    ``capacity_factor=None`` keeps everything."""
    from ..sim.moe import capacity_keep as ref_keep, expert_capacity
    cases = _capacity_cases(rng)
    for label, N, E, k, cf, experts in cases:
        C = expert_capacity(N, E, k, cf)
        target = ref_keep(experts, E, C)
        out = _run("capacity", capacity_keep, ("experts",), experts, E, cf)
        where = f"{label} (N={N} tokens, E={E}, k={k}, capacity_factor={cf}, so C = {C})"
        yours = _bool_array("capacity", out, where, "keep")
        if yours.shape != target.shape:
            _fail("capacity", where, f"keep has shape {yours.shape}, expected {target.shape}",
                  show=False, hint="one True/False per (token, choice)")
        kept = [int((yours & (experts == i)).sum()) for i in range(E)]
        want = [int((target & (experts == i)).sum()) for i in range(E)]
        if kept != want:
            i = int(np.argmax(np.array(kept) != np.array(want)))
            _fail("capacity", where, f"expert {i} keeps {kept[i]} copies", kept[i], want[i],
                  hint="C = ceil(capacity_factor * k * N / E) computed exactly: "
                       "math.ceil(Fraction(str(capacity_factor)) * k * N / E) (in floats 1.1 * 360 "
                       "/ 6 is 66.00000000000001, whose ceil is 67); an expert keeps a copy while "
                       "fewer than C copies have arrived before it")
        _compare("capacity", yours, target, where=where, what="keep", axes=("token", "choice"),
                 exact=True,
                 hint="first come, first served in token order: token 0's choices, then token "
                      "1's, ...; an expert that is full drops every later copy")
    return (f"{len(cases)} routings (capacity factors whose float product is off by one, "
            f"empty experts, None) drop the right copies")


def _moe_case(rng, Ne, E, k, T, h, cf, e, logits=None):
    """Route a batch through the reference expert-parallel layer; return the choices, the
    kept copies, the byte ledger of its two all-to-alls and its stats. With ``logits``
    (N, E) the tokens are those logits and the router the identity, so h = E."""
    from ..sim.comm import SimGroup
    from ..sim.moe import capacity_keep, expert_capacity, moe_layer, route_topk
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
    keep = capacity_keep(chosen, E, expert_capacity(Ne * T, E, k, cf))
    return chosen, keep, group.bytes_sent.copy(), stats


@_exercise("moe_stats", NB05, 2, "drops, all-to-all bytes and load per GPU", "moe_stats")
def check_moe_stats(moe_stats, rng):
    """``moe_stats(experts, keep, Ne, E, h, e=2) -> dict`` with ``drop_rate`` (fraction of
    the ``N k`` copies dropped), ``bytes_per_gpu`` (array ``(Ne,)``: bytes each GPU sends in
    the dispatch and the combine; a kept copy whose expert is on another GPU costs ``h e``
    each way, a local or dropped copy nothing) and ``load_per_gpu`` (kept copies each GPU's
    experts compute). GPU ``g`` holds tokens ``g T .. (g+1) T - 1``; expert ``i`` is
    on GPU ``i // (E/Ne)``. Checked against the byte ledger of ``lesson10.sim.moe_layer``."""
    # (label, Ne, E, k, T, h, cf, e, logits kw); h None: the crafted logits are the tokens (h = E)
    fixed = [("the last GPU's experts get no copy", 4, 8, 2, 6, None, None, 2, dict(cold=2)),
             ("E/Ne = 2, every token wants expert 0", 2, 4, 1, 5, None, 1.0, 1, dict(hot=10)),
             ("one GPU: nothing travels", 1, 4, 2, 6, None, 1.0, 2, dict(skew=1.0)),
             ("heavy drops, k = 3", 2, 6, 3, 4, None, 0.5, 4, dict(skew=2.0)),
             ("E = Ne", 4, 4, 2, 5, None, 0.75, 2, dict(skew=1.0))]
    cases = []
    for label, Ne, E, k, T, h, cf, e, kw in fixed:
        cases.append((label, Ne, E, k, T, E, cf, e, _logits(rng, Ne * T, E, **kw)))
    for i, (Ne, E, k, T, h, cf, e) in enumerate([(4, 8, 2, 12, 4, 1.0, 2), (2, 4, 1, 10, 3, 1.25, 1),
                                                 (4, 4, 2, 8, 5, None, 2), (3, 6, 2, 10, 4, 0.75, 4)]):
        cases.append((f"random {i}", Ne, E, k, T, h, cf, e, None))
    for label, Ne, E, k, T, h, cf, e, logits in cases:
        chosen, keep, ledger, stats = _moe_case(rng, Ne, E, k, T, h, cf, e, logits)
        args = (chosen, keep, Ne, E, h) + (() if e == 2 and label.startswith("E = Ne") else (e,))
        out = _run("moe_stats", moe_stats, ("experts", "keep"), *args)
        where = (f"{label} (Ne={Ne} GPUs, E={E}, k={k}, T={T} tokens per GPU, h={h}, e={e}"
                 f"{' not passed' if len(args) == 5 else ''}, capacity_factor={cf})")
        if not isinstance(out, dict) or not {"drop_rate", "bytes_per_gpu", "load_per_gpu"} <= set(out):
            _fail("moe_stats", where, "return a dict with keys drop_rate, bytes_per_gpu, "
                  "load_per_gpu", show=False,
                  hint='return {"drop_rate": ..., "bytes_per_gpu": ..., "load_per_gpu": ...}')
        _close_number("moe_stats", out["drop_rate"], stats["dropped"] / (Ne * T * k), where=where,
                      what="drop_rate", hint="dropped copies / (N k), with N = Ne T tokens in total")
        _compare("moe_stats", out["load_per_gpu"], stats["load_per_gpu"], where=where,
                 what="load_per_gpu", axes=("GPU",),
                 hint="count the kept copies whose expert lives on each GPU (expert i is on GPU "
                      "i // (E/Ne)); dropped copies are not computed; a GPU with no copy counts 0 "
                      "(np.bincount(..., minlength=Ne))")
        _compare("moe_stats", out["bytes_per_gpu"], ledger, where=where, what="bytes_per_gpu",
                 axes=("GPU",),
                 hint="GPU g holds tokens g T .. (g+1) T - 1; dispatch: it sends h e bytes per kept "
                      "copy of its tokens that goes to another GPU; combine: it sends back h e bytes "
                      "per copy it computed for another GPU; local and dropped copies cost nothing")
    return f"{len(cases)} routings (empty GPUs, drops, one GPU): drops, loads and bytes match the simulated all-to-alls"


@_exercise("aux_loss", NB05, 1, "the Switch load-balancing loss", "switch_aux_loss")
def check_aux_loss(switch_aux_loss, rng):
    """``switch_aux_loss(probs, experts, alpha=1e-2) -> float``: ``alpha E sum_i f_i P_i`` with
    ``f_i`` the fraction of the ``N k`` copies routed to expert ``i`` and ``P_i`` the mean
    router probability of expert ``i``, for ``probs (N, E)`` and ``experts (N, k)``."""
    from ..sim.moe import route_topk, router_probs, switch_aux_loss as ref
    # (label, N, E, k, alpha, logits kw); alpha None: not passed (the default 1e-2)
    spec = [("uniform router, k = 1", 16, 4, 1, 1e-2, dict()),
            ("skewed, k = 2", 20, 6, 2, 0.1, dict(skew=2.0)),
            ("the last two experts are never chosen", 12, 6, 2, 1e-2, dict(cold=2)),
            ("alpha not passed (default 1e-2)", 10, 5, 2, None, dict(skew=1.0)),
            ("k = 3", 5, 8, 3, 0.1, dict(skew=1.0)),
            ("one token", 1, 3, 2, 1e-3, dict())]
    for i in range(6):
        E = int(rng.integers(3, 10))
        spec.append((f"random {i}", int(rng.integers(1, 40)), E, int(rng.integers(1, min(E, 4) + 1)),
                     float(rng.choice([1e-2, 1e-3, 0.1])), dict(skew=float(rng.uniform(0, 3)))))
    for label, N, E, k, alpha, kw in spec:
        logits = _logits(rng, N, E, **kw)
        experts, _ = route_topk(logits, k)
        probs = router_probs(logits)
        args = (probs, experts) + (() if alpha is None else (alpha,))
        out = _run("aux_loss", switch_aux_loss, ("probs", "experts"), *args)
        _close_number("aux_loss", out, ref(probs, experts, 1e-2 if alpha is None else alpha),
                      where=f"{label} (N={N}, E={E}, k={k}, alpha={alpha})", what="loss",
                      hint="f_i = (copies sent to expert i) / (N k) so that sum_i f_i = 1, with a 0 "
                           "for an expert nobody chose (np.bincount(..., minlength=E)); P_i = "
                           "probs[:, i].mean(); loss = alpha * E * sum_i f_i P_i (= alpha when "
                           "routing is uniform)")
    return f"{len(spec)} routings (k = 1..3, skewed, empty experts): matches alpha E sum f_i P_i"
