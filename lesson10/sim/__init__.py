"""NumPy simulation of every method of the lesson: one process, every rank an entry of a list.

A *sharded* argument is a Python list with one array per rank; sequences are
``(s, a, d)`` float64 arrays (tokens, heads, head dim). A :class:`SimGroup` runs the
collectives and counts the bytes each rank sends, with ``e`` bytes per element.
Besides the lesson's methods, their combinations: all-gather context parallelism
(:mod:`.allgather`), document masks (``doc_ids=``), USP (:mod:`.usp`) and node-limited
MoE routing (:mod:`.nodes`). Nothing here imports torch.

The attention family has one signature: ``(q_shards, k_shards, v_shards, positions,
causal=True, group=None, *, doc_ids=None, ...)`` (USP puts its ``ulysses_size`` after
``positions``); everything after ``group`` is keyword-only, each method's own options
(``return_stats``, ``replicate_kv``, ``attention``) last.
"""
from .allgather import AllGatherStats, allgather_attention
from .attention import attention, merge
from .comm import CommRecord, SimGroup, Stats, check_shards, gather_sequence, shard_sequence
from .moe import (
                  MoELayerStats,
                  MoEStats,
                  apply_expert,
                  arrival_order,
                  expert_capacity,
                  init_experts,
                  keep_within_capacity,
                  moe_layer,
                  moe_reference,
                  route_topk,
                  router_probs,
                  simulate_moe,
                  skewed_routing,
                  switch_aux_loss,
                  update_expert_bias,
)
from .ring import RingStats, ring_attention
from .sp import sp_forward, tp_forward
from .ulysses import heads_to_seq, kv_replication, seq_to_heads, ulysses_attention
from .usp import usp_attention, usp_groups

__all__ = [
    "SimGroup", "CommRecord", "Stats", "check_shards", "shard_sequence", "gather_sequence",
    "attention", "merge",
    "tp_forward", "sp_forward",
    "ring_attention", "RingStats",
    "seq_to_heads", "heads_to_seq", "ulysses_attention", "kv_replication",
    "allgather_attention", "AllGatherStats", "usp_attention", "usp_groups",
    "route_topk", "router_probs", "expert_capacity", "arrival_order", "keep_within_capacity",
    "apply_expert",
    "init_experts", "moe_reference", "moe_layer", "simulate_moe", "skewed_routing", "MoEStats",
    "MoELayerStats",
    "switch_aux_loss", "update_expert_bias",
]
