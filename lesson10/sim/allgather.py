"""All-gather context parallelism (Llama 3): gather the compact K/V once, then attend locally.

Rank ``r`` holds the queries, keys and values of its tokens ``positions[r]`` (any layout;
Llama 3 uses zig-zag). Instead of passing K/V blocks round a ring, every rank all-gathers
the K and the V of all ranks (``s`` tokens, ``a_kv`` heads: with GQA ``g = a / a_kv``
times smaller than Q) and runs attention of its ``c`` queries against all ``s`` keys, with
the global positions for the causal mask and, optionally, a document mask.

Bytes per rank: two all-gathers of an ``s x h/g`` tensor, ``(N_c-1)/N_c * 2 s h e / g``
(:func:`lesson10.cost.comm_bytes` with ``"allgather"``): the same as the ring's
``(N_c-1) * 2 c h e / g``, but sent in one exposed step before the attention, and every
rank then stores all of K and V (``2 s h / g`` elements) instead of one block.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..layouts import kernel_mask
from .attention import attention, check_doc_ids
from .comm import Stats
from .validate import check_qkv_shards

__all__ = ["allgather_attention", "AllGatherStats"]


@dataclass
class AllGatherStats(Stats):
    """What happened in one all-gather attention call: ``work`` (visible pairs per rank,
    ``(N_c,)``), ``lse`` (per rank, ``(c, a)``) and ``bytes_sent`` (per rank, this call)."""
    work: np.ndarray
    lse: list
    bytes_sent: np.ndarray


def allgather_attention(q_shards, k_shards, v_shards, positions, causal: bool = True,
                        group=None, *, doc_ids=None, return_stats: bool = False):
    """All-gather attention over ``N_c = len(q_shards)`` simulated ranks.

    Same inputs and output as :func:`lesson10.sim.ring_attention`: ``q_shards[r]``
    ``(c, a, d)``, ``k_shards[r]`` / ``v_shards[r]`` ``(c, a_kv, d)``, ``positions[r]`` the
    ``c`` global token ids of rank ``r`` (or a layout name); ``doc_ids`` (length ``s``) the
    document of each global position. Returns ``out_shards`` (``(c, a, d)`` per rank); with
    ``return_stats=True`` also an :class:`AllGatherStats`.
    """
    q, k, v, positions, group = check_qkv_shards(q_shards, k_shards, v_shards, positions, group,
                                          "allgather_attention")
    n = len(q)
    k_pos = np.concatenate(positions)               # rank order, as all_gather concatenates
    doc_ids = check_doc_ids(doc_ids, k_pos.size, "allgather_attention")
    start = group.bytes_sent.copy()
    k_all = group.all_gather(k, axis=0)             # every rank: (s, a_kv, d)
    v_all = group.all_gather(v, axis=0)
    out, lse = [], []
    for r in range(n):
        o, l_ = attention(q[r], k_all[r], v_all[r], causal=causal, q_pos=positions[r],
                          k_pos=k_pos, doc_ids=doc_ids)
        out.append(o)
        lse.append(l_)
    if not return_stats:
        return out
    work = np.array([kernel_mask(p, k_pos, causal, doc_ids).sum() for p in positions])
    return out, AllGatherStats(work=work, lse=lse, bytes_sent=group.bytes_sent - start)
