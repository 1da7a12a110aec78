"""Reference attention that also returns the logsumexp, and the exact merge.

``attention`` computes, per query ``i`` and head, over its *visible* keys ``j``:

    x_ij = q_i . k_j / sqrt(d),   lse_i = log sum_j exp(x_ij),   o_i = sum_j exp(x_ij - lse_i) v_j

With ``causal=True`` key ``j`` is visible to query ``i`` when ``k_pos[j] <= q_pos[i]``
(global token ids, so any layout works). With a document mask ``doc_ids`` (the
document of every global position, packed sequences) it must also be in the same
document: ``doc_ids[k_pos[j]] == doc_ids[q_pos[i]]``. A query that sees no key gets
``o = 0`` and ``lse = -inf``: the neutral element of :func:`merge`.

GQA: ``k`` and ``v`` may have ``a_kv`` heads with ``a % a_kv == 0``; query head
``i`` uses K/V head ``i // g`` with ``g = a / a_kv``.
"""
from __future__ import annotations

import numpy as np

from ..layouts import kernel_mask, visible  # the one visibility mask, re-exported
from .validate import check_doc_ids, check_token_positions, real_finite

__all__ = ["attention", "merge", "visible", "check_doc_ids"]


def attention(q, k, v, causal: bool = False, q_pos=None, k_pos=None, doc_ids=None):
    """Softmax attention with its logsumexp.

    Shapes: ``q (s_q, a, d)``, ``k (s_k, a_kv, d)``, ``v (s_k, a_kv, d_v)``.
    Returns ``(out, lse)`` with ``out (s_q, a, d_v)`` and ``lse (s_q, a)``.
    Scale ``1/sqrt(d)``. Positions default to ``0..s_q-1`` and ``0..s_k-1``; they only
    matter for the causal mask ``k_pos[j] <= q_pos[i]`` and the document mask: with
    ``doc_ids`` (one integer per global position, see :func:`visible`) a query sees only keys
    of its own document.
    """
    q, k, v = (real_finite(t, nm) for t, nm in ((q, "q"), (k, "k"), (v, "v")))
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ValueError(f"q, k, v must be (tokens, heads, head_dim); got shapes {q.shape}, {k.shape}, {v.shape}")
    s_q, a, d = q.shape
    s_k, a_kv, d_k = k.shape
    if d_k != d:
        raise ValueError(f"q and k need the same head dim, got {d} and {d_k}")
    if d == 0:
        raise ValueError("the head dim d is 0: attention needs d >= 1")
    if v.shape[:2] != (s_k, a_kv):
        raise ValueError(f"v must match k in tokens and heads: k {k.shape}, v {v.shape}")
    if a_kv == 0 or a % a_kv:
        raise ValueError(f"the number of query heads ({a}) must be a multiple of the number of "
                         f"K/V heads ({a_kv}) (GQA group size g = a / a_kv)")
    g = a // a_kv
    d_v = v.shape[2]
    qp, kp = check_token_positions(q_pos, s_q, "q_pos"), check_token_positions(k_pos, s_k, "k_pos")
    if doc_ids is not None:
        doc_ids = check_doc_ids(doc_ids, where="attention")

    # scores[h, j, i, t]: K/V head h, query head h*g + j, query i, key t
    # contiguous per-head matrices, so that matmul can hand them to BLAS
    qg = np.ascontiguousarray(q.reshape(s_q, a_kv, g, d).transpose(1, 2, 0, 3))  # (a_kv, g, s_q, d)
    kt = np.ascontiguousarray(k.transpose(1, 2, 0))[:, None]                      # (a_kv, 1, d, s_k)
    scores = qg @ kt                                             # (a_kv, g, s_q, s_k)
    scores *= 1.0 / np.sqrt(d)
    if causal or doc_ids is not None:
        hidden = ~kernel_mask(qp, kp, causal, doc_ids)               # (s_q, s_k)
        scores[..., hidden] = -np.inf
    if s_k == 0:
        m = np.full(scores.shape[:-1] + (1,), -np.inf)
    else:
        m = scores.max(axis=-1, keepdims=True)                   # -inf: no visible key
    m_safe = np.where(np.isfinite(m), m, 0.0)
    scores -= m_safe
    p = np.exp(scores, out=scores)                               # exp(-inf) = 0, no warning
    l = p.sum(axis=-1)                                           # (a_kv, g, s_q)
    seen = l > 0
    l_safe = np.where(seen, l, 1.0)
    lse = np.where(seen, m_safe[..., 0] + np.log(l_safe), -np.inf)
    vt = np.ascontiguousarray(v.transpose(1, 0, 2))[:, None]                      # (a_kv, 1, s_k, d_v)
    out = (p @ vt) / l_safe[..., None]                                            # (a_kv, g, s_q, d_v)
    return out.transpose(2, 0, 1, 3).reshape(s_q, a, d_v), lse.transpose(2, 0, 1).reshape(s_q, a)


def merge(o1, lse1, o2, lse2):
    """Combine the attention of the same queries over two disjoint key sets A and B.

    ``lse = log(exp(lse1) + exp(lse2))``, ``o = exp(lse1 - lse) o1 + exp(lse2 - lse) o2``,
    computed with the larger lse subtracted first. Exact, associative and commutative;
    ``lse = -inf`` (no key seen) is neutral, and two ``-inf`` give ``o = 0, lse = -inf``.
    Shapes: ``o (s, a, d)``, ``lse (s, a)``.
    """
    o1, o2 = real_finite(o1, "o1"), real_finite(o2, "o2")
    lse1, lse2 = np.asarray(lse1), np.asarray(lse2)
    if o1.shape != o2.shape or lse1.shape != lse2.shape or o1.ndim == 0 or o1.shape[:-1] != lse1.shape:
        raise ValueError(f"merge needs o (s, a, d) and lse (s, a) of the same shapes; got "
                         f"o1 {o1.shape}, lse1 {lse1.shape}, o2 {o2.shape}, lse2 {lse2.shape}")
    for name, lse in (("lse1", lse1), ("lse2", lse2)):
        if lse.dtype.kind not in "biuf" or np.isnan(lse).any() or (lse == np.inf).any():
            raise ValueError(f"{name} must hold real numbers or -inf (no key seen); NaN and +inf "
                             f"are not a logsumexp")
    m = np.maximum(lse1, lse2)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    w1, w2 = np.exp(lse1 - m_safe), np.exp(lse2 - m_safe)      # in [0, 1]
    total = w1 + w2
    seen = total > 0
    t_safe = np.where(seen, total, 1.0)
    lse = np.where(seen, m_safe + np.log(t_safe), -np.inf)
    o = (w1 / t_safe)[..., None] * o1 + (w2 / t_safe)[..., None] * o2
    return o, lse
