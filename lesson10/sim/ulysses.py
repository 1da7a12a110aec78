"""DeepSpeed-Ulysses: switch from sequence sharding to head sharding and back.

Think of a tensor as an ``N_c x N_c`` grid of blocks (token blocks x head groups).
With sequence sharding rank ``r`` holds row ``r`` (its ``c = s/N_c`` tokens, all
heads); one all-to-all (a block transpose) gives it column ``r`` (all ``s`` tokens,
heads ``r a/N_c .. (r+1) a/N_c - 1``). Attention then runs locally per head, and a
second all-to-all on the output goes back to sequence sharding.

Bytes per rank: four all-to-alls (Q, K, V, output), each sending ``(N_c-1)/N_c`` of
the local tensor: ``(N_c-1)/N_c * (2 + 2/g) * c h e`` with ``g = a / a_kv``.

Each rank needs whole K/V heads, so ``N_c`` must divide ``a_kv``. Beyond that,
``replicate_kv=True`` copies every K/V head before the all-to-all (the copies are
sent, so the bytes grow), or use ring attention.
"""
from __future__ import annotations

import math

import numpy as np

from .attention import attention as _attention
from .attention import check_doc_ids
from .comm import check_shards
from .validate import check_group, check_qkv_shards

__all__ = ["seq_to_heads", "heads_to_seq", "ulysses_attention", "kv_replication"]


def _group(n, group):
    return check_group(group, n, "shards", needs=("all_to_all",))


def _all_to_all_axes(shards, group, name: str, split: int, join: int):
    """The Ulysses all-to-all: each rank splits axis ``split`` into ``N_c`` blocks, block
    ``j`` goes to rank ``j``, and each rank joins what it receives along axis ``join`` in
    rank order. ``split=1, join=0``: sequence -> heads; ``split=0, join=1``: back."""
    xs = check_shards(shards, name)
    n = len(xs)
    group = _group(n, group)
    if xs[0].ndim < 2:
        raise ValueError(f"{name}: shards must be (tokens, heads, ...), got {xs[0].shape}")
    size = xs[0].shape[split]
    if size % n:
        unit = "heads" if split == 1 else "tokens"
        advice = "; the number of heads must be a multiple of N_c" if split == 1 else ""
        raise ValueError(f"{name}: {size} {unit} do not split over N_c = {n} ranks{advice}")
    blocks = [np.split(x, n, axis=split) for x in xs]        # blocks[i][j]: rank i -> rank j
    received = group.all_to_all(blocks)
    return [np.concatenate(row, axis=join) for row in received]


def seq_to_heads(shards, group=None):
    """All-to-all from sequence to head sharding.

    ``shards[r]``: ``(c, a, d)``, the ``c`` tokens of rank ``r``. Returns ``out[j]``:
    ``(N_c c, a/N_c, d)``, heads ``j a/N_c ..`` for the tokens of ranks ``0, 1, ..., N_c-1``
    in that order (rank 0's tokens first). ``a`` must be a multiple of ``N_c``.
    """
    return _all_to_all_axes(shards, group, "seq_to_heads", split=1, join=0)


def heads_to_seq(shards, group=None):
    """All-to-all from head back to sequence sharding (inverse of :func:`seq_to_heads`).

    ``shards[j]``: ``(s, a/N_c, d)``, all tokens (in rank order) for head group ``j``.
    Returns ``out[r]``: ``(s/N_c, a, d)``, the tokens of rank ``r`` with all heads.
    """
    return _all_to_all_axes(shards, group, "heads_to_seq", split=0, join=1)


def kv_replication(a: int, a_kv: int, n: int) -> int:
    """Smallest factor ``rep`` (a divisor of ``g = a/a_kv``) such that copying every K/V head
    ``rep`` times gives a head count that ``n`` ranks can split: ``(a_kv rep) % n == 0``."""
    for name, val in (("a", a), ("a_kv", a_kv), ("n", n)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < 1:
            raise ValueError(f"kv_replication: {name} must be an integer >= 1, got {val!r}")
    if a % a_kv:
        raise ValueError(f"kv_replication: {a} query heads are not a multiple of {a_kv} K/V heads")
    g = a // a_kv
    for rep in range(1, g + 1):
        if g % rep == 0 and (a_kv * rep) % n == 0:
            return rep
    raise ValueError(f"cannot split {a} query heads over N_c = {n} ranks")  # a % n != 0


def ulysses_attention(q_shards, k_shards, v_shards, positions, causal: bool = True, group=None,
                      *, doc_ids=None, attention=None, replicate_kv: bool = False):
    """Ulysses attention over ``N_c = len(q_shards)`` simulated ranks.

    Same inputs and output as :func:`lesson10.sim.ring_attention`: ``q_shards[r]``
    ``(c, a, d)``, ``k_shards[r]`` / ``v_shards[r]`` ``(c, a_kv, d)``, ``positions[r]`` the
    global token ids of rank ``r`` (any layout, or a layout name). Needs ``a % N_c == 0``
    and ``a_kv % N_c == 0``; with ``replicate_kv=True`` the K/V heads are copied (``rep``
    times, see :func:`kv_replication`) so that fewer K/V heads than ranks also work.
    ``doc_ids`` (length ``s``): the document of each global position (document mask).
    ``attention``: the kernel each rank runs on its head group, with the signature of
    :func:`lesson10.sim.attention` (None: that one); it is called once per head group, with
    ``doc_ids=`` only when a document mask is given.
    """
    q, k, v, positions, group = check_qkv_shards(q_shards, k_shards, v_shards, positions, group,
                                          "ulysses_attention", needs=("all_to_all",))
    kernel = _attention if attention is None else attention
    n = len(q)
    a, a_kv = q[0].shape[1], k[0].shape[1]
    if a_kv == 0 or a % a_kv:
        raise ValueError(f"ulysses_attention: {a} query heads are not a multiple of {a_kv} K/V heads")
    if a % n:
        raise ValueError(f"ulysses_attention: {a} query heads do not split over N_c = {n} ranks; "
                         f"Ulysses needs the number of heads to be a multiple of N_c")
    if a_kv % n:
        if not replicate_kv:
            raise ValueError(
                f"ulysses_attention: each rank needs whole K/V heads, but n_kv = {a_kv} K/V heads "
                f"do not split over N_c = {n} ranks (the Ulysses degree is limited to N_c <= n_kv, "
                f"with N_c dividing n_kv). Use ring attention for this degree (or Ulysses inside "
                f"groups of <= {a_kv} ranks combined with ring attention across them: "
                f"usp_attention(..., ulysses_size={math.gcd(a_kv, n)})), or pass "
                f"replicate_kv=True to copy K/V heads at a higher communication cost.")
        rep = kv_replication(a, a_kv, n)
        # copy head m to heads m*rep .. m*rep+rep-1; query head i still uses old head i // g
        k = [np.repeat(x, rep, axis=1) for x in k]
        v = [np.repeat(x, rep, axis=1) for x in v]
    qh, kh, vh = (seq_to_heads(t, group) for t in (q, k, v))
    pos = np.concatenate(positions)                   # token order after the all-to-all
    doc_ids = check_doc_ids(doc_ids, pos.size, "ulysses_attention")
    masks = {} if doc_ids is None else {"doc_ids": doc_ids}
    out_h = [kernel(qh[j], kh[j], vh[j], causal=causal, q_pos=pos, k_pos=pos, **masks)[0]
             for j in range(n)]
    return heads_to_seq(out_h, group)
