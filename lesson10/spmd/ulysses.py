"""DeepSpeed-Ulysses on real ``torch.distributed``: shard by tokens, attend by heads.

Each of the ``N_c`` ranks holds ``c = s/N_c`` tokens of Q, K, V: ``(b, c, a, d)``.
One all-to-all per tensor turns it into *all* ``s`` tokens for ``a/N_c`` heads
(``seq_to_heads``); attention then runs locally with any kernel, here PyTorch's
SDPA; a last all-to-all brings the output back to token sharding
(``heads_to_seq``). An all-to-all is a block transpose of an ``N_c x N_c`` grid
(token blocks x head groups), so the backward of one direction is the other.

Layouts: after ``seq_to_heads`` the rank holds the token blocks of ranks
``0..N_c-1`` one after the other, i.e. the global ids ``concat(shard_positions)``.
For causal attention we permute them to natural order, run causal SDPA, and
permute back; without a mask the order does not matter.

GQA: K/V have ``n_kv`` heads, ``g = a / n_kv`` query heads share one. Rank ``r``
gets query heads ``r a/N_c ..`` and they use exactly K/V heads ``r n_kv/N_c ..``,
so K/V travel compact when ``n_kv`` is a multiple of ``N_c`` (``g`` times fewer
bytes). Otherwise ``replicate_kv=True`` copies each K/V head ``m`` times first
(``n_kv m = lcm(n_kv, N_c)``), at ``m`` times the K/V bytes.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from . import comm
from .attention import check_float

__all__ = ["seq_to_heads", "heads_to_seq", "ulysses_attention", "layout_order"]


#: the two directions of the Ulysses all-to-all: (dim split over the ranks, dim gathered)
_TO_HEADS, _TO_SEQ = (2, 1), (1, 2)
_WHAT = {_TO_HEADS: ("seq_to_heads", "heads", "the head count must be a multiple of N_c."),
         _TO_SEQ: ("heads_to_seq", "tokens", "")}


def _all_to_all_4d(x, group, dims):
    """The Ulysses all-to-all on plain ``(b, s, a, d)`` tensors: split dim ``dims[0]`` into
    ``N`` blocks, send block ``j`` to rank ``j``, concatenate the blocks received along dim
    ``dims[1]`` in rank order. ``_TO_HEADS``: ``(b, c, H, d) -> (b, N c, H/N, d)``;
    ``_TO_SEQ`` is its inverse (and so its backward)."""
    n = comm.group_size(group)
    split, join = dims
    if x.shape[split] % n:
        where, unit, advice = _WHAT[dims]
        raise ValueError(f"{where}: {x.shape[split]} {unit} do not split over N_c = {n} ranks"
                         + (f"; {advice}" if advice else ""))
    blocks = torch.stack(x.chunk(n, dim=split)).contiguous()   # (N, ...): block j -> rank j
    got = comm.all_to_all_single(blocks, group=group)         # (N, ...): block j from rank j
    return torch.cat(got.unbind(0), dim=join)


class _UlyssesAllToAll(torch.autograd.Function):
    """The all-to-all of ``dims``; its backward is the all-to-all of the reversed dims."""

    @staticmethod
    def forward(ctx, x, group, dims):
        ctx.group, ctx.dims = group, dims
        return _all_to_all_4d(x, group, dims)

    @staticmethod
    def backward(ctx, dy):
        return _all_to_all_4d(dy, ctx.group, ctx.dims[::-1]), None, None


def seq_to_heads(x: torch.Tensor, group=None) -> torch.Tensor:
    """All-to-all ``(b, s/N_c, H, d)`` -> ``(b, s, H/N_c, d)``; backward is :func:`heads_to_seq`."""
    return _UlyssesAllToAll.apply(x, group, _TO_HEADS)


def heads_to_seq(y: torch.Tensor, group=None) -> torch.Tensor:
    """All-to-all ``(b, s, H/N_c, d)`` -> ``(b, s/N_c, H, d)``; backward is :func:`seq_to_heads`."""
    return _UlyssesAllToAll.apply(y, group, _TO_SEQ)


def layout_order(s: int, n: int, layout: str) -> torch.Tensor:
    """Global token ids in the order ``seq_to_heads`` leaves them: ``concat(shard_positions)``."""
    import numpy as np

    from ..layouts import shard_positions
    return torch.from_numpy(np.concatenate(shard_positions(s, n, layout)).astype(np.int64))


def _check(q, k, v, n, replicate_kv):
    check_float(q=q, k=k, v=v)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("ulysses_attention expects q, k, v of shape (b, s/N_c, heads, d); got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if (q.shape[0], q.shape[1], q.shape[3]) != (k.shape[0], k.shape[1], k.shape[3]):
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree in batch, local "
                         "tokens and head dim (only the head count may differ: GQA)")
    a, n_kv = q.shape[2], k.shape[2]
    if n_kv == 0 or a % n_kv:
        raise ValueError(f"{a} query heads are not a multiple of {n_kv} K/V heads (GQA needs it)")
    if a % n:
        raise ValueError(f"Ulysses splits heads over N_c = {n} ranks: {a} query heads are not a "
                         f"multiple of {n}. Use N_c dividing {a}, or ring attention.")
    if n_kv % n == 0:
        return 1
    if not replicate_kv:
        raise ValueError(
            f"Ulysses with N_c = {n} ranks needs the number of K/V heads (n_kv = {n_kv}) to be a "
            f"multiple of N_c (each rank needs whole K/V heads): without copying, N_c can be at "
            f"most n_kv = {n_kv} (and must divide it). Use ring attention (or Ulysses inside "
            f"groups of at most n_kv ranks and ring attention across them), or pass "
            "replicate_kv=True to copy K/V heads at a higher communication cost.")
    return math.lcm(n_kv, n) // n_kv


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                      layout: str = "contiguous", group=None, replicate_kv: bool = False,
                      scale: float | None = None) -> torch.Tensor:
    """Attention of local shards ``q`` ``(b, c, a, d)``, ``k``/``v`` ``(b, c, n_kv, d)``.

    ``c = s/N_c`` tokens per rank, held as ``layout`` says (``contiguous``,
    ``zigzag``, ``striped``). Returns this rank's output shard ``(b, c, a, d)``, equal
    to full attention over the ``s`` tokens restricted to this rank's tokens.
    Differentiable. Forward bytes: four all-to-alls, ``(N_c-1)/N_c`` of the local
    Q, K, V and output (K, V at ``n_kv`` heads). It first compares the shard shapes of all
    ranks (a tiny all-gather, ``"metadata"`` bytes), so mismatched shards give a
    ValueError on every rank instead of a hang.
    """
    n = comm.group_size(group)
    m = _check(q, k, v, n, replicate_kv)
    comm.check_same_shape(q, group, "q")
    comm.check_same_shape(k, group, "k")
    b, c, a, d = q.shape
    s = n * c
    order = layout_order(s, n, layout)               # validates s and the layout name
    order = order if causal else None
    if m > 1:
        k = k.repeat_interleave(m, dim=2)            # (b, c, n_kv m, d): copies of each K/V head
        v = v.repeat_interleave(m, dim=2)
    qh = seq_to_heads(q, group)                      # (b, s, a/N, d)
    kh = seq_to_heads(k, group)                      # (b, s, n_kv'/N, d)
    vh = seq_to_heads(v, group)                      # (b, s, n_kv'/N, d)
    g = qh.shape[2] // kh.shape[2]                   # query heads per K/V head
    if causal:
        inv = torch.argsort(order).to(q.device)      # natural position t sits at row inv[t]
        qh, kh, vh = qh[:, inv], kh[:, inv], vh[:, inv]   # (b, s, ., d) in natural order
    # SDPA wants (b, heads, s, d); repeat K/V heads only here, inside the local attention
    qt = qh.transpose(1, 2)                          # (b, a/N, s, d)
    kt = kh.transpose(1, 2).repeat_interleave(g, dim=1)   # (b, a/N, s, d)
    vt = vh.transpose(1, 2).repeat_interleave(g, dim=1)   # (b, a/N, s, d)
    o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, scale=scale)
    o = o.transpose(1, 2)                            # (b, s, a/N, d)
    if causal:
        o = o[:, order.to(q.device)]                 # back to layout order (b, s, a/N, d)
    return heads_to_seq(o, group)                    # (b, c, a, d)
