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
ring's, from :func:`lesson10.layouts.block_plan`); other masks take the einsum path.

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

from ..layouts import block_plan
from . import comm
from .attention import acc_dtype, attend_blocks, attend_blocks_backward, block_kwargs
from .shard import layout_positions
from .validate import check_doc_ids, check_local_qkv, require_rank

__all__ = ["allgather_attention", "AllGatherAttention"]


class AllGatherAttention(torch.autograd.Function):
    """``out = allgather_attention(q, k, v)``: all-gather K/V, attend, reduce-scatter dK/dV."""

    @staticmethod
    def forward(ctx, q, k, v, causal, q_pos, k_pos, doc_ids, group, scale, impl):
        natural = torch.argsort(k_pos)                            # gathered row of token t
        k_nat = comm.all_gather(k, dim=1, group=group)[:, natural]  # (b, s, a_kv, d), in order
        v_nat = comm.all_gather(v, dim=1, group=group)[:, natural]
        tokens = torch.arange(k_nat.shape[1], device=q.device)
        doc_np = None if doc_ids is None else doc_ids.cpu().numpy()
        blocks = [(blk, block_kwargs(blk, q_pos, tokens, causal, doc_ids))
                  for blk in block_plan(q_pos.cpu().numpy(), tokens.cpu().numpy(), causal, doc_np)]
        out, lse = attend_blocks(q, k_nat, v_nat, blocks, scale, impl)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k_nat, v_nat, out, lse)
        ctx.cfg = (blocks, k_pos, group, scale, impl)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k_nat, v_nat, out, lse = ctx.saved_tensors
        blocks, k_pos, group, scale, impl = ctx.cfg
        dq = torch.zeros(q.shape, dtype=acc_dtype(q.dtype), device=q.device)
        dk, dv = attend_blocks_backward(dout.contiguous(), q, k_nat, v_nat, out, lse, blocks, dq,
                                        scale, impl)
        # back to rank order (row j of the gather is token k_pos[j]), then each rank's rows
        dk = comm.reduce_scatter(dk[:, k_pos], dim=1, group=group)
        dv = comm.reduce_scatter(dv[:, k_pos], dim=1, group=group)
        return (dq.to(q.dtype), dk.to(k_nat.dtype), dv.to(v_nat.dtype),
                None, None, None, None, None, None, None)


def allgather_attention(q, k, v, causal: bool = True, layout="zigzag", group=None, *,
                        doc_ids=None, scale=None, impl: str = "auto"):
    """Exact attention over the whole sequence from local shards, by an all-gather of K/V.

    ``q``: ``(b, c, a, d)``, ``k``/``v``: ``(b, c, a_kv, d)``, this rank's ``c = s/N_c``
    tokens in ``layout`` order: a layout name (``"zigzag"``, ``"contiguous"``, ``"striped"``)
    or this rank's positions (the global token ids of its local tokens, in order).
    ``doc_ids``: optional document of every global position (length ``s``, same on every
    rank). Returns this rank's output ``(b, c, a, d)``; differentiable in ``q``, ``k``, ``v``.
    It first compares the shard shapes of all ranks (a tiny all-gather, ``"metadata"``
    bytes), so mismatched shards give a ValueError on every rank instead of a hang.
    """
    require_rank("allgather_attention")
    check_local_qkv(q, k, v, "allgather_attention")
    n, r = comm.group_size(group), comm.group_rank(group)
    comm.check_same_shape(q, group, "allgather_attention: q")
    comm.check_same_shape(k, group, "allgather_attention: k")
    pos = layout_positions(layout, q.shape[1], group, q.device)
    q_pos = torch.as_tensor(pos[r], dtype=torch.long, device=q.device)
    k_pos = torch.as_tensor(np.concatenate(pos), dtype=torch.long, device=q.device)
    doc = check_doc_ids(doc_ids, n * q.shape[1], q.device, "allgather_attention")
    return AllGatherAttention.apply(q, k, v, bool(causal), q_pos, k_pos, doc, group, scale, impl)
