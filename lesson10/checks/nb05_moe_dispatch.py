"""Checks of notebook 05: MoE dispatch."""
from __future__ import annotations

import numpy as np

from .core import _exercise, _as_array, _call, _close_number, _compare, _fail


NB05 = "05_moe_dispatch"


def _skewed_choices(rng, N, E, k, skew):
    """Top-k expert choices of N tokens whose router prefers a few experts."""
    logits = skew * rng.standard_normal(E)[None, :] + rng.gumbel(size=(N, E))
    return np.argsort(-logits, axis=1, kind="stable")[:, :k]


@_exercise("route_topk", NB05, 1, "top-k routing")
def check_route_topk(route_topk, rng):
    """``route_topk(logits, k) -> (experts, gates)``: for ``logits (T, E)``, the ``k`` experts
    with the largest logits per token (best first) and their gates, a softmax over the
    ``k`` chosen logits."""
    from ..sim.moe import route_topk as ref
    cases = [(int(rng.integers(3, 9)), int(rng.integers(k + 2, 10)), k) for k in (1, 2, 3)]
    err = 0.0
    for T, E, k in cases:
        logits = rng.standard_normal((T, E)) * 2
        e_t, g_t = ref(logits, k)
        out = _call(route_topk, logits.copy(), k)
        where = f"T={T}, E={E}, k={k}"
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            _fail("route_topk", where, "return a pair (experts, gates)", show=False)
        experts = _as_array("route_topk", out[0], where, "experts")
        if experts.shape != e_t.shape:
            _fail("route_topk", where, f"experts has shape {experts.shape}, expected {e_t.shape}",
                  show=False, hint="one row per token, k expert ids per row")
        # any order of the k choices is fine, as long as the gates follow the experts
        order_y, order_t = np.argsort(experts, axis=1), np.argsort(e_t, axis=1)
        ey = np.take_along_axis(experts, order_y, 1)
        et = np.take_along_axis(e_t, order_t, 1)
        _compare("route_topk", ey, et, where=where, what="the set of chosen experts",
                 axes=("token", "choice"), exact=True,
                 hint="take the k largest logits of each token (np.argsort(-logits, axis=1)[:, :k])")
        gates = _as_array("route_topk", out[1], where, "gates")
        if gates.shape != g_t.shape:
            _fail("route_topk", where, f"gates has shape {gates.shape}, expected {g_t.shape}",
                  show=False, hint="one gate per chosen expert")
        gy = np.take_along_axis(gates, order_y, 1)
        gt = np.take_along_axis(g_t, order_t, 1)
        if not np.allclose(gy, gt, rtol=1e-9, atol=1e-9) and \
                np.allclose(np.sort(gates, 1), np.sort(g_t, 1), rtol=1e-9, atol=1e-9):
            t = int(np.argmax(~np.isclose(gy, gt, rtol=1e-9, atol=1e-9).all(1)))
            _fail("route_topk", where, f"token {t}: the gate values are right but they do not "
                  f"follow your experts (experts {experts[t].astype(int).tolist()})",
                  gates[t], gt[t][np.argsort(np.argsort(experts[t]))],
                  hint="gates[t, j] must be the gate of experts[t, j]: sort or reorder both "
                       "arrays together (np.take_along_axis with the same indices)")
        err = max(err, _compare("route_topk", gy, gt, where=where,
                                what="gate (in the order of your experts)", axes=("token", "choice"),
                                hint="gates = softmax over the k chosen logits only, so each row "
                                     "sums to 1 (not the softmax over all E experts)"))
    return f"{len(cases)} random cases (k = 1, 2, 3): right experts, gates max error {err:.1e}"


@_exercise("capacity", NB05, 2, "capacity factor: which copies are dropped")
def check_capacity(capacity_keep, rng):
    """``capacity_keep(experts, E, capacity_factor) -> bool (N, k)``: every expert accepts at
    most ``C = ceil(capacity_factor * k * N / E)`` copies, first come first served in token
    order; ``capacity_factor=None`` keeps everything."""
    from ..sim.moe import capacity_keep as ref_keep, expert_capacity
    cases = [(N, E, k, cf) for (N, E, k), cf in zip(
        [(int(rng.integers(3, 9)) * 8, 8, 2), (60, 6, 1), (int(rng.integers(2, 6)) * 16, 16, 2),
         (40, 4, 3), (36, 8, 2), (24, 4, 2)],
        [1.0, 1.25, 1.5, 0.75, 1.25, None])]
    cases.append((10, 4, 1, 1.0))      # C = ceil(2.5) = 3, and expert 0 is wanted by all
    for N, E, k, cf in cases:
        experts = _skewed_choices(rng, N, E, k, skew=1.5)
        if (N, E, k, cf) == (10, 4, 1, 1.0):
            experts = np.zeros((N, 1), dtype=int)
            experts[rng.permutation(N)[:3], 0] = rng.integers(1, E, size=3)
        C = expert_capacity(N, E, k, cf)
        target = ref_keep(experts, E, C)
        out = _call(capacity_keep, experts.copy(), E, cf)
        where = f"N={N} tokens, E={E}, k={k}, capacity_factor={cf} (C = {C})"
        yours = _as_array("capacity", out, where, "keep")
        if yours.shape != target.shape:
            _fail("capacity", where, f"keep has shape {yours.shape}, expected {target.shape}",
                  show=False, hint="one True/False per (token, choice)")
        kept = [int(((experts == i) & (yours > 0.5)).sum()) for i in range(E)]
        want = [int(((experts == i) & target).sum()) for i in range(E)]
        if kept != want:
            i = int(np.argmax(np.array(kept) != np.array(want)))
            _fail("capacity", where, f"expert {i} keeps {kept[i]} copies",
                  kept[i], want[i],
                  hint="C = ceil(capacity_factor * k * N / E) (math.ceil), and an expert keeps a "
                       "copy while fewer than C copies have arrived before it")
        _compare("capacity", yours > 0.5, target, where=where, what="keep",
                 axes=("token", "choice"), exact=True,
                 hint="first come, first served in token order: token 0's choices, then token "
                      "1's, ...; an expert that is full drops every later copy")
    return f"{len(cases)} skewed routings (capacity factor 0.75 .. 1.5 and None) drop the right copies"


def _moe_case(rng, Ne, E, k, T, h, cf, e):
    """Route a random batch through the reference expert-parallel layer; return the
    choices, the kept copies, the byte ledger of its two all-to-alls and its stats."""
    from ..sim.comm import SimGroup
    from ..sim.moe import capacity_keep, expert_capacity, moe_layer, route_topk
    bias = 1.5 * rng.standard_normal(E)                  # a few popular experts
    x = [rng.standard_normal((T, h)) for _ in range(Ne)]
    W = rng.standard_normal((h, E))
    identity = [lambda z: z for _ in range(E)]           # the bytes do not depend on the experts
    group = SimGroup(Ne, e=e)
    _, stats = moe_layer(x, W, identity, k, capacity_factor=cf, group=group, bias=bias,
                         return_stats=True)
    chosen, _ = route_topk(np.concatenate(x) @ W, k, bias=bias)
    keep = capacity_keep(chosen, E, expert_capacity(Ne * T, E, k, cf))
    return chosen, keep, group.bytes_sent.copy(), stats


@_exercise("moe_stats", NB05, 2, "drops, all-to-all bytes and load per GPU")
def check_moe_stats(moe_stats, rng):
    """``moe_stats(experts, keep, Ne, E, h, e=2) -> dict`` with ``drop_rate`` (fraction of
    the ``N k`` copies dropped), ``bytes_per_gpu`` (array ``(Ne,)``: bytes each GPU sends in
    the dispatch and the combine; a kept copy whose expert is on another GPU costs ``h e``
    each way, a local or dropped copy nothing) and ``load_per_gpu`` (kept copies each GPU's
    experts compute). GPU ``g`` holds tokens ``g N/Ne .. (g+1) N/Ne - 1``; expert ``i`` is
    on GPU ``i // (E/Ne)``. Checked against the byte ledger of ``lesson10.sim.moe_layer``."""
    cases = [(4, 8, 2, 12, 4, 1.0, 2), (2, 4, 1, 10, 3, 1.25, 1), (4, 4, 2, 8, 5, None, 2),
             (3, 6, 2, 10, 4, 0.75, 4)]
    for Ne, E, k, T, h, cf, e in cases:
        chosen, keep, ledger, stats = _moe_case(rng, Ne, E, k, T, h, cf, e)
        out = _call(moe_stats, chosen.copy(), keep.copy(), Ne, E, h, e)
        where = (f"Ne={Ne} GPUs, E={E}, k={k}, {T} tokens per GPU, h={h}, e={e}, "
                 f"capacity_factor={cf}")
        if not isinstance(out, dict) or not {"drop_rate", "bytes_per_gpu", "load_per_gpu"} <= set(out):
            _fail("moe_stats", where, "return a dict with keys drop_rate, bytes_per_gpu, "
                  "load_per_gpu", show=False)
        _close_number("moe_stats", out["drop_rate"], stats["dropped"] / (Ne * T * k), where=where,
                      what="drop_rate", hint="dropped copies / (N k), with N tokens in total")
        _compare("moe_stats", out["load_per_gpu"], stats["load_per_gpu"], where=where,
                 what="load_per_gpu", axes=("GPU",),
                 hint="count the kept copies whose expert lives on each GPU (expert i is on GPU "
                      "i // (E/Ne)); dropped copies are not computed")
        _compare("moe_stats", out["bytes_per_gpu"], ledger, where=where, what="bytes_per_gpu",
                 axes=("GPU",),
                 hint="dispatch: GPU g sends h e bytes per kept copy of its tokens that goes to "
                      "another GPU; combine: it sends back h e bytes per copy it computed for "
                      "another GPU; local and dropped copies cost nothing")
    return f"{len(cases)} random routings: drops, loads and bytes match the simulated all-to-alls"


@_exercise("aux_loss", NB05, 1, "the Switch load-balancing loss")
def check_aux_loss(switch_aux_loss, rng):
    """``switch_aux_loss(probs, experts, alpha=1e-2) -> float``: ``alpha E sum_i f_i P_i`` with
    ``f_i`` the fraction of the ``T k`` copies routed to expert ``i`` and ``P_i`` the mean
    router probability of expert ``i``."""
    from ..sim.moe import route_topk, router_probs, switch_aux_loss as ref
    cases = []
    for k, skew in ((1, 0.0), (2, 1.0), (2, 3.0), (3, 2.0)):
        T, E = int(rng.integers(16, 64)), int(rng.integers(4, 9))
        logits = skew * rng.standard_normal(E)[None, :] + rng.standard_normal((T, E))
        experts, _ = route_topk(logits, k)
        cases.append((router_probs(logits), experts, float(rng.choice([1e-2, 1e-3, 0.1]))))
    for probs, experts, alpha in cases:
        out = _call(switch_aux_loss, probs.copy(), experts.copy(), alpha)
        _close_number("aux_loss", out, ref(probs, experts, alpha),
                      where=f"T={probs.shape[0]}, E={probs.shape[1]}, k={experts.shape[1]}, "
                            f"alpha={alpha}", what="loss",
                      hint="f_i = (copies sent to expert i) / (T k) so that sum_i f_i = 1; P_i = "
                           "probs[:, i].mean(); loss = alpha * E * sum_i f_i P_i (= alpha when "
                           "routing is uniform)")
    return f"{len(cases)} random routings (k = 1..3, skewed): matches alpha E sum f_i P_i"


