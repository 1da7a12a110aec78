"""The numbers behind the interactive figures (no drawing): which rank holds which token or
(token, head) cell, what each ring round computes, and where MoE copies land. The figures of
:mod:`lesson10.figures` draw them; :mod:`lesson10.figures` re-exports the public ones.
"""
from __future__ import annotations

import numpy as np

from .. import layouts
from ..rules import MoEConfig, count, number
from ..sim import moe as sim_moe

__all__ = ["owners", "ring_states", "ulysses_owner", "moe_routing"]


def owners(s: int, n: int, layout) -> np.ndarray:
    """The rank that holds each of the ``s`` tokens, ``(s,)``."""
    owner = np.empty(s, dtype=int)
    for r, pos in enumerate(layouts.shard_positions(s, n, layout)):
        owner[pos] = r
    return owner


def ring_states(s: int, n: int, layout: str, causal: bool, round: int) -> np.ndarray:
    """``(s, s)`` by (query, key) token: 0 masked, 3 computed in ``round``, 2 earlier, 1 later;
    from the ring's own plan (:func:`lesson10.layouts.block_plan`) of every (round, rank)."""
    pos = layouts.shard_positions(s, n, layout)
    state = np.zeros((s, s), dtype=int)
    for k in range(n):
        for r in range(n):
            qp, kp = pos[r], pos[layouts.ring_source(r, k, n)]
            seen = layouts.plan_mask(layouts.block_plan(qp, kp, causal), qp, kp, causal)
            state[np.ix_(qp, kp)] = np.where(seen, 3 if k == round else 2 if k < round else 1, 0)
    return state


def ulysses_owner(n: int, s: int, heads: int, state: str = "sequence") -> np.ndarray:
    """Rank holding each (token, head) cell, shape ``(s, heads)``: by token blocks of ``s/n``
    (``state="sequence"``) or by head groups of ``heads/n`` (``state="heads"``)."""
    if state not in ("sequence", "heads"):
        raise ValueError(f"state must be 'sequence' or 'heads', got {state!r}")
    for name, value in (("s (tokens)", s), ("heads", heads)):
        if value % n:
            raise ValueError(f"{name} = {value} does not split over n = {n} ranks; use a multiple of {n}")
    tok, head = np.meshgrid(np.arange(s), np.arange(heads), indexing="ij")
    return tok // (s // n) if state == "sequence" else head // (heads // n)


def moe_routing(E: int = 8, Ne: int = 4, k: int = 2, T: int = 64, skew: float = 0.0,
                capacity_factor: float | None = 1.25, seed: int = 0) -> dict:
    """Route ``N = Ne * T`` tokens (``T`` per GPU, as in the lesson) to ``k`` distinct experts.

    The skew model of :func:`lesson10.sim.simulate_moe` (:func:`lesson10.sim.skewed_routing`,
    the same sample for the same seed): expert ``i`` has a popularity ``u_i`` (standard normal,
    from ``seed``) and token scores are ``skew * u_i`` plus standard Gumbel noise; ``skew = 0``
    is uniform top-k. Capacity ``C = ceil(CF * k * N / E)`` and first-come-first-served drops
    in global token order (GPU 0's tokens first) by :func:`lesson10.sim.arrival_order`;
    ``capacity_factor=None``: no limit.

    Returns a dict: ``experts`` (N, k), ``arrival`` (N, k) = place of each copy in its
    expert's queue, ``kept`` (N, k) bool, ``capacity`` (int or None), ``received_per_expert``
    (all copies), ``load_per_expert`` and ``load_per_gpu`` (computed copies), ``drop_rate``.
    """
    config = MoEConfig(E, k, capacity_factor, N_e=Ne)   # 1 <= k <= E, CF, E a multiple of Ne
    N = config.N_e * count("T (tokens per GPU)", T)
    number("skew", skew, strict=False)
    capacity = config.capacity(N)
    popularity, experts = sim_moe.skewed_routing(N, E, k, skew, seed)
    experts = experts.astype(np.int64)
    arrival = sim_moe.arrival_order(experts, E)
    kept = np.ones(experts.shape, dtype=bool) if capacity is None else arrival < capacity
    flat = experts.ravel()
    counts = np.bincount(flat, minlength=E)
    load_expert = np.bincount(flat[kept.ravel()], minlength=E)
    return {
        "experts": experts, "arrival": arrival, "kept": kept, "capacity": capacity,
        "received_per_expert": counts, "load_per_expert": load_expert,
        "load_per_gpu": load_expert.reshape(Ne, config.experts_per_rank).sum(axis=1),
        "drop_rate": 1.0 - kept.mean(), "popularity": popularity,
    }
