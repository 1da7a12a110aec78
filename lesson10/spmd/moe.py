"""Expert-parallel mixture of experts on real ``torch.distributed``.

``N_e`` ranks, ``E`` experts, ``E/N_e`` of them on each rank (expert ``i`` on rank
``i // (E/N_e)``). Each rank holds its own ``T`` tokens ``(T, h)``. One layer:

1. **route** (replicated router, float32 or wider): ``logits = x W_r`` ``(T, E)``; each
   token takes the ``k`` best of ``logits + bias`` (best first, ties to the lower id);
   gates = softmax over the ``k`` chosen *logits* (the bias only steers the choice);
2. **count exchange**: an all-gather of every rank's per-expert counts ``(N_e, E)``.
   From it every rank knows, for each expert, how many copies earlier ranks sent, so
   the capacity ``C = ceil(CF k N / E)`` is applied first come, first served in global
   token order (rank 0's tokens first) with no further communication, and every rank
   knows every split size of the next step;
3. **dispatch**: ``all_to_all_single`` with uneven splits; each kept (token, expert)
   copy goes to the rank of its expert, grouped by expert. Across nodes, the two-level
   dispatch of :mod:`lesson10.spmd.moe_dispatch` sends a token once per remote node and
   fans it out there (``dispatch="two_level"``, the default when the group spans nodes);
4. **experts**: each local expert ``relu(x W1) W2`` runs on its rows (possibly none),
   all of a rank's experts at once in one padded ``bmm`` (:func:`grouped_expert_mlp`);
5. **combine**: the inverse all-to-all brings the outputs home; ``y[t] = sum_j
   gate[t, j] * out[t, j]`` over the kept copies (dropped copies add nothing; the
   residual connection is the caller's).

These conventions are those of ``lesson10.sim.moe`` (same routing, capacity, drop
order, expert MLP), so the simulation and this implementation give the same numbers.
Bytes: the two token all-to-alls send ``2 k T h e (N_e-1)/N_e`` per rank for uniform
routing (``lesson10.cost.moe_a2a_bytes``); the counts are recorded as ``"metadata"``.
"""
from __future__ import annotations

import math
import numbers
from typing import Any

import torch
import torch.nn as nn

from .. import topology
from ..cost import expert_capacity
from ..rules import MoEConfig, count, number
from ..topology import check_nodes
from . import comm
from .moe_dispatch import Copies, DispatchPlan, all_to_all, flat_exchange, two_level_exchange
from .sp import copy_to_tp

__all__ = ["ExpertParallelMoE", "all_to_all", "route_topk", "expert_capacity",
           "init_moe_weights", "moe_reference", "arrival_order", "switch_aux_loss",
           "update_expert_bias", "grouped_expert_mlp"]


# ------------------------------------------------------------------ helpers
def route_topk(logits: torch.Tensor, k: int, bias: torch.Tensor | None = None, nodes=None,
               max_nodes=None):
    """``logits (T, E)`` -> ``(experts (T, k) long, gates (T, k))``.

    Experts: the ``k`` largest of ``logits + bias``, best first, ties to the lower id.
    Gates: softmax over the chosen logits (no bias). Differentiable in the gates.
    Node-limited (DeepSeek-V3; the rule of :mod:`lesson10.sim.nodes`): experts split evenly
    over ``nodes``; a token keeps the ``max_nodes`` nodes with the largest sum of their top
    ``ceil(k/max_nodes)`` scores (ties to the lower node), then its top ``k`` among them.
    """
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(f"logits must be a floating-point tensor (T, E), got "
                         f"{type(logits).__name__} {tuple(getattr(logits, 'shape', ()))} "
                         f"{getattr(logits, 'dtype', '')}")
    E = logits.shape[-1]
    k = MoEConfig(E, k).k
    if bias is not None and tuple(bias.shape) != (E,):
        raise ValueError(f"bias must have one entry per expert, shape ({E},), got {tuple(bias.shape)}")
    scores = logits.detach() if bias is None else logits.detach() + bias.to(logits.dtype)
    nodes, max_nodes = check_nodes(E, k, nodes, max_nodes)
    if max_nodes is not None and max_nodes < nodes and scores.shape[0]:
        T, per = scores.shape[0], E // nodes
        top = scores.reshape(T, nodes, per).topk(-(-k // max_nodes), dim=2).values.sum(2)
        best = torch.sort(-top, dim=1, stable=True).indices[:, :max_nodes]   # (T, max_nodes)
        allowed = torch.zeros(T, nodes, dtype=torch.bool, device=scores.device)
        allowed.scatter_(1, best, True)
        scores = scores.masked_fill(~allowed.repeat_interleave(per, dim=1), float("-inf"))
    experts = torch.sort(-scores, dim=-1, stable=True).indices[:, :k]   # (T, k)
    gates = torch.softmax(logits.gather(1, experts), dim=-1)           # (T, k)
    return experts, gates


def switch_aux_loss(probs: torch.Tensor, experts: torch.Tensor, alpha: float = 1e-2):
    """Switch load-balancing loss ``alpha E sum_i f_i P_i`` on one device (a tensor).

    ``probs (T, E)``: router softmax; ``experts (T, k)``; ``f_i`` = share of the ``k T``
    copies that chose expert ``i``; ``P_i`` = mean probability of expert ``i``. Uniform
    routing gives ``alpha``.
    """
    E = probs.shape[-1]
    f = torch.bincount(experts.reshape(-1), minlength=E).to(probs.dtype) / experts.numel()
    return alpha * E * (f * probs.mean(0)).sum()


def update_expert_bias(bias: torch.Tensor, load: torch.Tensor, rate: float) -> torch.Tensor:
    """DeepSeek-V3 balancing without a loss: ``bias - rate * sign(load - mean(load))``."""
    rate = number("rate", rate, strict=False)
    if bias.shape != load.shape or bias.dim() != 1:
        raise ValueError(f"bias and load must be 1-D of the same shape (E,), got "
                         f"{tuple(bias.shape)} and {tuple(load.shape)}")
    load = load.to(bias.dtype)
    return bias - rate * torch.sign(load - load.mean())


def init_moe_weights(h: int, E: int, d_ff: int, seed: int = 0, dtype=torch.float32):
    """Full weights ``(router_w (h, E), w1 (E, h, d_ff), w2 (E, d_ff, h))``, seeded.

    Every rank calling it with the same seed gets the same tensors (build a rank's
    shard, or a single-process reference, from them).
    """
    g = torch.Generator().manual_seed(seed)
    router_w = torch.randn(h, E, generator=g, dtype=torch.float64) / math.sqrt(h)
    w1 = torch.randn(E, h, d_ff, generator=g, dtype=torch.float64) / math.sqrt(h)
    w2 = torch.randn(E, d_ff, h, generator=g, dtype=torch.float64) / math.sqrt(d_ff)
    rdtype = torch.promote_types(dtype, torch.float32)
    return router_w.to(rdtype), w1.to(dtype), w2.to(dtype)


def moe_reference(x, router_w, w1, w2, k: int, capacity_factor=None, bias=None,
                  nodes=None, max_nodes=None, return_aux: bool = False, alpha: float = 1e-2):
    """Dense single-process MoE on all ``N`` tokens ``x (N, h)`` in global order.

    The arguments and result of :func:`lesson10.sim.moe_reference` (the experts as stacked
    ``w1 (E, h, d_ff)``, ``w2 (E, d_ff, h)``): returns ``y (N, h)``; with ``return_aux=True``
    ``(y, aux_loss)``, the Switch loss with ``alpha``. Differentiable in ``x`` and every
    weight. Drops: :func:`arrival_order` against the capacity, the rule of
    :func:`lesson10.sim.arrival_order`.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a tensor (N, h) of all tokens, got "
                         f"{type(x).__name__} {tuple(getattr(x, 'shape', ()))}")
    N, h = x.shape
    E = router_w.shape[1]
    if tuple(router_w.shape) != (h, E) or w1.shape[:2] != (E, h) or w2.dim() != 3 \
            or w2.shape[0] != E or w2.shape[2] != h or w2.shape[1] != w1.shape[2]:
        raise ValueError(f"expected router_w (h, E), w1 (E, h, d_ff), w2 (E, d_ff, h) with h = {h}: "
                         f"got {tuple(router_w.shape)}, {tuple(w1.shape)}, {tuple(w2.shape)}")
    if x.dtype != w1.dtype or w2.dtype != w1.dtype:
        raise ValueError(f"x ({x.dtype}) and the expert weights ({w1.dtype}, {w2.dtype}) need one "
                         f"dtype: cast x with x.to(w1.dtype)")
    logits = x.to(router_w.dtype) @ router_w                        # (N, E)
    experts, gates = route_topk(logits, k, bias, nodes=nodes, max_nodes=max_nodes)
    C = MoEConfig(E, k, capacity_factor).capacity(N)
    arrival = arrival_order(experts, E)
    keep = torch.ones_like(arrival, dtype=torch.bool) if C is None else arrival < C
    y = torch.zeros_like(x)
    for e in range(E):
        rows, slots = torch.nonzero((experts == e) & keep, as_tuple=True)
        out = torch.relu(x[rows] @ w1[e]) @ w2[e]
        y = y.index_add(0, rows, gates[rows, slots, None].to(x.dtype) * out)
    if not return_aux:
        return y
    return y, switch_aux_loss(torch.softmax(logits, -1), experts, alpha)


def arrival_order(experts: torch.Tensor, E: int) -> torch.Tensor:
    """Place of every copy in its expert's queue, ``experts (N, k)`` -> ``(N, k)`` long:
    copy ``(t, j)`` comes after the earlier copies of the same expert in row-major
    (token, choice) order. The torch form of :func:`lesson10.sim.arrival_order`."""
    flat = experts.reshape(-1)                                     # (N k,) row-major (t, j)
    perm = torch.sort(flat, stable=True).indices                   # queues, each in (t, j) order
    counts = torch.bincount(flat, minlength=E)
    start = counts.cumsum(0) - counts                              # first slot of each queue
    place = torch.empty_like(flat)
    place[perm] = torch.arange(flat.numel(), device=flat.device) - start[flat[perm]]
    return place.reshape(experts.shape)


def grouped_expert_mlp(x: torch.Tensor, eid: torch.Tensor, w1: torch.Tensor,
                       w2: torch.Tensor) -> torch.Tensor:
    """``relu(x[i] W1[eid[i]]) W2[eid[i]]`` for every row, as one grouped matmul.

    ``x (m, h)`` rows in any order, ``eid (m,)`` the local expert of each row, ``w1 (El, h,
    d_ff)``, ``w2 (El, d_ff, h)``. The rows are placed into a zero-padded block per expert
    ``(El, M, h)`` (``M`` = the largest expert's rows; an expert may have none) and each of the
    two matmuls is one ``torch.bmm`` over all experts, not a Python loop. Padding rows are
    zero, so they add nothing to any gradient. Returns ``(m, h)`` in the order of ``x``.
    """
    El = w1.shape[0]
    place = arrival_order(eid.reshape(-1, 1), El).reshape(-1)      # row's slot in its block
    M = int(place.max()) + 1 if place.numel() else 0
    blocks = x.new_zeros(El, M, x.shape[1]).index_put((eid, place), x)   # (El, M, h)
    out = torch.bmm(torch.relu(torch.bmm(blocks, w1)), w2)         # (El, M, h)
    return out[eid, place]


# -------------------------------------------------------------------- layer
class ExpertParallelMoE(nn.Module):
    """An MoE layer whose ``E`` experts are spread over the ``N_e`` ranks of ``group``.

    Build it from the full weights (``router_w (h, E)``, ``w1 (E, h, d_ff)``,
    ``w2 (E, d_ff, h)``; the same on every rank: pass them, or a ``seed`` for
    :func:`init_moe_weights`). The rank keeps experts ``r E/N_e .. (r+1) E/N_e - 1``.
    ``capacity_factor=None`` is dropless. ``forward(x)``: ``x (..., h)`` this rank's
    tokens (any count) -> ``y`` of the same shape, without the residual.

    After a forward: ``aux_loss`` is this rank's share of the Switch loss (the shares
    of all ranks add up to the loss over all tokens, so adding it to this rank's loss
    gives the right gradients); ``counts`` / ``load``: copies per expert over all ranks
    before / after drops; ``dropped``: copies dropped over all ranks. The router weight
    is replicated, so its gradient is all-reduced over ``group`` in the backward
    (``reduce_router_grad=False`` if a data-parallel wrapper already does that).
    ``bias`` is DeepSeek-V3's routing bias (a buffer); :meth:`update_bias` moves it.
    ``nodes`` / ``max_nodes``: node-limited routing (see :func:`route_topk`); ``nodes``
    defaults to the number of nodes the group spans (:func:`lesson10.topology.current`).
    ``dispatch``: ``"flat"`` (one all-to-all, a copy per (token, expert)), ``"two_level"``
    (a copy per (token, remote node), then a fan-out inside the node: needs the group to fill
    its nodes evenly, in order) or ``"auto"`` (two-level when the group spans nodes).
    """

    # the attributes, typed for mypy (nn.Module's __getattr__ would hide them)
    bias: torch.Tensor                    # a buffer (register_buffer)
    router_w: nn.Parameter
    w1: nn.Parameter
    w2: nn.Parameter
    group: Any
    capacity_factor: float | None
    config: MoEConfig
    nodes: int | None
    max_nodes: int | None

    def __init__(self, h: int, E: int, d_ff: int, k: int, capacity_factor=None, group=None,
                 router_w=None, w1=None, w2=None, seed: int = 0, dtype=torch.float32,
                 alpha: float = 1e-2, reduce_router_grad: bool = True, nodes=None,
                 max_nodes=None, dispatch: str = "auto"):
        super().__init__()
        h, d_ff = count("h", h), count("d_ff", d_ff)
        n, r = comm.group_size(group), comm.group_rank(group)
        config = MoEConfig(E, k, capacity_factor, N_e=n)     # k <= E, CF, E a multiple of N_e
        E, k = config.E, config.k
        self.node_size: int
        self.dispatch: str
        self.node_size, self.dispatch = _dispatch_levels(group, dispatch)
        if nodes is None and (n // self.node_size > 1 or max_nodes is not None) \
                and E % (n // self.node_size) == 0:
            nodes = n // self.node_size                    # the experts' nodes: the group's
        check_nodes(E, k, nodes, max_nodes)                # validates node-limited routing
        if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not math.isfinite(alpha):
            raise ValueError(f"alpha must be a finite number, got {alpha!r}")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating torch.dtype such as torch.float32, got {dtype!r}")
        if router_w is None or w1 is None or w2 is None:
            router_w, w1, w2 = init_moe_weights(h, E, d_ff, seed, dtype)
        for name, t in (("router_w", router_w), ("w1", w1), ("w2", w2)):
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                raise ValueError(f"{name} must be a floating-point torch.Tensor, got "
                                 f"{type(t).__name__} {getattr(t, 'dtype', '')}")
        if tuple(router_w.shape) != (h, E) or tuple(w1.shape) != (E, h, d_ff) \
                or tuple(w2.shape) != (E, d_ff, h):
            raise ValueError(f"expected router_w ({h}, {E}), w1 ({E}, {h}, {d_ff}), "
                             f"w2 ({E}, {d_ff}, {h}); got {tuple(router_w.shape)}, "
                             f"{tuple(w1.shape)}, {tuple(w2.shape)}")
        El = config.experts_per_rank
        local = slice(r * El, (r + 1) * El)
        rdtype = torch.promote_types(w1.dtype, torch.float32)
        self.router_w = nn.Parameter(router_w.detach().to(rdtype).clone())
        self.w1 = nn.Parameter(w1.detach()[local].clone())     # (E/N_e, h, d_ff)
        self.w2 = nn.Parameter(w2.detach()[local].clone())     # (E/N_e, d_ff, h)
        self.register_buffer("bias", torch.zeros(E, dtype=rdtype, device=router_w.device))
        self.h: int = h
        self.E: int = E
        self.d_ff: int = d_ff
        self.k: int = k
        self.capacity_factor = config.capacity_factor
        self.config = config
        self.group = group
        self.alpha: float = alpha
        self.reduce_router_grad: bool = reduce_router_grad
        self.nodes = nodes
        self.max_nodes = max_nodes
        self.aux_loss: torch.Tensor | None = None
        self.counts: torch.Tensor | None = None
        self.load: torch.Tensor | None = None
        self.dropped: int = 0

    def update_bias(self, rate: float) -> torch.Tensor:
        """DeepSeek-V3 step: lower the bias of overloaded experts, raise the others.

        Uses the global ``load`` of the last forward (the same on every rank, so the
        replicated bias stays identical). Returns the new bias.
        """
        if self.load is None:
            raise ValueError("update_bias needs a forward pass first (it uses its load)")
        with torch.no_grad():
            self.bias.copy_(update_expert_bias(self.bias, self.load, rate))
        return self.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = self._check_input(x)
        x = x.reshape(-1, self.h)                                # (T, h)
        k = self.k
        # 1. route (router in float32 or wider)
        w_r = self.router_w
        if self.reduce_router_grad:
            w_r = copy_to_tp(w_r, self.group, op="param_grad")  # replicated: sum its grads
        logits = x.to(w_r.dtype) @ w_r                           # (T, E)
        experts, gates = route_topk(logits, k, self.bias, self.nodes, self.max_nodes)
        # 2. count exchange and capacity: which copies go where
        send, all_counts, kept, N = self._dispatch_plan(experts)
        plan = self._plan(experts, send, kept)
        # 3.-5. dispatch, experts, combine and weighted sum
        exchange = two_level_exchange if self.dispatch == "two_level" else flat_exchange
        y = exchange(x, gates, plan, self._local_experts)
        self._balance_stats(logits, all_counts, kept, N)
        return y.reshape(shape)

    def _check_input(self, x) -> torch.Size:
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            raise ValueError(f"x must be a tensor (..., h) of this rank's tokens, got "
                             f"{type(x).__name__} {tuple(getattr(x, 'shape', ()))}")
        if x.dtype != self.w1.dtype:
            hint = f" (or build the layer with dtype={x.dtype})" if x.is_floating_point() else ""
            raise ValueError(f"x has dtype {x.dtype} but the experts are {self.w1.dtype}: pass "
                             f"x.to({self.w1.dtype}){hint}")
        if x.shape[-1] != self.h:
            raise ValueError(f"expected tokens of size h = {self.h}, got shape {tuple(x.shape)}")
        return x.shape

    def _dispatch_plan(self, experts):
        """One exchange of per-expert counts, then capacity, first come first served over
        the ranks: ``(send, all_counts, kept, N)`` with ``send`` this rank's kept copies
        (flat ``t k + j``) grouped by expert."""
        r = comm.group_rank(self.group)
        E, k = self.E, self.k
        flat = experts.reshape(-1)                               # (T k,) row-major (t, j)
        counts = torch.bincount(flat, minlength=E)               # (E,)
        all_counts = comm.all_gather(counts[None], dim=0, group=self.group,
                                     op="metadata")              # (N_e, E)
        N = int(all_counts.sum()) // k                           # tokens over all ranks
        C = self.config.capacity(N)
        before = all_counts.cumsum(0) - all_counts               # copies of earlier ranks
        kept = all_counts if C is None else (C - before).clamp(min=0).minimum(all_counts)
        # a copy is kept when it is among the first kept[r][e] of this rank's copies of e
        keep = arrival_order(experts, E).reshape(-1) < kept[r][flat]       # (T k,)
        perm = torch.sort(flat, stable=True).indices             # grouped by expert, (t, j) order
        send = perm[keep[perm]]                                  # kept copies, grouped by expert
        return send, all_counts, kept, N

    def _plan(self, experts, send, kept) -> DispatchPlan:
        """The :class:`DispatchPlan` of the kept copies ``send`` (flat ``t k + j``); the flat
        dispatch knows its receive counts from the count exchange (``kept``)."""
        n, r = comm.group_size(self.group), comm.group_rank(self.group)
        El = self.E // n
        tok, slot = send // self.k, send % self.k                # (m,) kept copies
        e = experts[tok, slot]
        recv = None if self.dispatch == "two_level" else kept[:, r * El:(r + 1) * El]
        return DispatchPlan(Copies(tok, slot, e // El, e % El), n, El, self.node_size,
                            self.group, recv)

    def _local_experts(self, xr, recv_counts):
        """This rank's experts on the rows received, ``(source rank, expert)`` blocks; the
        outputs in arrival order (one grouped matmul, :func:`grouped_expert_mlp`)."""
        n, El = recv_counts.shape
        eid = torch.arange(El, device=xr.device).repeat(n).repeat_interleave(recv_counts.reshape(-1))
        return grouped_expert_mlp(xr, eid, self.w1, self.w2)

    def _balance_stats(self, logits, all_counts, kept, N) -> None:
        """Balancing statistics (global) and this rank's share of the Switch loss."""
        E, k = self.E, self.k
        total = all_counts.sum(0)
        self.counts, self.load = total, kept.sum(0)
        self.dropped = int(total.sum() - self.load.sum())
        Nz = max(N, 1)                                           # no token anywhere: loss 0
        f = total.to(logits.dtype) / (k * Nz)                    # share of copies per expert
        self.aux_loss = self.alpha * E * (f * torch.softmax(logits, -1).sum(0)).sum() / Nz


def _dispatch_levels(group, dispatch: str):
    """``(node_size, "flat" | "two_level")``: the group's ranks per node and the dispatch
    ``dispatch`` (``"auto"``, ``"flat"``, ``"two_level"``) becomes on this topology."""
    if dispatch not in ("auto", "flat", "two_level"):
        raise ValueError(f"dispatch must be 'auto', 'flat' or 'two_level', got {dispatch!r}")
    import torch.distributed as dist
    n = comm.group_size(group)
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(n))
    topo = topology.current()
    nodes = topo.nodes_of(ranks)
    if not topo.aligned(ranks):
        if dispatch == "two_level":
            raise ValueError(f"dispatch='two_level' needs a group that fills its nodes evenly, "
                             f"node by node; the ranks {ranks} do not (nodes of "
                             f"{topo.node_size}): use dispatch='flat'")
        return n, "flat"
    if dispatch == "auto":
        dispatch = "two_level" if nodes > 1 else "flat"
    return n // nodes, dispatch
