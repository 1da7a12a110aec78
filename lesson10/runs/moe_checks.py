"""The checked MoE run: :class:`~lesson10.spmd.moe.ExpertParallelMoE` on ``N_e`` ranks
against the single-process reference and the simulation (a worker of
:mod:`lesson10.runs.workers`, which re-exports it)."""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from .. import cost
from ..spmd.device import current_device, torch_dtype
from .results import Errors, elem_size, make_result, on_topology, timed_step

__all__ = ["check_moe", "uniform_router_tokens"]


def uniform_router_tokens(T: int, h: int, E: int, k: int, start: int = 0, dtype=torch.float64):
    """Tokens and a router that route *exactly* uniformly (for byte checks).

    ``router_w`` = the first ``E`` columns of the identity ``(h, E)``; token ``t`` is
    ``sum_j (k - j) e_{(start + t k + j) mod E}``, so its top-``k`` experts are
    ``start + t k .. start + t k + k - 1 (mod E)``, best first: with ``k T`` a multiple
    of ``E`` every expert gets ``k T / E`` copies from every rank.
    """
    if h < E:
        raise ValueError(f"uniform routing needs h >= E, got h = {h}, E = {E}")
    x = torch.zeros(T, h, dtype=dtype)
    for t in range(T):
        for j in range(k):
            x[t, (start + t * k + j) % E] = k - j
    return x, torch.eye(h, E, dtype=dtype)


@on_topology
def check_moe(T=16, h: int = 8, E: int = 4, k: int = 2, d_ff: int = 16, capacity_factor=None,
              routing: str = "random", seed: int = 0, dtype: str = "float64", alpha: float = 0.5,
              bias=None, rate=None, nodes=None, max_nodes=None, dispatch: str = "auto") -> dict:
    """:class:`ExpertParallelMoE` on ``N_e`` ranks vs :func:`lesson10.spmd.moe.moe_reference`.

    ``T``: tokens per rank (or a list, one per rank); ``routing``: ``"uniform"`` (every
    rank sends exactly ``kT/E`` copies to every expert, :func:`uniform_router_tokens`)
    or ``"random"``; ``bias``: the routing bias (list of ``E``); ``alpha``: aux-loss
    weight (large, so that its gradient shows). Step: loss ``sum(y dy) + aux_loss``.
    ``err``: ``y``, ``dx``, ``router_grad``, ``w1_grad``, ``w2_grad`` (this rank's
    experts), ``aux``, against the reference in the run's dtype (a float64 recomputation of
    the float32 router's logits could flip a near-tie of the top-k, and with it a whole row;
    the tolerance is relative to the size of each value instead); in float64 also ``sim`` / ``sim_aux`` against
    :mod:`lesson10.sim.moe`, and ``bias`` (the bias update, with ``rate``).
    Routing bookkeeping, counted independently with :mod:`lesson10.sim.moe`:
    ``capacity``, ``ref_dropped``, ``dropped_mine`` (dropped copies of this rank's
    tokens), ``remote_sent`` (this rank's kept copies whose expert lives elsewhere: they
    leave in the dispatch), ``remote_received`` (kept copies of other ranks' tokens for
    this rank's experts: their outputs leave in the combine), so exactly
    ``fwd = (remote_sent + remote_received) * row_bytes``. From the layer: ``dropped``,
    ``load`` (kept copies per local expert), ``counts``, ``w_grad_zero``.
    ``formula_fwd = cost.moe_a2a_bytes(k, T, h, N_e, e)`` (uniform routing, no drops).
    ``nodes`` / ``max_nodes``: node-limited routing (DeepSeek-V3; ``nodes`` defaults to the
    nodes the ranks span), ``dispatch``: the layer's (``"auto"``, ``"flat"``, ``"two_level"``);
    extras ``nodes_used`` (the most nodes any token's experts span), ``dispatch`` (the one
    that ran) and ``link_expected`` (this rank's forward bytes to its own node and to other
    nodes, counted from the routing: :func:`lesson10.sim.nodes.node_bytes` for the
    two-level dispatch, one row per copy for the flat one).
    """
    case = dict(locals())                                  # the arguments, as passed
    dt, dev = torch_dtype(dtype), current_device()
    n, r = dist.get_world_size(), dist.get_rank()
    Ts = list(T) if isinstance(T, (list, tuple)) else [T] * n
    if len(Ts) != n:
        raise ValueError(f"T lists {len(Ts)} token counts for {n} ranks")
    x, dy, router_w, w1, w2 = _moe_inputs(Ts, h, E, k, d_ff, seed, dt, routing)
    b_t = None if bias is None else torch.tensor(bias, dtype=router_w.dtype)
    lo, hi = sum(Ts[:r]), sum(Ts[:r + 1])
    try:
        layer = _moe_layer(h, E, d_ff, k, capacity_factor, router_w, w1, w2, alpha, nodes,
                           max_nodes, b_t, dev, dispatch)
    except ValueError as e:
        return {"method": "moe", "case": case, "error": str(e)}
    xl = x[lo:hi].clone().to(dev).requires_grad_()
    y, aux_total, fwd, bwd, seconds = _moe_step(layer, xl, dy[lo:hi].to(dev))
    route = dict(k=k, capacity_factor=capacity_factor, bias=b_t, nodes=layer.nodes,
                 max_nodes=max_nodes)
    errs = _moe_errors(layer, x, dy, router_w, w1, w2, y, xl, aux_total, alpha, (lo, hi), route)
    extra = _moe_bookkeeping(x, router_w, Ts, E, h, dtype, layer, aux_total, route)
    if dtype == "float64":
        _moe_sim_errors(errs, x, router_w, w1, w2, y, aux_total, alpha, (lo, hi), route)
    if rate is not None:
        extra["bias_changed"] = _moe_bias_update(errs, layer, rate)
    formula = cost.moe_a2a_bytes(k, Ts[r], h, n, e=elem_size(dtype)) if Ts[r] else 0.0
    return make_result("moe", case, n, errs, fwd, bwd, formula, seconds, **extra)


def _moe_step(layer, xl, dyl):
    """One timed step, loss ``sum(y dy) + aux_loss``: ``(y, aux loss over all ranks, fwd
    bytes, bwd bytes, seconds)``."""
    outs = []

    def forward():
        outs.append(layer(xl))
        return (outs[0] * dyl).sum() + layer.aux_loss      # a scalar: backward() needs no dout

    _, fwd, bwd, seconds = timed_step(forward, None)
    aux_total = layer.aux_loss.detach().clone()
    dist.all_reduce(aux_total)
    return outs[0].detach(), aux_total, fwd, bwd, seconds


def _moe_layer(h, E, d_ff, k, capacity_factor, router_w, w1, w2, alpha, nodes, max_nodes, bias,
               dev, dispatch="auto"):
    """The layer under test, with the run's weights and routing bias, on ``dev``."""
    from ..spmd.moe import ExpertParallelMoE
    layer = ExpertParallelMoE(h, E, d_ff, k, capacity_factor=capacity_factor, router_w=router_w,
                              w1=w1, w2=w2, alpha=alpha, nodes=nodes, max_nodes=max_nodes,
                              dispatch=dispatch).to(dev)
    if bias is not None:
        layer.bias.copy_(bias)
    return layer


def _moe_bias_update(errs, layer, rate) -> bool:
    """The layer's bias update against the simulation's; whether the bias changed."""
    from ..sim.moe import update_expert_bias as sim_update
    before = layer.bias.detach().cpu().clone()
    new = layer.update_bias(rate).detach().cpu().clone()
    errs.value("bias", new.numpy(), sim_update(before.numpy(), layer.load.cpu().numpy(), rate))
    return bool((new != before).any())


def _moe_inputs(Ts, h, E, k, d_ff, seed, dt, routing):
    """The whole run's tokens ``x``, output gradient ``dy`` and weights, drawn from ``seed``."""
    from ..spmd.moe import init_moe_weights
    n = len(Ts)
    router_w, w1, w2 = init_moe_weights(h, E, d_ff, seed, dt)
    g = torch.Generator().manual_seed(seed + 7)
    if routing == "uniform":
        x = torch.cat([uniform_router_tokens(Ts[i], h, E, k, i, dt)[0] for i in range(n)])
        router_w = uniform_router_tokens(1, h, E, k, 0, dt)[1]
    elif routing == "random":
        x = torch.randn(sum(Ts), h, generator=g, dtype=dt)
    else:
        raise ValueError(f"routing must be 'uniform' or 'random', got {routing!r}")
    dy = torch.randn(sum(Ts), h, generator=g, dtype=dt)
    return x, dy, router_w, w1, w2


def _moe_errors(layer, x, dy, router_w, w1, w2, y, xl, aux_total, alpha, rows, route) -> Errors:
    """This rank's output and gradients against autograd through the single-process layer."""
    from ..spmd.moe import moe_reference
    n, r = dist.get_world_size(), dist.get_rank()
    lo, hi = rows
    xr, rw, rw1, rw2 = (t.clone().requires_grad_() for t in (x, router_w, w1, w2))
    yr, auxr = moe_reference(xr, rw, rw1, rw2, route["k"], route["capacity_factor"],
                             route["bias"], nodes=route["nodes"], max_nodes=route["max_nodes"],
                             return_aux=True, alpha=alpha)
    ((yr * dy).sum() + auxr).backward()
    El = w1.shape[0] // n
    errs = Errors()
    errs.tensor("y", y, yr[lo:hi])
    errs.tensor("dx", xl.grad, xr.grad[lo:hi])
    errs.tensor("router_grad", layer.router_w.grad, rw.grad)
    errs.tensor("w1_grad", layer.w1.grad, rw1.grad[r * El:(r + 1) * El])
    errs.tensor("w2_grad", layer.w2.grad, rw2.grad[r * El:(r + 1) * El])
    errs.value("aux", float(aux_total), float(auxr.detach()))
    return errs


def _sim_routing(x, router_w, route):
    """The router's logits (float64 NumPy) and the simulation's top-k experts for them."""
    from ..sim.moe import route_topk as sim_route
    bias_np = None if route["bias"] is None else route["bias"].numpy()
    logits = (x.double() @ router_w.double()).numpy()
    experts, _ = sim_route(logits, route["k"], bias_np, nodes=route["nodes"],
                           max_nodes=route["max_nodes"])
    return logits, experts


def _moe_bookkeeping(x, router_w, Ts, E, h, dtype, layer, aux_total, route) -> dict:
    """Drops and remote copies counted independently with :mod:`lesson10.sim.moe`, next to
    what the layer reports."""
    from ..sim.moe import keep_within_capacity
    n, r = dist.get_world_size(), dist.get_rank()
    nodes, El = route["nodes"], E // n
    _, experts = _sim_routing(x, router_w, route)
    N, k = sum(Ts), route["k"]
    cap = cost.expert_capacity(N, E, k, route["capacity_factor"])
    kept = keep_within_capacity(experts, E, cap)
    home = experts // El                                          # (N, k) rank of each expert
    owner = np.repeat(np.arange(n), Ts)[:, None]                  # (N, 1) rank of each token
    return {"capacity": cap, "ref_dropped": int((~kept).sum()),
            "dropped_mine": int(((owner == r) & ~kept).sum()),
            "remote_sent": int(((owner == r) & (home != r) & kept).sum()),
            "remote_received": int(((owner != r) & (home == r) & kept).sum()),
            "row_bytes": h * elem_size(dtype), "copies": N * k, "T_mine": Ts[r],
            "dropped": int(layer.dropped), "load": layer.load.tolist(),
            "counts": layer.counts.tolist(), "aux_value": float(aux_total),
            "w_grad_zero": [bool((layer.w1.grad[e] == 0).all()) for e in range(El)],
            "nodes_used": int(max((len(set((row // (E // nodes)).tolist())) for row in experts),
                                  default=0)) if nodes else None,
            "dispatch": layer.dispatch,
            "link_expected": _moe_links(experts, kept, owner[:, 0], E, n, layer, h * elem_size(dtype))}


def _moe_links(experts, kept, owner, E, n, layer, row_bytes) -> dict:
    """This rank's forward bytes ``{"intra", "inter"}`` as the routing says they must be:
    :func:`lesson10.sim.nodes.node_bytes` for the two-level dispatch; for the flat one a row
    per kept copy to its expert's rank and one back to the token's rank."""
    from ..sim.nodes import node_bytes
    r, g = dist.get_rank(), layer.node_size
    if layer.dispatch == "two_level":
        inter, intra, _ = node_bytes(experts, kept, owner, E, n, n // g, row_bytes, e=1)
        return {"intra": int(intra[r]), "inter": int(inter[r])}
    home, owner = experts // (E // n), np.broadcast_to(owner[:, None], experts.shape)
    mine = kept & (owner == r) & (home != r)            # dispatch: rows this rank sends
    back = kept & (home == r) & (owner != r)            # combine: outputs it returns
    across = (home // g != r // g)[mine].sum() + (owner // g != r // g)[back].sum()
    return {"intra": int((mine.sum() + back.sum() - across) * row_bytes),
            "inter": int(across * row_bytes)}


def _moe_sim_errors(errs, x, router_w, w1, w2, y, aux_total, alpha, rows, route) -> None:
    """float64 only: the output and the aux loss against :mod:`lesson10.sim.moe`."""
    from ..sim.moe import moe_reference as sim_reference
    from ..sim.moe import switch_aux_loss as sim_aux
    lo, hi = rows
    logits, experts = _sim_routing(x, router_w, route)
    bias_np = None if route["bias"] is None else route["bias"].numpy()
    experts_np = [(w1[e].numpy(), w2[e].numpy()) for e in range(w1.shape[0])]
    ys = sim_reference(x.numpy(), router_w.numpy(), experts_np, route["k"],
                       route["capacity_factor"], bias_np, nodes=route["nodes"],
                       max_nodes=route["max_nodes"])
    errs.value("sim", y.cpu().numpy(), ys[lo:hi])
    p = np.exp(logits - logits.max(1, keepdims=True))
    errs.value("sim_aux", float(aux_total), sim_aux(p / p.sum(1, keepdims=True), experts, alpha))
