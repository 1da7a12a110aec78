"""Mixture of experts with expert parallelism (EP), simulated.

Conventions used throughout this module:

* **Routing** (:func:`route_topk`): each token picks the ``k`` experts with the largest
  router scores (``logits``, plus an optional per-expert ``bias`` that affects the
  choice only); ties go to the lower expert id. The chosen experts are listed in
  order of preference (best first). The gates are a softmax over the ``k`` chosen
  *logits* (Mixtral style; they sum to 1, the bias never enters them).
* **Capacity** (:func:`expert_capacity`): with a capacity factor ``CF`` every expert
  accepts at most ``C = ceil(CF * k * N / E)`` copies, ``N`` = tokens routed together
  (all ranks). ``CF=None`` means no limit.
* **Drops** (:func:`keep_within_capacity`, by :func:`arrival_order`, see
  :mod:`lesson10.sim.capacity`): first come, first served in global token order: rank 0's
  tokens first, each rank's tokens in order, and for one token its choices in order of
  preference (which never matters: a token's ``k`` experts are distinct).
  A dropped copy contributes nothing: the layer output of that token lacks that
  expert's term and the token passes on through the residual connection. The gates
  of the kept copies are *not* renormalised (Switch Transformer).
* **Experts**: a list of ``E`` entries, each either a ``(W1, W2)`` pair with ``W1 (h,
  d_ff)`` and ``W2 (d_ff, h)``, giving the two-matrix MLP ``relu(x W1) W2``, or any
  callable mapping ``(m, h) -> (m, h)``. Expert ``i`` lives on rank ``i // (E/N_e)``.
* **Bytes**: every copy of a token vector that goes to another rank costs ``h e``
  bytes in the dispatch (sent by the token's rank) and ``h e`` in the combine (sent
  back by the expert's rank). Dropped copies are not sent. The routing metadata
  (expert ids, a few integers per copy) is not counted.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import cost
from ..cost import expert_capacity  # the one exact formula; re-exported here
from ..rules import MoEConfig, count, number
from ..topology import check_nodes
from .capacity import arrival_order, keep_within_capacity  # re-exported
from .comm import Stats, check_shards
from .nodes import node_bytes, node_limited_scores
from .sampling import sample_topk
from .validate import check_group

__all__ = [
    "route_topk", "router_probs", "expert_capacity", "arrival_order", "keep_within_capacity",
    "apply_expert", "init_experts", "moe_reference", "moe_layer", "simulate_moe", "skewed_routing",
    "MoEStats", "MoELayerStats",
    "switch_aux_loss", "update_expert_bias",
]


# --------------------------------------------------------------------------- routing
def _real(x, name: str, finite: bool = True) -> np.ndarray:
    """``x`` as float64; complex or non-numeric values (and NaN/inf when ``finite``) are a
    ValueError instead of a silent cast or a NaN later on."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} must hold real numbers, got dtype {arr.dtype}; pass a float array")
    arr = arr.astype(float, copy=False)
    if finite and not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or inf; the router needs finite numbers (check the "
                         f"step that produced them)")
    return arr


def router_probs(logits) -> np.ndarray:
    """Softmax of the router logits over all ``E`` experts: ``(T, E) -> (T, E)``."""
    logits = _real(logits, "logits")
    z = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def route_topk(logits, k: int, bias=None, nodes=None, max_nodes=None):
    """Top-``k`` routing. ``logits (T, E)`` -> ``(experts (T, k) int, gates (T, k))``.

    ``experts[t]`` are the ``k`` largest entries of ``logits[t] + bias`` (best first, ties to
    the lower id); ``gates[t] = softmax(logits[t, experts[t]])`` (no bias in the gates).
    Node-limited (DeepSeek-V3, see :mod:`lesson10.sim.nodes`): with the experts split evenly
    over ``nodes`` nodes, a token first keeps the ``max_nodes`` nodes with the largest sum of
    their top ``ceil(k/max_nodes)`` scores, then takes its top ``k`` among their experts.
    """
    logits = _real(logits, "logits")
    if logits.ndim != 2:
        raise ValueError(f"logits must be (tokens, experts), got shape {logits.shape}")
    T, E = logits.shape
    k = MoEConfig(E, k).k
    scores = logits
    if bias is not None:
        bias = _real(bias, "bias")
        if bias.shape != (E,):
            raise ValueError(f"bias must have one entry per expert, shape ({E},), got {bias.shape}")
        scores = logits + bias
    nodes, max_nodes = check_nodes(E, k, nodes, max_nodes)
    if max_nodes is not None and T:
        scores = node_limited_scores(scores, k, nodes, max_nodes)
    experts = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    chosen = np.take_along_axis(logits, experts, axis=1)
    z = np.exp(chosen - chosen.max(axis=1, keepdims=True)) if T else chosen
    gates = z / z.sum(axis=1, keepdims=True) if T else chosen
    return experts, gates




# --------------------------------------------------------------------------- experts
def apply_expert(expert, x) -> np.ndarray:
    """Run one expert on ``x (m, h)``: ``relu(x W1) W2`` for a ``(W1, W2)`` pair, or
    ``expert(x)`` for a callable. An empty batch gives an empty ``(0, h)`` result."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"apply_expert: x must be (m, h), got shape {x.shape}")
    if x.shape[0] == 0:
        return np.zeros_like(x, dtype=float)
    if callable(expert):
        y = np.asarray(expert(x))
    else:
        try:
            W1, W2 = (np.asarray(w) for w in expert)
        except (TypeError, ValueError):
            raise ValueError("an expert must be a (W1, W2) pair of weights or a callable") from None
        h = x.shape[1]
        if W1.ndim != 2 or W2.ndim != 2 or W1.shape[0] != h or W2.shape != (W1.shape[1], h):
            raise ValueError(f"an expert's weights must be W1 (h, d_ff) and W2 (d_ff, h) with "
                             f"h = {h}; got {W1.shape} and {W2.shape}")
        y = np.maximum(x @ W1, 0.0) @ W2
    if y.shape != x.shape:
        raise ValueError(f"an expert must map (m, h) -> (m, h); got {x.shape} -> {y.shape}")
    if y.dtype.kind not in "biuf" or not np.isfinite(y).all():
        raise ValueError("an expert returned complex, non-numeric, NaN or inf values; it must "
                         "return finite real numbers")
    return y


def init_experts(E: int, h: int, d_ff: int, seed: int = 0) -> list:
    """``E`` random two-matrix experts ``(W1 (h, d_ff), W2 (d_ff, h))``, variance-scaled."""
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((h, d_ff)) / np.sqrt(h),
             rng.standard_normal((d_ff, h)) / np.sqrt(d_ff)) for _ in range(E)]


def _check_router(router_w, h: int, experts) -> int:
    router_w = _real(router_w, "router_w")
    if not isinstance(experts, (list, tuple)):
        raise ValueError(f"experts must be a list of E experts ((W1, W2) pairs or functions), "
                         f"got {type(experts).__name__}")
    if router_w.ndim != 2 or router_w.shape[0] != h:
        raise ValueError(f"router_w must be (h, E) = ({h}, E), got shape {router_w.shape}")
    E = router_w.shape[1]
    if len(experts) != E:
        raise ValueError(f"router_w scores E = {E} experts but {len(experts)} experts were given")
    return E


# --------------------------------------------------------------------------- reference
def moe_reference(x, router_w, experts, k: int, capacity_factor=None, bias=None,
                  nodes=None, max_nodes=None, return_aux: bool = False, alpha: float = 1e-2):
    """The MoE layer on one device. ``x (N, h)`` holds all tokens in global order
    (rank 0's first). ``y[t] = sum_j gates[t, j] * expert_{experts[t, j]}(x[t])`` over the
    kept copies. Returns ``y (N, h)`` (the residual is not added); with ``return_aux=True``
    ``(y, aux)``, aux = :func:`switch_aux_loss` with ``alpha`` (as
    :func:`lesson10.spmd.moe_reference`). ``nodes``/``max_nodes``: node-limited routing, see
    :func:`route_topk`."""
    x = _real(x, "x")
    if x.ndim != 2:
        raise ValueError(f"x must be (tokens, h), got shape {x.shape}")
    E = _check_router(router_w, x.shape[1], experts)
    chosen, gates = route_topk(x @ router_w, k, bias, nodes=nodes, max_nodes=max_nodes)
    keep = keep_within_capacity(chosen, E, MoEConfig(E, k, capacity_factor).capacity(x.shape[0]))
    y = np.zeros_like(x)
    for i in range(E):
        rows, slots = np.nonzero((chosen == i) & keep)
        y[rows] += gates[rows, slots, None] * apply_expert(experts[i], x[rows])
    if not return_aux:
        return y
    return y, switch_aux_loss(router_probs(x @ router_w), chosen, alpha)


# --------------------------------------------------------------------------- expert parallel
def moe_layer(x_shards, router_w, experts, k: int, capacity_factor=None, group=None,
              bias=None, return_stats: bool = False, nodes=None, max_nodes=None):
    """Expert-parallel MoE over ``N_e = len(x_shards)`` simulated ranks.

    ``x_shards[r]``: the ``T`` tokens ``(T, h)`` of rank ``r``. ``router_w (h, E)``, ``E``
    experts (see the module docstring), ``E % N_e == 0``; rank ``r`` holds experts
    ``r E/N_e .. (r+1) E/N_e - 1``. Steps: route locally, dispatch (all-to-all), run the
    local experts, combine (all-to-all), weighted sum. Returns ``y_shards`` (``(T, h)``
    each), equal to :func:`moe_reference` on the concatenated tokens; with
    ``return_stats=True`` also a :class:`MoELayerStats` (capacity, drops, loads). ``nodes`` /
    ``max_nodes``: node-limited routing (see :func:`route_topk`).
    """
    xs = [_real(x, f"moe_layer: x_shards[{r}]") for r, x in enumerate(check_shards(x_shards, "moe_layer"))]
    n = len(xs)
    if xs[0].ndim != 2:
        raise ValueError(f"moe_layer: each shard must be (tokens, h), got {xs[0].shape}")
    T, h = xs[0].shape
    config = MoEConfig(_check_router(router_w, h, experts), k, capacity_factor, N_e=n)
    E, k, per_rank = config.E, config.k, config.experts_per_rank
    group = check_group(group, n, "moe_layer")

    # 1. route: every rank on its own tokens
    routes = [route_topk(x @ router_w, k, bias, nodes=nodes, max_nodes=max_nodes) for x in xs]
    # capacity, first come first served in global token order (rank 0 first)
    capacity = config.capacity(n * T)
    keep = np.split(keep_within_capacity(np.concatenate([c for c, _ in routes]), E, capacity), n)

    # 2. dispatch: rank i sends x[t] for each kept copy (t, j) whose expert lives on rank d
    idx: list[list[Any]] = [[None] * n for _ in range(n)]   # idx[i][d]: (tokens, slots) i -> d
    for i, (chosen, _) in enumerate(routes):
        dest = chosen // per_rank
        for d in range(n):
            idx[i][d] = np.nonzero((dest == d) & keep[i])
    received = group.all_to_all([[xs[i][idx[i][d][0]] for d in range(n)] for i in range(n)])

    # 3. expert compute on rank d, on the copies it received (in source-rank order)
    back = [_run_local_experts(d, routes, idx, received[d], experts, per_rank, h)
            for d in range(n)]                       # back[d][i]: outputs for rank i's copies

    # 4. combine: the outputs go home and are summed with the gates
    returned = group.all_to_all(back)                # returned[i][d]
    ys = []
    for i, (_, gates) in enumerate(routes):
        y = np.zeros_like(xs[i])
        for d in range(n):
            tok, slot = idx[i][d]
            np.add.at(y, tok, gates[tok, slot, None] * returned[i][d])
        ys.append(y)
    if not return_stats:
        return ys
    kept_experts = np.concatenate([c[m] for (c, _), m in zip(routes, keep)])
    load_e = np.bincount(kept_experts, minlength=E)
    return ys, MoELayerStats(capacity=capacity, dropped=int(sum((~m).sum() for m in keep)),
                             load_per_expert=load_e, load_per_gpu=load_e.reshape(n, per_rank).sum(1))


@dataclass
class MoELayerStats(Stats):
    """What one :func:`moe_layer` call did: ``capacity`` (``C`` or None), ``dropped`` copies,
    kept copies per expert ``load_per_expert (E,)`` and per rank ``load_per_gpu (N_e,)``."""
    capacity: int | None
    dropped: int
    load_per_expert: np.ndarray
    load_per_gpu: np.ndarray


def _run_local_experts(d, routes, idx, received, experts, per_rank: int, h: int) -> list:
    """Rank ``d``'s experts on the copies it received (``received[i]`` from rank ``i``, in
    source-rank order); returns their outputs split back per source rank."""
    n = len(routes)
    ids = np.concatenate([routes[i][0][idx[i][d]] for i in range(n)])
    batch = np.concatenate(received).reshape(-1, h)
    out = np.empty_like(batch)
    for ex in range(d * per_rank, (d + 1) * per_rank):
        rows = ids == ex
        out[rows] = apply_expert(experts[ex], batch[rows])
    return np.split(out, np.cumsum([len(b) for b in received])[:-1])


# --------------------------------------------------------------------------- simulator
@dataclass
class MoEStats(Stats):
    """Result of :func:`simulate_moe`. Loads count (token, expert) copies after drops.

    ``load_per_gpu`` / ``bytes_per_gpu`` are arrays of shape ``(Ne,)``; ``max_load`` and
    ``mean_load`` are over GPUs, ``imbalance = max_load / mean_load``.
    ``traffic[i, j]``: kept copies dispatched from GPU ``i`` to GPU ``j`` (diagonal: local).
    ``bytes_formula``: the lesson's uniform-routing value ``2 k (T/Ne) h e (Ne-1)/Ne``.
    With ``nodes``: ``internode_bytes_per_gpu`` / ``intranode_bytes_per_gpu`` ``(Ne,)``, the
    two-level all-to-all of :func:`lesson10.sim.nodes.node_bytes` (one inter-node copy per
    (token, remote node)), and ``remote_nodes_per_token``, the mean number of remote nodes
    a token is sent to.
    """
    T: int
    E: int
    k: int
    Ne: int
    capacity_factor: float | None
    capacity: int | None
    skew: float
    h: int
    e: float
    drop_rate: float
    dropped: int
    load_per_expert: np.ndarray
    load_per_gpu: np.ndarray
    max_load: int
    mean_load: float
    imbalance: float
    bytes_per_gpu: np.ndarray
    bytes_mean: float
    bytes_max: float
    bytes_formula: float
    traffic: np.ndarray
    popularity: np.ndarray = field(repr=False)
    nodes: int | None = None
    max_nodes: int | None = None
    internode_bytes_per_gpu: np.ndarray | None = None
    intranode_bytes_per_gpu: np.ndarray | None = None
    remote_nodes_per_token: float | None = None


def _check_sim_args(T, E, k, Ne, capacity_factor, h, skew, seed) -> MoEConfig:
    """ValueError for a bad :func:`simulate_moe` size, skew or seed; returns the checked
    :class:`~lesson10.rules.MoEConfig` (``T`` tokens over all ``Ne`` GPUs split evenly)."""
    count("T (tokens, all GPUs)", T)
    count("h", h)
    config = MoEConfig(E, k, capacity_factor, N_e=Ne)
    config.tokens_per_rank(T)
    number("skew", skew, strict=False)
    count("seed", seed, lo=0)
    return config


def skewed_routing(T: int, E: int, k: int, skew: float = 0.0, seed: int = 0, bias=None,
                   popularity=None, nodes=None, max_nodes=None):
    """The skew model, written once: ``(popularity (E,), experts (T, k))`` for ``T`` tokens.

    Expert ``i`` has a fixed popularity ``u_i`` (standard normal, drawn from ``seed``, or
    the ``popularity`` given); token ``t`` picks the top ``k`` of
    ``skew * u_i + bias_i + G_ti`` with independent standard Gumbel noise ``G`` (drawn as
    Plackett-Luce by :func:`lesson10.sim.sampling.sample_topk`; node-limited through
    :func:`route_topk` on explicit scores). :func:`simulate_moe` and the MoE figure
    (:func:`lesson10.figures.data.moe_routing`) draw from it, so one seed is one sample."""
    k = MoEConfig(E, k).k
    nodes, max_nodes = check_nodes(E, k, nodes, max_nodes)
    pop_seq, route_seq = np.random.SeedSequence(seed).spawn(2)
    if popularity is None:
        popularity = np.random.default_rng(pop_seq).standard_normal(E)
    popularity = np.asarray(popularity, dtype=float)
    with np.errstate(over="ignore"):                   # an overflow to inf is reported below
        logw = skew * popularity
    if bias is not None:
        logw = logw + np.asarray(bias, dtype=float)
    if logw.shape != (E,):
        raise ValueError(f"popularity and bias must be arrays of shape ({E},)")
    if not np.all(np.isfinite(logw)):
        raise ValueError(f"skew * popularity + bias must be finite for every expert (NaN or inf in "
                         f"popularity/bias, or skew = {skew!r} too large); lower skew or fix them")
    if max_nodes is not None and max_nodes < nodes:       # explicit scores, then route_topk
        rng = np.random.default_rng(route_seq)
        return popularity, np.concatenate([
            route_topk(logw + rng.gumbel(size=(m, E)), k, nodes=nodes, max_nodes=max_nodes)[0]
            for m in np.diff(np.r_[0:T:4096, T])])
    return popularity, sample_topk(logw, T, k, np.random.default_rng(route_seq))


def _kept_per_source(choices, keep, E: int, Ne: int) -> np.ndarray:
    """Kept copies per (source GPU, expert), ``(Ne, E)``: one bincount per GPU's tokens."""
    per_gpu_t = choices.shape[0] // Ne
    src_exp = np.empty((Ne, E), dtype=np.int64)
    for g in range(Ne):
        blk = choices[g * per_gpu_t:(g + 1) * per_gpu_t]
        if keep is not None:
            blk = blk[keep[g * per_gpu_t:(g + 1) * per_gpu_t]]
        src_exp[g] = np.bincount(blk.ravel(), minlength=E)
    return src_exp


def simulate_moe(T: int, E: int, k: int, Ne: int, capacity_factor=None, skew: float = 0.0,
                 seed: int = 0, h: int = 4096, e: float = 2, bias=None, popularity=None,
                 nodes=None, max_nodes=None) -> MoEStats:
    """Route ``T`` tokens (in total, ``T/Ne`` per GPU) to ``E`` experts on ``Ne`` GPUs, top-``k``.

    Skew model (:func:`skewed_routing`): every expert ``i`` has a fixed popularity ``u_i``
    (standard normal, drawn from ``seed``; or pass ``popularity``), and token ``t`` has router
    scores ``skew * u_i + bias_i + G_ti`` with independent standard Gumbel noise ``G``; it picks
    its top ``k``. ``skew = 0`` is uniform routing (every set of ``k`` experts equally likely);
    as ``skew`` grows, the popular experts take most copies. Expert ``i`` sits on GPU
    ``i // (E/Ne)``; GPU ``g`` holds tokens ``g T/Ne .. (g+1) T/Ne - 1``; drops are first
    come, first served in that global order (see the module docstring). Vectorised: no
    Python loop over tokens. ``h`` and ``e`` only scale the bytes.

    ``nodes``: the ``Ne`` GPUs form ``nodes`` nodes of ``Ne/nodes`` consecutive GPUs; the
    stats then add the inter- and intra-node bytes. ``max_nodes``: node-limited routing
    (:func:`route_topk` on the scores above, built explicitly in chunks of tokens).
    """
    config = _check_sim_args(T, E, k, Ne, capacity_factor, h, skew, seed)
    k, capacity = config.k, config.capacity(T)
    nodes, max_nodes = check_nodes(E, k, nodes, max_nodes)
    if nodes is not None and Ne % nodes:
        raise ValueError(f"Ne = {Ne} GPUs do not split evenly over nodes = {nodes}; use a number "
                         f"of nodes that divides Ne")
    popularity, choices = skewed_routing(T, E, k, skew, seed, bias, popularity, nodes, max_nodes)
    keep = keep_within_capacity(choices, E, capacity) if capacity is not None else None
    per_gpu_e, per_gpu_t = config.experts_per_rank, config.tokens_per_rank(T)
    src_exp = _kept_per_source(choices, keep, E, Ne)
    traffic = src_exp.reshape(Ne, Ne, per_gpu_e).sum(axis=2)   # [source GPU, expert GPU]
    local = np.diag(traffic)
    bytes_per_gpu = ((traffic.sum(1) - local) + (traffic.sum(0) - local)) * float(h * e)
    load_e = src_exp.sum(axis=0)
    load_g = load_e.reshape(Ne, per_gpu_e).sum(1)
    dropped = int(T * k - load_e.sum())
    mean = float(load_g.mean())
    node_stats = {}
    if nodes is not None:
        inter, intra, remote = node_bytes(choices, keep, np.arange(T) // per_gpu_t, E, Ne, nodes,
                                          h, e)
        node_stats = dict(nodes=nodes, max_nodes=max_nodes, internode_bytes_per_gpu=inter,
                          intranode_bytes_per_gpu=intra, remote_nodes_per_token=float(remote.mean()))
    return MoEStats(
        T=T, E=E, k=k, Ne=Ne, capacity_factor=capacity_factor, capacity=capacity, skew=float(skew),
        h=h, e=e, drop_rate=dropped / (T * k), dropped=dropped, load_per_expert=load_e,
        load_per_gpu=load_g, max_load=int(load_g.max()), mean_load=mean,
        imbalance=float(load_g.max() / mean) if mean > 0 else 1.0,
        bytes_per_gpu=bytes_per_gpu, bytes_mean=float(bytes_per_gpu.mean()),
        bytes_max=float(bytes_per_gpu.max()),
        bytes_formula=cost.moe_a2a_bytes(k, per_gpu_t, h, Ne, e), traffic=traffic,
        popularity=popularity, **node_stats)


# --------------------------------------------------------------------------- balancing
def switch_aux_loss(probs, experts, alpha: float = 1e-2) -> float:
    """Switch Transformer load-balancing loss ``alpha * E * sum_i f_i P_i``.

    ``probs (T, E)``: router softmax over all experts; ``experts (T, k)``: the chosen
    experts. ``f_i``: fraction of the ``k T`` copies sent to expert ``i`` (for ``k = 1`` the
    fraction of tokens); ``P_i``: mean router probability of expert ``i``. Uniform
    routing gives exactly ``alpha``; concentrated routing gives up to ``alpha * E``.
    """
    probs, experts = _real(probs, "probs"), np.asarray(experts)
    if probs.ndim != 2 or experts.ndim != 2 or experts.shape[0] != probs.shape[0]:
        raise ValueError(f"probs must be (T, E) and experts (T, k); got {probs.shape} and {experts.shape}")
    T, E = probs.shape
    if experts.size == 0:
        raise ValueError("switch_aux_loss needs at least one token (T >= 1, k >= 1)")
    if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) or not np.isfinite(alpha):
        raise ValueError(f"alpha must be a finite number, got {alpha!r}")
    if experts.dtype.kind not in "iu" or experts.min() < 0 or experts.max() >= E:
        raise ValueError(f"expert ids must lie in 0..{E - 1} for probs over E = {E} experts")
    f = np.bincount(experts.ravel(), minlength=E) / experts.size
    P = probs.mean(axis=0)
    return float(alpha * E * np.dot(f, P))


def update_expert_bias(bias, load, rate: float) -> np.ndarray:
    """DeepSeek-V3 auxiliary-loss-free balancing: ``bias - rate * sign(load - mean(load))``.

    Overloaded experts get a lower routing bias, underloaded ones a higher one. The bias
    is added to the routing scores only (``route_topk(..., bias=)``), never to the gates.
    Returns a new array.
    """
    bias, load = _real(bias, "bias"), _real(load, "load")
    if bias.shape != load.shape or bias.ndim != 1 or bias.size == 0:
        raise ValueError(f"bias and load must be non-empty 1-D arrays of the same shape (E,), "
                         f"got {bias.shape} and {load.shape}")
    rate = number("rate", rate, strict=False)
    return bias - rate * np.sign(load - load.mean())
