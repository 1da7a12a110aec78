"""DeepSpeed-Ulysses on real ``torch.distributed``: shard by tokens, attend by heads.

Each of the ``N_c`` ranks holds ``c = s/N_c`` tokens of Q, K, V: ``(b, c, a, d)``.
One all-to-all per tensor turns it into *all* ``s`` tokens for ``a/N_c`` heads
(``seq_to_heads``); attention then runs locally with any kernel, here the ring's
(:func:`head_attention`); a last all-to-all brings the output back to token sharding
(``heads_to_seq``). An all-to-all is a block transpose of an ``N_c x N_c`` grid
(token blocks x head groups), so the backward of one direction is the other.

Layouts (a name or any positions): after ``seq_to_heads`` the rank holds the token blocks
of ranks ``0..N_c-1`` one after the other, i.e. the global ids ``concat(positions)``. With
a causal or document mask we permute them to natural order, run the causal kernel (or
the einsum path, for documents) and permute back; without a mask the order does not
matter.

GQA: K/V have ``n_kv`` heads, ``g = a / n_kv`` query heads share one. Rank ``r``
gets query heads ``r a/N_c ..`` and they use exactly K/V heads ``r n_kv/N_c ..``,
so K/V travel compact when ``n_kv`` is a multiple of ``N_c`` (``g`` times fewer
bytes). Otherwise ``replicate_kv=True`` copies each K/V head ``m`` times first
(``n_kv m = lcm(n_kv, N_c)``), at ``m`` times the K/V bytes.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..layouts import block_plan
from . import comm
from .attention import BlockAttention, block_kwargs
from .shard import layout_positions
from .ulysses_pipeline import PipelinedUlysses, check_head_groups, clock, time_backward
from .validate import check_doc_ids, check_local_qkv, require_rank

__all__ = ["seq_to_heads", "heads_to_seq", "ulysses_attention", "layout_order", "head_attention"]


#: the two directions of the Ulysses all-to-all: (dim split over the ranks, dim gathered)
_TO_HEADS, _TO_SEQ = (2, 1), (1, 2)
_WHAT = {_TO_HEADS: ("seq_to_heads", "heads", "the head count must be a multiple of N_c."),
         _TO_SEQ: ("heads_to_seq", "tokens", "")}
#: the breakdown's name of each all-to-all: (direction, forward?) -> key
_KEY = {(_TO_HEADS, True): "fwd q/k/v all-to-all wait", (_TO_SEQ, True): "fwd output all-to-all wait",
        (_TO_SEQ, False): "bwd dq/dk/dv all-to-all wait", (_TO_HEADS, False): "bwd dout all-to-all wait"}


def _all_to_all_4d(x, group, dims, forward: bool = True):
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
    copies = "fwd copies" if forward else "bwd copies"
    with clock(copies):
        blocks = torch.stack(x.chunk(n, dim=split)).contiguous()   # (N, ...): block j -> rank j
    with clock(_KEY[dims, forward]):
        got = comm.all_to_all_single(blocks, group=group)     # (N, ...): block j from rank j
    with clock(copies):
        return torch.cat(got.unbind(0), dim=join)


class _UlyssesAllToAll(torch.autograd.Function):
    """The all-to-all of ``dims``; its backward is the all-to-all of the reversed dims."""

    @staticmethod
    def forward(ctx, x, group, dims):
        ctx.group, ctx.dims = group, dims
        return _all_to_all_4d(x, group, dims)

    @staticmethod
    def backward(ctx, dy):
        return _all_to_all_4d(dy, ctx.group, ctx.dims[::-1], forward=False), None, None


def seq_to_heads(x: torch.Tensor, group=None) -> torch.Tensor:
    """All-to-all ``(b, s/N_c, H, d)`` -> ``(b, s, H/N_c, d)``; backward is :func:`heads_to_seq`."""
    return _UlyssesAllToAll.apply(x, group, _TO_HEADS)


def heads_to_seq(y: torch.Tensor, group=None) -> torch.Tensor:
    """All-to-all ``(b, s, H/N_c, d)`` -> ``(b, s/N_c, H, d)``; backward is :func:`seq_to_heads`."""
    return _UlyssesAllToAll.apply(y, group, _TO_SEQ)


def layout_order(s: int, n: int, layout) -> torch.Tensor:
    """Global token ids in the order ``seq_to_heads`` leaves them: ``concat(shard_positions)``
    (``layout``: a layout name, or the positions of every rank, one sequence each)."""
    from ..layouts import shard_positions
    pos = shard_positions(s, n, layout) if isinstance(layout, str) else layout
    return torch.from_numpy(np.concatenate(pos).astype(np.int64))


def _check(q, k, v, n, replicate_kv):
    check_local_qkv(q, k, v, "ulysses_attention")
    a, n_kv = q.shape[2], k.shape[2]
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


def _row_perm(order: torch.Tensor, causal: bool, device):
    """``None`` when the rows ``seq_to_heads`` leaves need no reordering (no mask, or the
    tokens already in order), else ``(inv, order)``: rows ``inv`` hold tokens ``0..s-1``."""
    if not causal or torch.equal(order, torch.arange(order.numel())):
        return None
    return torch.argsort(order).to(device), order.to(device)


def head_attention(qh, kh, vh, order, causal: bool, doc, scale=None, impl: str = "auto"):
    """The local attention of Ulysses: ``qh (b, s, a', d)``, ``kh``/``vh`` ``(b, s, a_kv', d)``
    all ``s`` tokens for this rank's heads, row ``i`` holding global token ``order[i]``.
    With a mask the rows go to token order first (one causal block: the fused kernel) and
    back after; :class:`lesson10.spmd.attention.BlockAttention` with the blocks of
    :func:`lesson10.layouts.block_plan`. Differentiable."""
    s = qh.shape[1]
    masked = causal or doc is not None
    tokens = torch.arange(s, device=qh.device)
    with clock("fwd copies"):
        if masked:
            inv = torch.argsort(order).to(qh.device)      # token t sits at row inv[t]
            qh, kh, vh = qh[:, inv], kh[:, inv], vh[:, inv]
    doc_np = None if doc is None else doc.cpu().numpy()
    blocks = [(blk, block_kwargs(blk, tokens, tokens, causal, doc))
              for blk in block_plan(tokens.cpu().numpy(), tokens.cpu().numpy(), causal, doc_np)]
    with clock("fwd attention"):
        o = BlockAttention.apply(qh, kh, vh, blocks, scale, impl)   # (b, s, a', d)
    time_backward(o, qh, "bwd attention")
    with clock("fwd copies"):
        return o[:, order.to(qh.device)] if masked else o         # back to the rows' order


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                      layout="contiguous", group=None, *, doc_ids=None,
                      replicate_kv: bool = False, scale: float | None = None,
                      impl: str = "auto", fused: bool = True,
                      head_groups: int = 1) -> torch.Tensor:
    """Attention of local shards ``q`` ``(b, c, a, d)``, ``k``/``v`` ``(b, c, n_kv, d)``.

    ``c = s/N_c`` tokens per rank, held as ``layout`` says: a layout name (``contiguous``,
    ``zigzag``, ``striped``) or this rank's positions (the global token ids of its local
    tokens, in order; all ranks together hold ``0..s-1`` once). ``doc_ids``: the document
    of every global position (length ``s``), a document mask. Returns this rank's output
    shard ``(b, c, a, d)``, equal to full attention over the ``s`` tokens restricted to this
    rank's tokens. Differentiable. The local attention is the ring's kernel
    (:func:`head_attention`; ``impl`` as in :func:`lesson10.spmd.attention.local_attention`).
    Forward bytes: four all-to-alls, ``(N_c-1)/N_c`` of the local Q, K, V and output (K, V at
    ``n_kv`` heads). It first compares the shard shapes of all ranks (a tiny all-gather,
    ``"metadata"`` bytes), so mismatched shards give a ValueError on every rank instead of a
    hang.

    ``fused=True`` (without ``doc_ids``): Q, K and V share one all-to-all per head group
    and the ``head_groups`` groups are pipelined (:mod:`lesson10.spmd.ulysses_pipeline`;
    ``head_groups`` must divide the query and K/V heads of a rank); ``fused=False``: the
    four autograd all-to-alls of :func:`seq_to_heads` / :func:`heads_to_seq`. Same
    outputs and gradients, same bytes.
    """
    require_rank("ulysses_attention")
    n = comm.group_size(group)
    m = _check(q, k, v, n, replicate_kv)
    comm.check_same_shape(q, group, "q")
    comm.check_same_shape(k, group, "k")
    order = layout_order(n * q.shape[1], n, layout_positions(layout, q.shape[1], group, q.device))
    doc = check_doc_ids(doc_ids, order.numel(), q.device, "ulysses_attention")
    groups = check_head_groups(head_groups, q.shape[2], k.shape[2] * m, n)
    if m > 1:
        k = k.repeat_interleave(m, dim=2)            # (b, c, n_kv m, d): copies of each K/V head
        v = v.repeat_interleave(m, dim=2)
    if fused and doc is None:
        return PipelinedUlysses.apply(q, k, v, _row_perm(order, bool(causal), q.device),
                                      bool(causal), scale, impl, group, groups)
    qh, kh, vh = (seq_to_heads(t, group) for t in (q, k, v))   # (b, s, ./N, d)
    o = head_attention(qh, kh, vh, order, bool(causal), doc, scale, impl)
    return heads_to_seq(o, group)                    # (b, c, a, d)
