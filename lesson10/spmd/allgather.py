"""All-gather context parallelism (Llama 3) on torch.distributed, forward and backward.

Each of the ``N_c`` ranks holds ``c = s/N_c`` tokens of Q, K and V, shape ``(b, c, a, d)``
(K/V: ``a_kv`` heads, GQA), in the layout's order (:func:`lesson10.spmd.shard_sequence`).
Forward: one all-gather of K and one of V along the sequence (every rank then holds the
compact K/V of all ``s`` tokens, in rank order), then attention of the local queries
against all keys with the global positions, so a causal mask and a document mask
(``doc_ids``: the document of every global position) are applied directly.

Backward: the local kernel gives ``dQ`` for the local queries and ``dK``/``dV`` for all
``s`` keys; a reduce-scatter sums them over the ranks and leaves each rank the rows of
its own tokens.

Bytes per rank: forward ``(N_c-1)/N_c * 2 s h e / g`` (:func:`lesson10.cost.comm_bytes`
with ``"allgather"``), recorded as ``"all_gather"``; backward the same amount as
``"reduce_scatter"`` (of dK, dV: accumulated in float32 for low-precision inputs).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from ..layouts import layout_name, shard_positions
from . import comm
from .attention import _check_float, check_doc_ids, local_attention, local_attention_backward

__all__ = ["allgather_attention", "AllGatherAttention"]


def _acc_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


class AllGatherAttention(torch.autograd.Function):
    """``out = allgather_attention(q, k, v)``: all-gather K/V, attend, reduce-scatter dK/dV."""

    @staticmethod
    def forward(ctx, q, k, v, causal, q_pos, k_pos, doc_ids, group, scale, impl):
        k_all = comm.all_gather(k, dim=1, group=group)          # (b, s, a_kv, d), rank order
        v_all = comm.all_gather(v, dim=1, group=group)
        out, lse = local_attention(q, k_all, v_all, causal=causal, q_pos=q_pos, k_pos=k_pos,
                                   scale=scale, impl=impl, doc_ids=doc_ids)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k_all, v_all, out, lse)
        ctx.cfg = (causal, q_pos, k_pos, doc_ids, group, scale, impl)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k_all, v_all, out, lse = ctx.saved_tensors
        causal, q_pos, k_pos, doc_ids, group, scale, impl = ctx.cfg
        dq, dk_all, dv_all = local_attention_backward(
            dout.contiguous(), q, k_all, v_all, out, lse, causal=causal, q_pos=q_pos,
            k_pos=k_pos, scale=scale, impl=impl, doc_ids=doc_ids)
        acc = _acc_dtype(q.dtype)
        dk = comm.reduce_scatter(dk_all.to(acc), dim=1, group=group)   # this rank's rows
        dv = comm.reduce_scatter(dv_all.to(acc), dim=1, group=group)
        return (dq.to(q.dtype), dk.to(k_all.dtype), dv.to(v_all.dtype),
                None, None, None, None, None, None, None)


def allgather_attention(q, k, v, causal: bool = True, layout: str = "zigzag", group=None,
                        doc_ids=None, *, scale=None, impl: str = "auto"):
    """Exact attention over the whole sequence from local shards, by an all-gather of K/V.

    ``q``: ``(b, c, a, d)``, ``k``/``v``: ``(b, c, a_kv, d)``, this rank's ``c = s/N_c``
    tokens in ``layout`` order (``"zigzag"``, ``"contiguous"`` or ``"striped"``).
    ``doc_ids``: optional document of every global position (length ``s``, same on every
    rank). Returns this rank's output ``(b, c, a, d)``; differentiable in ``q``, ``k``, ``v``.
    It first compares the shard shapes of all ranks (a tiny all-gather, ``"metadata"``
    bytes), so mismatched shards give a ValueError on every rank instead of a hang.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("allgather_attention runs inside a rank: use lesson10.spmd.launch or "
                           "torchrun")
    _check_float(q=q, k=k, v=v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be a local shard of shape (b, s/N_c, a, d), got "
                             f"{tuple(t.shape)}")
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)} must agree "
                         f"in batch, local tokens and head dim (only the head count may differ)")
    if k.shape[2] == 0 or q.shape[2] % k.shape[2]:
        raise ValueError(f"the number of query heads ({q.shape[2]}) must be a multiple of the "
                         f"number of K/V heads ({k.shape[2]}) (GQA)")
    n, r = comm.group_size(group), comm.group_rank(group)
    comm.check_same_shape(q, group, "allgather_attention: q")
    comm.check_same_shape(k, group, "allgather_attention: k")
    s = n * q.shape[1]
    pos = shard_positions(s, n, layout_name(layout))                   # clear ValueError for bad s / layout
    q_pos = torch.as_tensor(pos[r], dtype=torch.long, device=q.device)
    k_pos = torch.as_tensor(np.concatenate(pos), dtype=torch.long, device=q.device)
    doc = check_doc_ids(doc_ids, s, q.device, "allgather_attention")
    return AllGatherAttention.apply(q, k, v, bool(causal), q_pos, k_pos, doc, group, scale, impl)
