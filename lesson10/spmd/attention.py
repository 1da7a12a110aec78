"""The local kernel of every real attention method: attention with the lse, and the merge.

Shapes (the ``dist`` convention): ``q`` is ``(b, s_q, a, d)``, ``k`` and ``v`` are
``(b, s_k, a_kv, d)`` with ``a % a_kv == 0`` (GQA: ``g = a / a_kv`` query heads share
one K/V head). Outputs: ``out`` ``(b, s_q, a, d)`` and ``lse`` ``(b, a, s_q)`` (the kernels'
layout):

    x_ij = q_i . k_j * scale,   lse_i = log sum_j exp(x_ij),   out_i = sum_j exp(x_ij - lse_i) v_j

over the keys ``j`` that query ``i`` may see. With ``causal=True`` query ``i`` sees key
``j`` when ``k_pos[j] <= q_pos[i]`` (global token positions; default ``0..s-1``), so
any layout is exact. A query that sees no key gets ``lse = -inf`` and ``out = 0``
(never NaN): that is the neutral element of :func:`merge`.

* :func:`local_attention` / :func:`local_attention_backward`: one block, no autograd; a
  fused kernel that returns the lse (CPU: ``aten._scaled_dot_product_flash_attention_for_cpu``
  and its backward; CUDA: the memory-efficient SDPA kernel), and the einsum path of
  :func:`lesson10.spmd.reference.attention` for masks a kernel cannot express;
* :func:`attend_blocks` / :func:`attend_blocks_backward`: the blocks of a
  :func:`lesson10.layouts.block_plan` merged into one ``(out, lse)`` (the ring per round,
  all-gather and Ulysses once), and :class:`BlockAttention`, the same with autograd.

The reference (:func:`attention`, :func:`visible`, from :mod:`.reference`) is importable
from here too; the checks of the inputs are in :mod:`.validate`.
"""
from __future__ import annotations

import math

import torch

from .reference import attention, visible
from .validate import check_float, check_impl, check_positions, check_qkv

__all__ = ["attention", "visible", "merge", "local_attention", "local_attention_backward",
           "merge_block", "block_kwargs", "acc_dtype", "attend_blocks", "attend_blocks_backward",
           "BlockAttention"]


def merge(o1, lse1, o2, lse2):
    """Merge two partial attentions over disjoint key sets (the lse formula).

    ``lse = log(e^lse1 + e^lse2)``, ``o = e^(lse1-lse) o1 + e^(lse2-lse) o2``. ``o``:
    ``(..., s, a, d)``, ``lse``: ``(..., s, a)``. Computed in float32 (float64 if an
    input is float64) after subtracting ``max(lse1, lse2)``, so nothing overflows; a
    side with ``lse = -inf`` (no key) gets weight 0 and two such sides give
    ``(0, -inf)``, never NaN. Returns ``(o, lse)`` in that float type.
    """
    for name, t in (("o1", o1), ("lse1", lse1), ("o2", o2), ("lse2", lse2)):
        check_float(**{name: t})
    if o1.shape != o2.shape or lse1.shape != lse2.shape or o1.shape[:-1] != lse1.shape:
        raise ValueError(f"merge needs o (..., s, a, d) and lse (..., s, a) of matching shapes; got "
                         f"o1 {tuple(o1.shape)}, lse1 {tuple(lse1.shape)}, o2 {tuple(o2.shape)}, "
                         f"lse2 {tuple(lse2.shape)} (local_attention returns lse as (b, a, s): "
                         f"transpose it)")
    ft = torch.float64 if torch.float64 in (o1.dtype, o2.dtype, lse1.dtype, lse2.dtype) else torch.float32
    o1, o2, lse1, lse2 = (t.to(ft) for t in (o1, o2, lse1, lse2))
    m = torch.maximum(lse1, lse2)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # both -inf: any finite shift
    e1, e2 = torch.exp(lse1 - m), torch.exp(lse2 - m)           # in [0, 1], one of them is 1
    tot = e1 + e2
    lse = m + torch.log(tot)                                     # -inf when both are empty
    inv = torch.where(tot > 0, 1.0 / torch.where(tot > 0, tot, torch.ones_like(tot)), torch.zeros_like(tot))
    o = (e1 * inv)[..., None] * o1 + (e2 * inv)[..., None] * o2
    return o, lse


def acc_dtype(dtype):
    """The accumulation dtype of a blockwise method: float64 for float64, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def merge_block(out, lse, rows, o_b, l_b) -> None:
    """Merge one block's ``(o_b, l_b)`` into the running ``out`` ``(b, s, a, d)`` and ``lse``
    ``(b, a, s)`` (the kernels' layout) at the query ``rows`` (a slice), in place: the lse
    formula of :func:`merge` (the same operations, so the same numbers), written straight
    into the views ``out[:, rows]`` and ``lse[:, :, rows]`` without a merged copy."""
    lo = lse[:, :, rows]                                         # (b, a, r), a view
    l_b = l_b.to(lse.dtype)
    m = torch.maximum(lo, l_b)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))   # both -inf: any finite shift
    e1, e2 = torch.exp(lo - m), torch.exp(l_b - m)
    tot = e1 + e2
    inv = torch.where(tot > 0, 1.0 / torch.where(tot > 0, tot, torch.ones_like(tot)), torch.zeros_like(tot))
    lo.copy_(m + torch.log(tot))                                 # -inf when both are empty
    w1, w2 = ((e * inv).transpose(1, 2)[..., None] for e in (e1, e2))   # (b, r, a, 1)
    out[:, rows].mul_(w1).add_(w2 * o_b.to(out.dtype))


def block_kwargs(block, q_pos, k_pos, causal: bool, doc_ids=None) -> dict:
    """The mask arguments of :func:`local_attention` for one
    :class:`lesson10.layouts.Block`: none, the kernel's causal mask, or the global
    positions of its rows (``q_pos``, ``k_pos``: int64 tensors of the whole local blocks)."""
    if block.mask == "none":
        return {"causal": False}
    if block.mask == "causal":
        return {"causal": True}
    return {"causal": causal, "q_pos": q_pos[block.q], "k_pos": k_pos[block.k], "doc_ids": doc_ids}


# ------------------------------------------------------------------- fast local path
def _cpu_kernel_ok(q):
    return q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64, torch.bfloat16)


_CUDA_VERIFIED: dict = {}


def _cuda_kernel_ok(q):
    """CUDA: use the memory-efficient SDPA kernel only after a one-time self-check per
    dtype (forward, lse and backward against the einsum path on a tiny case); if the
    private op is missing or disagrees in this PyTorch version, stay on einsum."""
    if q.device.type != "cuda" or q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return False
    key = (q.device.index, q.dtype)
    if key not in _CUDA_VERIFIED:
        try:
            _CUDA_VERIFIED[key] = all(_kernel_agrees(q.device, q.dtype, causal)
                                      for causal in (False, True))
        except Exception:  # noqa: BLE001 - any failure means: use the einsum path
            _CUDA_VERIFIED[key] = False
        if not _CUDA_VERIFIED[key]:
            import warnings
            warnings.warn(f"fused CUDA attention kernel not usable for {q.dtype}; using einsum",
                          stacklevel=3)
    return _CUDA_VERIFIED[key]


def _kernel_agrees(device, dtype, causal: bool) -> bool:
    """The fused kernel's forward, lse and backward equal the einsum path's on a tiny GQA case."""
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v, dout = (torch.randn(1, 40, 4 if i in (0, 3) else 2, 16, device=device, generator=g)
                     for i in range(4))
    low = [x.to(dtype) for x in (q, k, v, dout)]
    wide = [x.float() for x in low]
    o_k, l_k = local_attention(low[0], low[1], low[2], causal=causal, impl="kernel")
    o_e, l_e = local_attention(wide[0], wide[1], wide[2], causal=causal, impl="einsum")
    g_k = local_attention_backward(low[3], low[0], low[1], low[2], o_k, l_k, causal=causal,
                                   impl="kernel")
    g_e = local_attention_backward(wide[3], wide[0], wide[1], wide[2], o_e, l_e, causal=causal,
                                   impl="einsum")
    tol = 1e-3 if dtype == torch.float32 else 5e-2
    pairs = [(o_k, o_e), (l_k, l_e), *zip(g_k, g_e)]
    return all(torch.allclose(a.float(), b.float(), atol=tol, rtol=tol) for a, b in pairs)


def _kernel_mask_kind(causal, q_pos, k_pos, s_q, s_k, device, doc_ids=None):
    """``False``/``True``: the mask is none / "key index <= query index" (top-left causal,
    s_q == s_k); ``None``: the kernel cannot express it (e.g. a document mask)."""
    if doc_ids is not None:
        return None
    if not causal:
        return False
    if s_q != s_k:
        return None
    if q_pos is None and k_pos is None:
        return True
    qp, kp = check_positions(q_pos, k_pos, s_q, s_k, device)
    # positions strictly increasing and equal for q and k => masks coincide
    if torch.equal(qp, kp) and bool((qp[1:] > qp[:-1]).all()):
        return True
    return None


def _choose_impl(impl, kind, q, k) -> str:
    """``"kernel"`` or ``"einsum"``: ``auto`` takes the fused kernel when it can express the
    mask (``kind``) on this device and dtype."""
    impl = check_impl(impl, q, k)
    if impl == "auto":
        return "kernel" if kind is not None and (_cpu_kernel_ok(q) or _cuda_kernel_ok(q)) else "einsum"
    if impl == "kernel" and kind is None:
        raise ValueError("impl='kernel' cannot express this mask; use impl='einsum' or 'auto'")
    return impl


def local_attention(q, k, v, causal: bool = False, q_pos=None, k_pos=None, scale=None, impl="auto",
                    doc_ids=None):
    """Fast attention with lse, no autograd: ``(out, lse)``, ``lse`` as ``(b, a, s_q)``.

    Note the lse layout ``(b, a, s_q)`` (the kernels' own, contiguous), unlike
    :func:`attention`. ``impl``: ``"auto"`` (kernel when it can express the mask and
    dtype, else einsum), ``"kernel"`` or ``"einsum"``. GQA K/V are passed compact (the
    CPU kernel reads shared heads itself; on CUDA they are repeated here). ``doc_ids``: a
    document mask over the global positions (einsum path).
    """
    g = check_qkv(q, k, v)
    s_q, s_k = q.shape[1], k.shape[1]
    kind = _kernel_mask_kind(causal, q_pos, k_pos, s_q, s_k, q.device, doc_ids)
    use = _choose_impl(impl, kind, q, k)
    if use == "kernel":
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if q.device.type == "cpu":
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                qt, kt, vt, 0.0, kind, scale=scale)
        else:  # CUDA, untested here (no GPU in CI): memory-efficient kernel returns the lse
            if g > 1:
                kt, vt = kt.repeat_interleave(g, dim=1), vt.repeat_interleave(g, dim=1)
            out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
                qt, kt, vt, None, True, 0.0, kind, scale=scale)[:2]
            lse = lse[..., :s_q].contiguous()
        return out.transpose(1, 2), lse
    out, lse = attention(q, k, v, causal=causal, q_pos=q_pos, k_pos=k_pos, scale=scale,
                         doc_ids=doc_ids)
    return out, lse.transpose(1, 2).contiguous()


def _kernel_backward(dout, q, k, v, out, lse, kind, scale, g: int):
    """The fused kernel's backward of one block (CPU flash; CUDA memory-efficient SDPA, with
    GQA K/V repeated and their gradients summed back)."""
    s_q, s_k = q.shape[1], k.shape[1]
    dot, qt, kt, vt, ot = (t.transpose(1, 2) for t in (dout, q, k, v, out))
    if q.device.type == "cpu":
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dot, qt, kt, vt, ot, lse.contiguous(), 0.0, kind, scale=scale)
    else:  # CUDA, untested here
        if g > 1:
            kt, vt = kt.repeat_interleave(g, dim=1), vt.repeat_interleave(g, dim=1)
        pad = (-s_q) % 32
        lse_p = torch.nn.functional.pad(lse, (0, pad)) if pad else lse
        zero = torch.zeros((), dtype=torch.int64, device=q.device)
        dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            dot.contiguous(), qt, kt, vt, None, ot, lse_p.contiguous(), zero, zero, 0.0,
            [True, True, True, False], kind, scale=scale)
        if g > 1:
            b, a, _, d = dk.shape
            dk = dk.view(b, a // g, g, s_k, d).sum(2)
            dv = dv.view(b, a // g, g, s_k, d).sum(2)
    return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


def local_attention_backward(dout, q, k, v, out, lse, causal: bool = False, q_pos=None, k_pos=None,
                             scale=None, impl="auto", doc_ids=None):
    """Gradients ``(dq, dk, dv)`` of one attention block, recomputed from ``(out, lse)``.

    ``out``/``lse`` may be the *final* output and lse of the queries (over all keys,
    not only this block's): with ``P = exp(x - lse)`` and ``D_i = sum_d dout_i out_i``,
    ``dV = P^T dout``, ``dS = P * (dout V^T - D)``, ``dQ = dS K scale``,
    ``dK = dS^T Q scale`` is then this block's exact share of the full gradient (that
    is how ring attention's backward works). ``lse``: ``(b, a, s_q)``. GQA: ``dk``,
    ``dv`` are summed over the ``g`` query heads that share a K/V head.
    """
    g = check_qkv(q, k, v)
    for name, t in (("dout", dout), ("out", out)):
        check_float(**{name: t})
    s_q, s_k = q.shape[1], k.shape[1]
    if dout.shape != q.shape or out.shape != q.shape:
        raise ValueError(f"dout {tuple(dout.shape)} and out {tuple(out.shape)} must have the shape "
                         f"of q {tuple(q.shape)}")
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (q.shape[0], q.shape[2], s_q):
        raise ValueError(f"lse must be (b, a, s_q) = {(q.shape[0], q.shape[2], s_q)} as returned by "
                         f"local_attention, got {tuple(getattr(lse, 'shape', ()))}")
    kind = _kernel_mask_kind(causal, q_pos, k_pos, s_q, s_k, q.device, doc_ids)
    scale_v = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if _choose_impl(impl, kind, q, k) == "kernel":
        return _kernel_backward(dout, q, k, v, out, lse, kind, scale, g)
    # einsum path
    if g > 1:
        k = k.repeat_interleave(g, dim=2)
        v = v.repeat_interleave(g, dim=2)
    x = torch.einsum("bqad,bkad->baqk", q, k) * scale_v
    if causal or doc_ids is not None:
        qp, kp = check_positions(q_pos, k_pos, s_q, s_k, q.device)
        x = x.masked_fill(~visible(qp, kp, causal, doc_ids=doc_ids), float("-inf"))
    lse_safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse)).to(x.dtype)
    p = torch.exp(x - lse_safe[..., None])                       # (b, a, s_q, s_k)
    dv = torch.einsum("baqk,bqad->bkad", p, dout)
    dp = torch.einsum("bqad,bkad->baqk", dout, v)
    dsum = (dout * out).sum(-1).transpose(1, 2)                  # D: (b, a, s_q)
    ds = p * (dp - dsum[..., None]) * scale_v
    dq = torch.einsum("baqk,bkad->bqad", ds, k)
    dk = torch.einsum("baqk,bqad->bkad", ds, q)
    if g > 1:
        b, _, a, d = dk.shape
        dk = dk.view(b, s_k, a // g, g, d).sum(3)
        dv = dv.view(b, s_k, a // g, g, d).sum(3)
    return dq, dk, dv


# ------------------------------------------------------------- blocks of one plan
def attend_blocks(q, k, v, blocks, scale=None, impl: str = "auto", out=None, lse=None):
    """The blocks ``[(Block, kwargs), ...]`` (rows of ``q`` against rows of ``k``/``v``, the
    kwargs of :func:`block_kwargs`) merged into ``(out, lse)``: ``(b, c, a, d)`` and
    ``(b, a, c)`` in :func:`acc_dtype`. ``out``/``lse``: a running result to merge into (the
    ring's earlier rounds), else queries no block covers keep ``(0, -inf)``."""
    acc = acc_dtype(q.dtype)
    for blk, kw in blocks:
        o_b, l_b = local_attention(q[:, blk.q], k[:, blk.k], v[:, blk.k], scale=scale, impl=impl,
                                   **kw)
        if out is None and blk.q == slice(0, q.shape[1]):  # the first block covers every query
            out, lse = o_b.to(acc), l_b.to(acc)
            continue
        if out is None or lse is None:
            out = q.new_zeros(q.shape[:3] + (v.shape[3],), dtype=acc)
            lse = q.new_full((q.shape[0], q.shape[2], q.shape[1]), float("-inf"), dtype=acc)
        merge_block(out, lse, blk.q, o_b, l_b)
    if out is None or lse is None:                         # no block: nothing visible
        out = q.new_zeros(q.shape[:3] + (v.shape[3],), dtype=acc)
        lse = q.new_full((q.shape[0], q.shape[2], q.shape[1]), float("-inf"), dtype=acc)
    return out, lse


def attend_blocks_backward(dout, q, k, v, out, lse, blocks, dq, scale=None, impl: str = "auto",
                           dkv=None):
    """The gradients of :func:`attend_blocks` from the final ``(out, lse)`` of the queries:
    adds each block's ``dQ`` to ``dq`` (in place) and returns ``(dk, dv)`` of these ``k``,
    ``v`` rows in :func:`acc_dtype`. ``dkv``: two tensors of those shapes and dtype to zero
    and fill instead of new ones (the ring reuses its buffers)."""
    acc = acc_dtype(q.dtype)
    if dkv is None:
        dk = torch.zeros(k.shape, dtype=acc, device=q.device)
        dv = torch.zeros(v.shape, dtype=acc, device=q.device)
    else:
        dk, dv = (t.zero_() for t in dkv)
    for blk, kw in blocks:
        g_q, g_k, g_v = local_attention_backward(
            dout[:, blk.q], q[:, blk.q], k[:, blk.k], v[:, blk.k], out[:, blk.q],
            lse[:, :, blk.q], scale=scale, impl=impl, **kw)
        dq[:, blk.q] += g_q
        dk[:, blk.k] += g_k
        dv[:, blk.k] += g_v
    return dk, dv


class BlockAttention(torch.autograd.Function):
    """``out = BlockAttention.apply(q, k, v, blocks, scale, impl)``: :func:`attend_blocks`
    with its backward :func:`attend_blocks_backward`; ``out`` in ``q``'s dtype (Ulysses' local
    attention over all ``s`` tokens of its heads)."""

    @staticmethod
    def forward(ctx, q, k, v, blocks, scale, impl):
        out, lse = attend_blocks(q, k, v, blocks, scale, impl)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.cfg = (blocks, scale, impl)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        blocks, scale, impl = ctx.cfg
        dq = torch.zeros(q.shape, dtype=acc_dtype(q.dtype), device=q.device)
        dk, dv = attend_blocks_backward(dout.contiguous(), q, k, v, out, lse, blocks, dq, scale,
                                        impl)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None
