"""Cut one sequence into per-rank shards (and put it back together) for a layout.

Which global tokens rank ``r`` holds comes from :func:`lesson10.layouts.shard_positions`:
``"contiguous"`` (block ``r``), ``"zigzag"`` (chunks ``r`` and ``2n-1-r`` of ``2n``) or
``"striped"`` (tokens ``r, r+n, r+2n, ...``). A shard keeps its tokens in increasing
global order, which is what ring attention expects.

    x_local = shard_sequence(x, "zigzag")          # every rank passes the same full x
    x_full  = gather_sequence(x_local, "zigzag")   # every rank gets the full x back
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .comm import check_same_shape, record

__all__ = ["shard_sequence", "gather_sequence", "local_positions"]


def _group_info(group):
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "no torch.distributed process group: call this inside a rank started by "
            "lesson10.spmd.launch(...) or torchrun (after init_from_env())")
    return dist.get_rank(group), dist.get_world_size(group)


def _dim(x, dim: int, name: str) -> int:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}; convert it with "
                         f"torch.as_tensor(...)")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim = {dim!r} is not a dimension of {name} with shape {tuple(x.shape)}; "
                         f"pass the sequence dim (1 for (b, s, a, d))")
    return dim % x.dim()


def _positions(s: int, n: int, layout: str):
    from ..layouts import shard_positions  # raises a clear ValueError for bad s / layout
    return shard_positions(s, n, layout)


def local_positions(s: int, layout: str = "zigzag", group=None) -> torch.Tensor:
    """Global positions (int64 tensor, increasing) of the ``s/n`` tokens this rank holds."""
    r, n = _group_info(group)
    return torch.as_tensor(_positions(s, n, layout)[r], dtype=torch.long)


def shard_sequence(x: torch.Tensor, layout: str = "zigzag", group=None, dim: int = 1) -> torch.Tensor:
    """This rank's shard of the full tensor ``x`` along ``dim`` (no communication).

    ``x``: the whole sequence, identical on every rank, ``x.shape[dim] = s``; returns
    the ``s/n`` tokens of :func:`local_positions`, in increasing order (a copy;
    differentiable). ``s`` must be a multiple of ``n`` (``2n`` for zigzag).
    """
    r, n = _group_info(group)
    dim = _dim(x, dim, "x")
    idx = torch.as_tensor(_positions(x.shape[dim], n, layout)[r], dtype=torch.long, device=x.device)
    return x.index_select(dim, idx)


def gather_sequence(x_local: torch.Tensor, layout: str = "zigzag", group=None, dim: int = 1) -> torch.Tensor:
    """The full sequence on every rank, from each rank's shard (one all-gather).

    Inverse of :func:`shard_sequence`: ``x_local.shape[dim] = s/n`` on every rank
    (same shape everywhere); returns ``s`` tokens in global order. Bytes: the
    all-gather sends ``(n-1)`` shards per rank.
    """
    r, n = _group_info(group)
    dim = _dim(x_local, dim, "x_local")
    if x_local.dim() > 8:
        raise ValueError(f"gather_sequence: at most 8 dims, got shape {tuple(x_local.shape)}")
    if n > 1:
        check_same_shape(x_local, group, "gather_sequence: x_local",
                         hint="every rank must pass its s/n tokens (use shard_sequence)")
    _positions(x_local.shape[dim] * n, n, layout)     # bad layout / length: same error everywhere
    parts = [torch.empty_like(x_local) for _ in range(n)]
    xc = x_local.contiguous()
    record("all_gather", (n - 1) * xc.numel() * xc.element_size())
    dist.all_gather(parts, xc, group=group)
    s = x_local.shape[dim] * n
    pos = _positions(s, n, layout)
    order = torch.as_tensor([int(p) for ps in pos for p in ps], dtype=torch.long, device=x_local.device)
    stacked = torch.cat(parts, dim=dim)               # tokens in rank order
    inv = torch.empty_like(order)
    inv[order] = torch.arange(s, device=x_local.device)
    return stacked.index_select(dim, inv)
