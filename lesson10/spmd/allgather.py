"""All-gather context parallelism (Llama 3) on torch.distributed, forward and backward.

Each of the ``N_c`` ranks holds ``c = s/N_c`` tokens of Q, K and V, shape ``(b, c, a, d)``
(K/V: ``a_kv`` heads, GQA), in the layout's order (:func:`lesson10.spmd.shard_sequence`).
Forward: one all-gather of K and one of V along the sequence (every rank then holds the
compact K/V of all ``s`` tokens; they are put in token order), then attention of the
local queries against all keys with the global positions, so a causal mask and a
document mask (``doc_ids``: the document of every global position) are applied
directly. With a causal mask and the zig-zag or contiguous layout the local queries are
one or two runs of consecutive tokens, and each run is a full block against the keys
before it plus a causal diagonal block: the fused kernel's shapes (the same trick as the
ring's ``ring_blocks``); other masks take the einsum path.

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
from .attention import (_check_float, check_doc_ids, local_attention, local_attention_backward,
                        merge)

__all__ = ["allgather_attention", "AllGatherAttention"]


def _acc_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _blocks(q_pos, causal: bool, doc_ids):
    """The local attention as blocks ``(q_slice, k_slice, kwargs)`` against K/V in natural
    token order. A causal mask on runs of consecutive queries (at most 2: contiguous,
    zig-zag) becomes, per run ``p0 .. p0+m-1``, a full block against keys ``0 .. p0-1`` and
    a causal diagonal block against ``p0 .. p0+m-1``: both shapes the fused kernel takes.
    Otherwise (document mask, striped) one block with the mask from global positions."""
    c = q_pos.numel()
    s_all = slice(None)
    if not causal and doc_ids is None:
        return [(s_all, s_all, {"causal": False})]
    cuts = [0] + (torch.nonzero(q_pos[1:] != q_pos[:-1] + 1).flatten() + 1).tolist() + [c]
    if doc_ids is None and len(cuts) <= 3:
        out = []
        for i0, i1 in zip(cuts, cuts[1:]):
            p0 = int(q_pos[i0])
            if p0:
                out.append((slice(i0, i1), slice(0, p0), {"causal": False}))
            out.append((slice(i0, i1), slice(p0, p0 + i1 - i0), {"causal": True}))
        return out
    return [(s_all, s_all, {"causal": causal, "q_pos": q_pos, "doc_ids": doc_ids})]


class AllGatherAttention(torch.autograd.Function):
    """``out = allgather_attention(q, k, v)``: all-gather K/V, attend, reduce-scatter dK/dV."""

    @staticmethod
    def forward(ctx, q, k, v, causal, q_pos, k_pos, doc_ids, group, scale, impl):
        natural = torch.argsort(k_pos)                            # gathered row of token t
        k_nat = comm.all_gather(k, dim=1, group=group)[:, natural]  # (b, s, a_kv, d), in order
        v_nat = comm.all_gather(v, dim=1, group=group)[:, natural]
        blocks = _blocks(q_pos, causal, doc_ids)
        acc = _acc_dtype(q.dtype)
        out = lse = None
        for qs, ks, kw in blocks:
            if "q_pos" in kw:
                kw = dict(kw, k_pos=torch.arange(k_nat.shape[1], device=q.device))
            o_b, l_b = local_attention(q[:, qs], k_nat[:, ks], v_nat[:, ks], scale=scale,
                                       impl=impl, **kw)
            if out is None:
                out = torch.zeros(q.shape[:3] + (v.shape[3],), dtype=acc, device=q.device)
                lse = torch.full((q.shape[0], q.shape[2], q.shape[1]), float("-inf"), dtype=acc,
                                 device=q.device)
            o_m, l_m = merge(out[:, qs], lse[:, :, qs].transpose(1, 2), o_b, l_b.transpose(1, 2))
            out[:, qs] = o_m
            lse[:, :, qs] = l_m.transpose(1, 2)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k_nat, v_nat, out, lse)
        ctx.cfg = (blocks, k_pos, group, scale, impl)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k_nat, v_nat, out, lse = ctx.saved_tensors
        blocks, k_pos, group, scale, impl = ctx.cfg
        acc = _acc_dtype(q.dtype)
        dout = dout.contiguous()
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        dk = torch.zeros(k_nat.shape, dtype=acc, device=q.device)
        dv = torch.zeros(v_nat.shape, dtype=acc, device=q.device)
        for qs, ks, kw in blocks:
            if "q_pos" in kw:
                kw = dict(kw, k_pos=torch.arange(k_nat.shape[1], device=q.device))
            g_q, g_k, g_v = local_attention_backward(
                dout[:, qs], q[:, qs], k_nat[:, ks], v_nat[:, ks], out[:, qs], lse[:, :, qs],
                scale=scale, impl=impl, **kw)
            dq[:, qs] += g_q
            dk[:, ks] += g_k
            dv[:, ks] += g_v
        # back to rank order (row j of the gather is token k_pos[j]), then each rank's rows
        dk = comm.reduce_scatter(dk[:, k_pos], dim=1, group=group)
        dv = comm.reduce_scatter(dv[:, k_pos], dim=1, group=group)
        return (dq.to(q.dtype), dk.to(k_nat.dtype), dv.to(v_nat.dtype),
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
