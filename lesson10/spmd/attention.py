"""Attention that also returns the logsumexp (lse), and the merge of two partial results.

Shapes (the ``dist`` convention): ``q`` is ``(b, s_q, a, d)``, ``k`` and ``v`` are
``(b, s_k, a_kv, d)`` with ``a % a_kv == 0`` (GQA: ``g = a / a_kv`` query heads share
one K/V head). Outputs: ``out`` ``(b, s_q, a, d)`` and ``lse`` ``(b, s_q, a)``:

    x_ij = q_i . k_j * scale,   lse_i = log sum_j exp(x_ij),   out_i = sum_j exp(x_ij - lse_i) v_j

over the keys ``j`` that query ``i`` may see. With ``causal=True`` query ``i`` sees key
``j`` when ``k_pos[j] <= q_pos[i]`` (global token positions; default ``0..s-1``), so
any layout is exact. A query that sees no key gets ``lse = -inf`` and ``out = 0``
(never NaN): that is the neutral element of :func:`merge`.

Three implementations:

* :func:`attention` -- the plain einsum reference (autograd-friendly, any mask);
* :func:`local_attention` / :func:`local_attention_backward` -- the fast path used by
  ring attention: a fused kernel that returns the lse (CPU:
  ``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward; CUDA: the
  memory-efficient SDPA kernel), and an einsum fallback for masks a kernel cannot
  express (positions that are not "key index <= query index").
"""
from __future__ import annotations

import math

import torch

__all__ = ["attention", "merge", "local_attention", "local_attention_backward", "visible",
           "check_doc_ids", "check_float", "check_local_qkv", "require_rank", "merge_block",
           "block_kwargs", "acc_dtype"]


# --------------------------------------------------------------------------- checks
def check_float(**tensors):
    """Every argument must be a floating-point tensor, all of one dtype (no silent casts)."""
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}; "
                             f"convert it with torch.as_tensor(...)")
        if not t.is_floating_point():
            raise ValueError(f"{name} has dtype {t.dtype}; attention needs floating-point tensors "
                             f"(float32, float64, bfloat16 or float16): cast with .float()")
    dtypes = {name: t.dtype for name, t in tensors.items()}
    if len(set(dtypes.values())) > 1:
        raise ValueError(f"mixed dtypes {dtypes}; cast them all to one dtype first (e.g. .float())")


def _check_qkv(q, k, v):
    check_float(q=q, k=k, v=v)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k, v must be 4-D (b, s, a, d); got shapes {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree in batch (dim 0) and head "
            "dim (dim 3)")
    a, a_kv = q.shape[2], k.shape[2]
    if a_kv == 0 or a % a_kv:
        raise ValueError(
            f"GQA needs the number of query heads ({a}) to be a multiple of the number of K/V "
            f"heads ({a_kv})")
    if q.shape[3] == 0:
        raise ValueError("the head dim d (dim 3) is 0: attention needs d >= 1")
    return a // a_kv


def require_rank(where: str) -> None:
    """RuntimeError unless a torch.distributed process group is running (``where``: the
    function's name, for the message)."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"{where} runs inside a rank: use lesson10.spmd.launch or torchrun")


def check_local_qkv(q, k, v, where: str) -> None:
    """The local shards of a context-parallel method: floating point of one dtype, q
    ``(b, c, a, d)`` and k, v ``(b, c, a_kv, d)`` of one shape, ``a`` a multiple of ``a_kv``
    (GQA); a ValueError that says which rule broke otherwise."""
    check_float(q=q, k=k, v=v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{where}: {name} must be a local shard of shape (b, s/N_c, a, d), "
                             f"got {tuple(t.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"{where}: k and v must have the same shape, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    if q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"{where}: q {tuple(q.shape)} and k/v {tuple(k.shape)} must agree in "
                         "batch, local sequence length and head dim (only the head count may "
                         "differ: GQA)")
    if k.shape[2] == 0 or q.shape[2] % k.shape[2]:
        raise ValueError(f"{where}: the number of query heads ({q.shape[2]}) must be a multiple "
                         f"of the number of K/V heads ({k.shape[2]}) (GQA)")


def acc_dtype(dtype):
    """The accumulation dtype of a blockwise method: float64 for float64, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def merge_block(out, lse, rows, o_b, l_b) -> None:
    """Merge one block's ``(o_b, l_b)`` into the running ``out`` ``(b, s, a, d)`` and ``lse``
    ``(b, a, s)`` (the kernels' layout) at the query ``rows`` (a slice), in place: the lse
    formula of :func:`merge`, which wants ``(b, s, a)``, and the transposes around it."""
    o_m, l_m = merge(out[:, rows], lse[:, :, rows].transpose(1, 2), o_b, l_b.transpose(1, 2))
    out[:, rows] = o_m
    lse[:, :, rows] = l_m.transpose(1, 2)


def block_kwargs(block, q_pos, k_pos, causal: bool, doc_ids=None) -> dict:
    """The mask arguments of :func:`local_attention` for one
    :class:`lesson10.layouts.Block`: none, the kernel's causal mask, or the global
    positions of its rows (``q_pos``, ``k_pos``: int64 tensors of the whole local blocks)."""
    if block.mask == "none":
        return {"causal": False}
    if block.mask == "causal":
        return {"causal": True}
    return {"causal": causal, "q_pos": q_pos[block.q], "k_pos": k_pos[block.k], "doc_ids": doc_ids}


_IMPLS = ("auto", "kernel", "einsum")


def _check_impl(impl, q, k):
    """Validate ``impl``; empty blocks always take the einsum path (the CPU kernel crashes
    the process on a zero-length sequence)."""
    if impl not in _IMPLS:
        raise ValueError(f"impl must be one of {_IMPLS}, got {impl!r}")
    if q.shape[1] == 0 or k.shape[1] == 0:
        return "einsum"
    return impl


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


def check_doc_ids(doc_ids, s=None, device=None, where: str = "doc_ids"):
    """``doc_ids`` as an int64 tensor ``(s,)`` (any length if ``s`` is None), or None.

    One integer document id per *global* token position, the same on every rank (a packed
    sequence of documents of 3, 2 and 1 tokens is ``[0, 0, 0, 1, 1, 2]``)."""
    if doc_ids is None:
        return None
    try:
        doc = torch.as_tensor(doc_ids, device=device)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"{where}: doc_ids must be integer document ids ({e})") from None
    if doc.dim() != 1 or (s is not None and doc.shape[0] != s):
        raise ValueError(f"{where}: doc_ids must give the document of every one of the "
                         f"{'s' if s is None else f's = {s}'} global token positions, a 1-D "
                         f"tensor; got shape {tuple(doc.shape)}")
    if doc.is_floating_point() or doc.is_complex() or doc.dtype == torch.bool:
        raise ValueError(f"{where}: doc_ids must be integer document ids (e.g. 0, 0, 0, 1, 1, 2), "
                         f"got {doc.dtype}")
    return doc.to(torch.int64)


def _positions(q_pos, k_pos, s_q, s_k, device):
    try:
        q_pos = torch.arange(s_q, device=device) if q_pos is None else torch.as_tensor(q_pos, device=device)
        k_pos = torch.arange(s_k, device=device) if k_pos is None else torch.as_tensor(k_pos, device=device)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"q_pos and k_pos must be integer token ids ({e})") from None
    if q_pos.shape != (s_q,) or k_pos.shape != (s_k,):
        raise ValueError(
            f"q_pos must have {s_q} entries and k_pos {s_k} (one global position per token); got "
            f"{tuple(q_pos.shape)} and {tuple(k_pos.shape)}")
    if q_pos.is_floating_point() or q_pos.is_complex() or q_pos.dtype == torch.bool \
            or k_pos.is_floating_point() or k_pos.is_complex() or k_pos.dtype == torch.bool:
        raise ValueError(f"q_pos and k_pos must be integer token ids, got {q_pos.dtype} and "
                         f"{k_pos.dtype} (use lesson10.layouts.shard_positions)")
    return q_pos, k_pos


# ----------------------------------------------------------------------- reference
def attention(q, k, v, causal: bool = False, q_pos=None, k_pos=None, scale=None, doc_ids=None):
    """Reference attention with lse, written with einsum (differentiable by autograd).

    Returns ``(out, lse)`` of shapes ``(b, s_q, a, d)`` and ``(b, s_q, a)``; masked-out
    queries get ``out = 0`` and ``lse = -inf``. GQA: K/V heads are repeated ``g`` times.
    ``doc_ids``: document mask (see :func:`visible`), indexed by the global positions.
    """
    g = _check_qkv(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if g > 1:
        k = k.repeat_interleave(g, dim=2)
        v = v.repeat_interleave(g, dim=2)
    x = torch.einsum("bqad,bkad->baqk", q, k) * scale          # (b, a, s_q, s_k)
    if causal or doc_ids is not None:
        qp, kp = _positions(q_pos, k_pos, q.shape[1], k.shape[1], q.device)
        mask = visible(qp, kp, causal, doc_ids=doc_ids)  # (s_q, s_k)
        seen = mask.any(-1)[:, None]                           # query sees >= 1 key
        # rows that see no key are computed on zeros and then dropped: no -inf - -inf,
        # so neither the forward nor autograd's backward can produce a NaN
        x = torch.where(seen, x.masked_fill(~mask, float("-inf")), torch.zeros_like(x))
        lse = torch.logsumexp(x, dim=-1)                       # (b, a, s_q)
        p = torch.exp(x - lse[..., None]) * mask
        lse = torch.where(seen[:, 0], lse, torch.full_like(lse, float("-inf")))
    else:
        lse = torch.logsumexp(x, dim=-1)
        p = torch.exp(x - lse[..., None])
    out = torch.einsum("baqk,bkad->bqad", p, v)
    return out, lse.transpose(1, 2)


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
        _CUDA_VERIFIED[key] = False
        try:
            g = torch.Generator(device=q.device).manual_seed(0)
            t = [torch.randn(1, 40, 4, 16, device=q.device, generator=g, dtype=torch.float32)
                 for _ in range(4)]
            k2, v2 = t[1][:, :, :2], t[2][:, :, :2]
            ok = True
            for causal in (False, True):
                low = [x.to(q.dtype) for x in (t[0], k2, v2, t[3])]
                o_k, l_k = local_attention(*low[:3], causal=causal, impl="kernel")
                o_e, l_e = local_attention(*(x.float() for x in low[:3]), causal=causal, impl="einsum")
                g_k = local_attention_backward(low[3], *low[:3], o_k, l_k, causal=causal, impl="kernel")
                g_e = local_attention_backward(low[3].float(), *(x.float() for x in low[:3]),
                                               o_e, l_e, causal=causal, impl="einsum")
                tol = 1e-3 if q.dtype == torch.float32 else 5e-2
                pairs = [(o_k, o_e), (l_k, l_e), *zip(g_k, g_e)]
                ok = ok and all(torch.allclose(a.float(), b.float(), atol=tol, rtol=tol) for a, b in pairs)
            _CUDA_VERIFIED[key] = bool(ok)
        except Exception:  # noqa: BLE001 - any failure means: use the einsum path
            _CUDA_VERIFIED[key] = False
        if not _CUDA_VERIFIED[key]:
            import warnings
            warnings.warn(f"fused CUDA attention kernel not usable for {q.dtype}; using einsum")
    return _CUDA_VERIFIED[key]


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
    qp, kp = _positions(q_pos, k_pos, s_q, s_k, device)
    # positions strictly increasing and equal for q and k => masks coincide
    if torch.equal(qp, kp) and bool((qp[1:] > qp[:-1]).all()):
        return True
    return None


def _choose_impl(impl, kind, q, k) -> str:
    """``"kernel"`` or ``"einsum"``: ``auto`` takes the fused kernel when it can express the
    mask (``kind``) on this device and dtype."""
    impl = _check_impl(impl, q, k)
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
    g = _check_qkv(q, k, v)
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
    g = _check_qkv(q, k, v)
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
        qp, kp = _positions(q_pos, k_pos, s_q, s_k, q.device)
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
