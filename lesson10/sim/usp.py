"""Unified sequence parallelism (USP): Ulysses inside a node, ring attention across nodes.

``N = u * r`` ranks (``u = ulysses_size``, ``r = ring_size``); rank
``rank = ring_index * u + ulysses_index``, so a Ulysses group is ``u`` consecutive ranks
(one node). Steps:

1. inside each Ulysses group, the all-to-all :func:`~lesson10.sim.seq_to_heads` on Q, K
   and V: each rank now holds the ``u c`` tokens of its group for ``a/u`` query heads and
   ``a_kv/u`` K/V heads;
2. the ``u`` ranks with the same ``ulysses_index`` (one per group) form a ring of ``r``
   ranks that together hold all ``s`` tokens of those heads:
   :func:`~lesson10.sim.ring_attention` among them;
3. the all-to-all :func:`~lesson10.sim.heads_to_seq` back to sequence sharding.

The head limit is only ``u <= a_kv`` (``u`` must divide ``a`` and ``a_kv``): the ring
takes the rest of the degree. Bytes per rank (:func:`lesson10.cost.usp_bytes`)::

    (u-1)/u * (2 + 2/g) * c h e   +   (r-1) * 2 (s/r) h e / (g u)

(four all-to-alls over ``u`` ranks, then ``r - 1`` ring steps of a K and a V block of
``s/r`` tokens and ``h/(g u)`` columns). ``u = N`` is Ulysses, ``u = 1`` is the ring.
"""
from __future__ import annotations

import numpy as np

from ..topology import check_heads, usp_group_ranks
from .attention import check_doc_ids
from .ring import ring_attention
from .ulysses import heads_to_seq, seq_to_heads
from .validate import check_qkv_shards

__all__ = ["usp_attention", "usp_groups"]


def usp_groups(ulysses_size: int, group):
    """``(ulysses_groups, ring_groups)`` over ``group`` (a :class:`~lesson10.sim.SimGroup` or its
    number of ranks ``n``; the argument order of :func:`lesson10.spmd.usp_groups`): the rank
    lists of the ``r = n/u`` Ulysses groups (consecutive ranks) and of the ``u`` rings (ranks
    ``j, u + j, 2u + j, ...``)."""
    n = group if isinstance(group, int) and not isinstance(group, bool) else getattr(group, "n", None)
    if n is None:
        raise ValueError(f"usp_groups: group must be a SimGroup or a number of ranks, got "
                         f"{type(group).__name__}")
    return usp_group_ranks(n, ulysses_size)


def usp_attention(q_shards, k_shards, v_shards, positions, ulysses_size: int, causal: bool = True,
                  group=None, *, doc_ids=None):
    """USP attention over ``N = len(q_shards)`` simulated ranks, ``N = ulysses_size * ring_size``.

    Same inputs and output as :func:`lesson10.sim.ring_attention` (``q_shards[r]`` ``(c, a,
    d)``, ``k_shards[r]`` / ``v_shards[r]`` ``(c, a_kv, d)``, ``positions[r]`` any global token
    ids or a layout name, ``doc_ids`` the document of each global position). Needs
    ``ulysses_size`` to divide ``N``, ``a`` and ``a_kv``.
    """
    q, k, v, positions, group = check_qkv_shards(q_shards, k_shards, v_shards, positions, group,
                                          "usp_attention")
    n = len(q)
    uly_groups, rings = usp_groups(ulysses_size, n)
    u = len(uly_groups[0])
    a, a_kv = q[0].shape[1], k[0].shape[1]
    check_heads(a, a_kv, u, n)
    s = n * q[0].shape[0]
    doc_ids = check_doc_ids(doc_ids, s, "usp_attention")

    # 1. sequence -> heads inside each Ulysses group (consecutive ranks)
    qh, kh, vh = [None] * n, [None] * n, [None] * n
    pos_h = [None] * n                           # token ids a rank holds after the all-to-all
    for ranks in uly_groups:
        sub = group.subgroup(ranks)
        for dst, src in ((qh, q), (kh, k), (vh, v)):
            res = seq_to_heads([src[i] for i in ranks], sub)
            for i, x in zip(ranks, res):
                dst[i] = x
        gpos = np.concatenate([positions[i] for i in ranks])
        for i in ranks:
            pos_h[i] = gpos
    # 2. ring attention across the groups, one ring per head slice
    out_h = [None] * n
    for ranks in rings:
        res = ring_attention([qh[i] for i in ranks], [kh[i] for i in ranks],
                             [vh[i] for i in ranks], [pos_h[i] for i in ranks], causal=causal,
                             group=group.subgroup(ranks), doc_ids=doc_ids)
        for i, x in zip(ranks, res):
            out_h[i] = x
    # 3. heads -> sequence inside each Ulysses group
    out = [None] * n
    for ranks in uly_groups:
        for i, x in zip(ranks, heads_to_seq([out_h[i] for i in ranks], group.subgroup(ranks))):
            out[i] = x
    return out
