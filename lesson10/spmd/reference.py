"""The one-process reference of every real attention method: attention with the lse, by einsum.

Shapes (the ``dist`` convention): ``q`` ``(b, s_q, a, d)``, ``k`` and ``v`` ``(b, s_k, a_kv, d)``
(GQA: ``g = a / a_kv`` query heads share a K/V head). With ``x_ij = q_i . k_j * scale``::

    lse_i = log sum_j exp(x_ij),   out_i = sum_j exp(x_ij - lse_i) v_j

over the keys ``j`` that query ``i`` may see (:func:`visible`). A query that sees no key gets
``lse = -inf`` and ``out = 0``, never NaN. Differentiable by autograd: the tests compare every
method's output and gradients with it. It is also the einsum path of
:func:`lesson10.spmd.attention.local_attention`, for masks a fused kernel cannot express.
"""
from __future__ import annotations

import math

import torch

from .validate import check_doc_ids, check_positions, check_qkv

__all__ = ["attention", "visible"]


def visible(q_pos, k_pos, causal: bool = False, doc_ids=None, device=None):
    """Boolean ``(s_q, s_k)`` mask, True where query ``i`` may see key ``j`` (``None`` = all):
    ``k_pos[j] <= q_pos[i]`` when causal, and ``doc_ids[k_pos[j]] == doc_ids[q_pos[i]]`` with a
    document mask (``doc_ids``: the document of every global position, length ``s``). The
    torch form of :func:`lesson10.layouts.visible` (same arguments, same rule)."""
    if not causal and doc_ids is None:
        return None
    q_pos = torch.as_tensor(q_pos, device=device)
    k_pos = torch.as_tensor(k_pos, device=device)
    mask = torch.ones(q_pos.shape[0], k_pos.shape[0], dtype=torch.bool, device=q_pos.device)
    if causal:
        mask &= k_pos[None, :] <= q_pos[:, None]
    if doc_ids is not None:
        doc = check_doc_ids(doc_ids, device=q_pos.device)
        for name, pos in (("q_pos", q_pos), ("k_pos", k_pos)):
            if pos.numel() and (int(pos.min()) < 0 or int(pos.max()) >= doc.shape[0]):
                raise ValueError(f"{name} holds token ids outside 0..{doc.shape[0] - 1}, the "
                                 f"positions that doc_ids describes")
        mask &= doc[k_pos][None, :] == doc[q_pos][:, None]
    return mask


def attention(q, k, v, causal: bool = False, q_pos=None, k_pos=None, scale=None, doc_ids=None):
    """Reference attention with lse, written with einsum (differentiable by autograd).

    Returns ``(out, lse)`` of shapes ``(b, s_q, a, d)`` and ``(b, s_q, a)``; masked-out
    queries get ``out = 0`` and ``lse = -inf``. GQA: K/V heads are repeated ``g`` times.
    ``doc_ids``: document mask (see :func:`visible`), indexed by the global positions.
    """
    g = check_qkv(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if g > 1:
        k = k.repeat_interleave(g, dim=2)
        v = v.repeat_interleave(g, dim=2)
    x = torch.einsum("bqad,bkad->baqk", q, k) * scale          # (b, a, s_q, s_k)
    mask = None
    if causal or doc_ids is not None:
        qp, kp = check_positions(q_pos, k_pos, q.shape[1], k.shape[1], q.device)
        mask = visible(qp, kp, causal, doc_ids=doc_ids)        # (s_q, s_k)
    if mask is None:
        lse = torch.logsumexp(x, dim=-1)                       # (b, a, s_q)
        p = torch.exp(x - lse[..., None])
    else:
        seen = mask.any(-1)[:, None]                           # query sees >= 1 key
        # rows that see no key are computed on zeros and then dropped: no -inf - -inf,
        # so neither the forward nor autograd's backward can produce a NaN
        x = torch.where(seen, x.masked_fill(~mask, float("-inf")), torch.zeros_like(x))
        lse = torch.logsumexp(x, dim=-1)
        p = torch.exp(x - lse[..., None]) * mask
        lse = torch.where(seen[:, 0], lse, torch.full_like(lse, float("-inf")))
    out = torch.einsum("baqk,bkad->bqad", p, v)
    return out, lse.transpose(1, 2)
