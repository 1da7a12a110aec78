"""Cut one sequence into per-rank shards (and put it back together) for a layout.

Which global tokens rank ``r`` holds comes from :func:`lesson10.layouts.shard_positions`:
``"contiguous"`` (block ``r``), ``"zigzag"`` (chunks ``r`` and ``2n-1-r`` of ``2n``) or
``"striped"`` (tokens ``r, r+n, r+2n, ...``). A shard keeps its tokens in increasing
global order, which is what ring attention expects.

    x_local = shard_sequence(x, "zigzag")          # every rank passes the same full x
    x_full  = gather_sequence(x_local, "zigzag")   # every rank gets the full x back
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from ..layouts import check_permutation, layout_name, shard_positions
from .comm import all_gather, check_same_shape, record, ring_next

__all__ = ["shard_sequence", "gather_sequence", "local_positions", "layout_positions"]


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
    return shard_positions(s, n, layout)  # raises a clear ValueError for bad s / layout


def layout_positions(layout, c: int, group=None, device=None) -> list[np.ndarray]:
    """The global token ids of every rank's ``c`` local tokens, ``[pos_0, ..., pos_{n-1}]``.

    ``layout``: a layout name (``lesson10.layouts.shard_positions``, no communication) or this
    rank's own positions, a sequence or 1-D tensor of ``c`` ints (then one all-gather of them,
    recorded as ``"metadata"``; all ranks together must hold ``0..s-1`` once, else a
    ValueError on every rank). Every rank of ``group`` must pass the same kind.
    """
    r, n = _group_info(group)
    if isinstance(layout, str):
        if c == 0:                        # empty shards: nothing to place (any known layout)
            layout_name(layout)
            return [np.zeros(0, dtype=np.int64) for _ in range(n)]
        return shard_positions(n * c, n, layout)
    try:
        mine = torch.as_tensor(layout).reshape(-1)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"layout must be a layout name or this rank's positions (a sequence of "
                         f"ints), got {layout!r}") from None
    if mine.dtype.is_floating_point or mine.dtype.is_complex or mine.dtype == torch.bool:
        raise ValueError(f"positions must be integer token ids, got dtype {mine.dtype}")
    mine = mine.to(torch.long)
    if n > 1:
        dev = device if device is not None and dist.get_backend(group) == "nccl" else "cpu"
        mine = mine.to(dev)
        check_same_shape(mine, group, "positions", hint="every rank passes the positions of its "
                         "own tokens, as many as it holds")
        mine = all_gather(mine[None], dim=0, group=group, op="metadata")
    pos = [row.cpu().numpy() for row in mine.reshape(n, -1)]
    if pos[0].size != c:
        raise ValueError(f"positions: each rank holds {c} tokens but passed {pos[0].size} positions")
    check_permutation(np.concatenate(pos), "positions")
    return pos


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
    record("all_gather", (n - 1) * xc.numel() * xc.element_size(), to=ring_next(group))
    dist.all_gather(parts, xc, group=group)
    s = x_local.shape[dim] * n
    pos = _positions(s, n, layout)
    order = torch.as_tensor([int(p) for ps in pos for p in ps], dtype=torch.long, device=x_local.device)
    stacked = torch.cat(parts, dim=dim)               # tokens in rank order
    inv = torch.empty_like(order)
    inv[order] = torch.arange(s, device=x_local.device)
    return stacked.index_select(dim, inv)
