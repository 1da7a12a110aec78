"""Cut one sequence into per-rank shards (and put it back together) for a layout.

Which global tokens rank ``r`` holds comes from :func:`lesson10.layouts.shard_positions`:
``"contiguous"`` (block ``r``), ``"zigzag"`` (chunks ``r`` and ``2n-1-r`` of ``2n``) or
``"striped"`` (tokens ``r, r+n, r+2n, ...``); a named layout's shard keeps its tokens in
increasing global order. Or ``layout=`` is this rank's positions (any ``s/n`` global token
ids, in the order the shard holds them; all ranks together hold ``0..s-1`` once), as in
every attention method.

    x_local = shard_sequence(x, "zigzag")          # every rank passes the same full x
    x_full  = gather_sequence(x_local, "zigzag")   # every rank gets the full x back
    x_local = shard_sequence(x, [5, 0, 3, 6])      # or this rank's positions
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


def _own_positions(layout, s: int, n: int, r: int) -> np.ndarray:
    """This rank's global token ids for ``layout`` over ``s`` tokens: a layout name's shard
    (a clear ValueError for a bad ``s`` or name), or the positions given, checked locally
    (``s/n`` distinct integer ids in ``0..s-1``)."""
    if isinstance(layout, str):
        return shard_positions(s, n, layout)[r]
    mine = _as_positions(layout).cpu().numpy()
    if s % n or mine.size != s // n:
        raise ValueError(f"positions: each of the {n} ranks holds s/n tokens of the s = {s}, but "
                         f"this rank passed {mine.size} positions")
    if mine.size and (mine.min() < 0 or mine.max() >= s or np.unique(mine).size != mine.size):
        raise ValueError(f"positions must be distinct token ids in 0..{s - 1}, got "
                         f"{mine.tolist()}")
    return mine


def _as_positions(layout) -> torch.Tensor:
    """``layout`` (positions: a sequence or tensor of ints) as a 1-D int64 tensor."""
    try:
        mine = torch.as_tensor(layout).reshape(-1)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"layout must be a layout name or this rank's positions (a sequence of "
                         f"ints), got {layout!r}") from None
    if mine.dtype.is_floating_point or mine.dtype.is_complex or mine.dtype == torch.bool:
        raise ValueError(f"positions must be integer token ids, got dtype {mine.dtype}")
    return mine.to(torch.long)


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
    mine = _as_positions(layout)
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


def local_positions(s: int, layout="zigzag", group=None) -> torch.Tensor:
    """Global positions (int64 tensor) of the ``s/n`` tokens this rank holds: a layout name's
    (increasing), or the positions given, checked as :func:`shard_sequence` checks them."""
    r, n = _group_info(group)
    return torch.as_tensor(_own_positions(layout, s, n, r), dtype=torch.long)


def shard_sequence(x: torch.Tensor, layout="zigzag", group=None, dim: int = 1) -> torch.Tensor:
    """This rank's shard of the full tensor ``x`` along ``dim`` (no communication).

    ``x``: the whole sequence, identical on every rank, ``x.shape[dim] = s``; returns
    the ``s/n`` tokens of :func:`local_positions`, in their order (a copy; differentiable).
    ``layout``: a layout name (then ``s`` must be a multiple of ``n``, ``2n`` for zigzag) or
    this rank's positions (checked here only locally; :func:`gather_sequence` checks that
    all ranks together hold every token once).
    """
    r, n = _group_info(group)
    dim = _dim(x, dim, "x")
    idx = torch.as_tensor(_own_positions(layout, x.shape[dim], n, r), dtype=torch.long,
                          device=x.device)
    return x.index_select(dim, idx)


def gather_sequence(x_local: torch.Tensor, layout="zigzag", group=None, dim: int = 1) -> torch.Tensor:
    """The full sequence on every rank, from each rank's shard (one all-gather).

    Inverse of :func:`shard_sequence`: ``x_local.shape[dim] = s/n`` on every rank
    (same shape everywhere); ``layout`` a layout name or this rank's positions (then their
    all-gather first, ``"metadata"``, see :func:`layout_positions`); returns ``s`` tokens in
    global order. Bytes: the all-gather sends ``(n-1)`` shards per rank.
    """
    r, n = _group_info(group)
    dim = _dim(x_local, dim, "x_local")
    if x_local.dim() > 8:
        raise ValueError(f"gather_sequence: at most 8 dims, got shape {tuple(x_local.shape)}")
    if n > 1:
        check_same_shape(x_local, group, "gather_sequence: x_local",
                         hint="every rank must pass its s/n tokens (use shard_sequence)")
    c = x_local.shape[dim]
    pos = layout_positions(layout, c, group, x_local.device)   # a bad layout: same error everywhere
    parts = [torch.empty_like(x_local) for _ in range(n)]
    xc = x_local.contiguous()
    record("all_gather", (n - 1) * xc.numel() * xc.element_size(), to=ring_next(group))
    dist.all_gather(parts, xc, group=group)
    order = torch.as_tensor(np.concatenate(pos), dtype=torch.long, device=x_local.device)
    stacked = torch.cat(parts, dim=dim)               # tokens in rank order
    inv = torch.empty_like(order)
    inv[order] = torch.arange(n * c, device=x_local.device)
    return stacked.index_select(dim, inv)
