"""The checks of local shards that every real method runs before it communicates.

Each function raises a ValueError (a RuntimeError outside a rank) that says which rule
broke and what to do, so a wrong call fails on every rank with one message instead of a
hang or a wrong answer. Shapes: ``q`` ``(b, c, a, d)``, ``k`` / ``v`` ``(b, c, a_kv, d)``
with ``a % a_kv == 0`` (GQA); ``doc_ids`` ``(s,)`` integer documents of the global positions.
"""
from __future__ import annotations

import torch

__all__ = ["check_float", "check_qkv", "check_local_qkv", "require_rank", "check_doc_ids",
           "check_positions", "check_impl", "IMPLS"]

#: the local kernel choices of :func:`lesson10.spmd.attention.local_attention`
IMPLS = ("auto", "kernel", "einsum")


def check_float(**tensors) -> None:
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


def check_qkv(q, k, v) -> int:
    """One attention block's ``q (b, s_q, a, d)``, ``k``/``v`` ``(b, s_k, a_kv, d)``; returns
    ``g = a / a_kv``, the query heads per K/V head."""
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
    if not _is_integer(doc):
        raise ValueError(f"{where}: doc_ids must be integer document ids (e.g. 0, 0, 0, 1, 1, 2), "
                         f"got {doc.dtype}")
    return doc.to(torch.int64)


def _is_integer(t: torch.Tensor) -> bool:
    return not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)


def check_positions(q_pos, k_pos, s_q: int, s_k: int, device):
    """``(q_pos, k_pos)`` as integer tensors of ``s_q`` and ``s_k`` global token ids
    (``None``: ``0..s-1``)."""
    try:
        q_pos = torch.arange(s_q, device=device) if q_pos is None else torch.as_tensor(q_pos, device=device)
        k_pos = torch.arange(s_k, device=device) if k_pos is None else torch.as_tensor(k_pos, device=device)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"q_pos and k_pos must be integer token ids ({e})") from None
    if q_pos.shape != (s_q,) or k_pos.shape != (s_k,):
        raise ValueError(
            f"q_pos must have {s_q} entries and k_pos {s_k} (one global position per token); got "
            f"{tuple(q_pos.shape)} and {tuple(k_pos.shape)}")
    if not (_is_integer(q_pos) and _is_integer(k_pos)):
        raise ValueError(f"q_pos and k_pos must be integer token ids, got {q_pos.dtype} and "
                         f"{k_pos.dtype} (use lesson10.layouts.shard_positions)")
    return q_pos, k_pos


def check_impl(impl, q, k) -> str:
    """Validate ``impl`` (one of :data:`IMPLS`); empty blocks always take the einsum path (the
    CPU kernel crashes the process on a zero-length sequence)."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if q.shape[1] == 0 or k.shape[1] == 0:
        return "einsum"
    return impl
