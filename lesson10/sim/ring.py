"""Ring attention (context parallelism): queries stay, K/V blocks travel.

Rank ``r`` holds the queries, keys and values of its tokens ``positions[r]``
(any layout). In round ``k = 0 .. N_c-1`` it holds the K/V block of rank
``(r - k) mod N_c``, computes attention of its queries against it, and merges the
result into its running ``(out, lse)`` with the logsumexp formula. Between rounds
every rank sends its K/V block to rank ``r+1`` (``group.ring_shift``); there is no
shift after the last round, so each rank sends ``N_c - 1`` K blocks and ``N_c - 1``
V blocks: ``(N_c-1) * 2 c (h/g) e`` bytes (``g`` times fewer with compact GQA K/V).

A block in which no query sees any key (causal: all keys later; document mask: no
shared document) is skipped: its result would be the neutral ``(0, -inf)``. The block
still travels, so masks change the work per round, never the bytes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..layouts import block_plan, plan_pairs, ring_source
from .attention import attention, check_doc_ids, merge
from .comm import Stats
from .validate import check_qkv_shards

__all__ = ["ring_attention", "RingStats"]


@dataclass
class RingStats(Stats):
    """What happened in one ring-attention call.

    ``work[k, r]``: visible (query, key) pairs rank ``r`` computed in round ``k``
    (equals ``layouts.causal_work(N_c, layout, s)`` for a causal mask);
    ``ring_time``: ``sum_k max_r work[k, r]``; ``lse``: per-rank logsumexp ``(c, a)``;
    ``sources[k, r]``: the rank whose K/V block rank ``r`` used in round ``k``;
    ``bytes_sent``: bytes each rank sent during this call (None with a group that keeps no
    byte ledger); ``skipped[k, r]``: True where the
    block had no visible pair and was not computed (``n_skipped`` of them).
    """
    work: np.ndarray
    ring_time: int
    lse: list
    sources: np.ndarray
    bytes_sent: np.ndarray | None
    skipped: np.ndarray | None = None
    n_skipped: int = 0


def ring_attention(q_shards, k_shards, v_shards, positions, causal: bool = True, group=None,
                   *, doc_ids=None, return_stats: bool = False):
    """Ring attention over ``N_c = len(q_shards)`` simulated ranks.

    ``q_shards[r]`` is ``(c, a, d)``, ``k_shards[r]`` / ``v_shards[r]`` are ``(c, a_kv, d)``
    (compact GQA K/V, ``a % a_kv == 0``), and ``positions[r]`` the ``c`` global token ids
    of rank ``r`` (or a layout name such as ``"zigzag"``); ``doc_ids`` (length ``s``) the
    document of each global position, for a document mask. Returns ``out_shards`` (one
    ``(c, a, d)`` per rank), equal to full attention restricted to each rank's tokens;
    with ``return_stats=True`` returns ``(out_shards, RingStats)``.
    """
    q, k, v, positions, group = check_qkv_shards(q_shards, k_shards, v_shards, positions, group,
                                          "ring_attention", needs=("ring_shift",))
    n = len(q)
    doc_ids = check_doc_ids(doc_ids, n * q[0].shape[0], "ring_attention")
    start = getattr(group, "bytes_sent", None)          # a served network keeps no ledger
    start = None if start is None else np.array(start, dtype=float)
    out = [np.zeros(x.shape[:2] + (v[0].shape[2],)) for x in q]
    lse = [np.full(x.shape[:2], -np.inf) for x in q]
    work = np.zeros((n, n), dtype=np.int64)
    sources = np.zeros((n, n), dtype=np.int64)
    skipped = np.zeros((n, n), dtype=bool)
    for rnd in range(n):
        for r in range(n):
            src = ring_source(r, rnd, n)            # whose K/V block rank r holds now
            sources[rnd, r] = src
            work[rnd, r] = plan_pairs(block_plan(positions[r], positions[src], causal, doc_ids))
            if work[rnd, r] == 0:                   # fully masked: (0, -inf) changes nothing
                skipped[rnd, r] = True
                continue
            o_blk, lse_blk = attention(q[r], k[r], v[r], causal=causal, q_pos=positions[r],
                                       k_pos=positions[src], doc_ids=doc_ids)
            out[r], lse[r] = merge(out[r], lse[r], o_blk, lse_blk)
        if rnd < n - 1:                             # no shift after the last round
            k = group.ring_shift(k)
            v = group.ring_shift(v)
    if not return_stats:
        return out
    stats = RingStats(work=work, ring_time=int(work.max(axis=1).sum()), lse=lse,
                      sources=sources, skipped=skipped,
                      bytes_sent=None if start is None else group.bytes_sent - start,
                      n_skipped=int(skipped.sum()))
    return out, stats
