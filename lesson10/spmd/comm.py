"""The collectives of the methods: each wrapper is the ``torch.distributed`` call plus its
bytes at ring-algorithm cost, recorded with :func:`lesson10.spmd.bytecount.record` (all-reduce
2(n-1)/n of the tensor, all-gather and reduce-scatter (n-1)/n of the full tensor, all-to-all
the blocks that leave the rank), and, beside them, what the backend puts on the wire
(:func:`lesson10.spmd.bytecount.wire_factor`: gloo's reduce-scatter is an all-reduce). They
work on plain tensors (no autograd); the autograd
Functions of sp.py, ulysses.py and moe.py call them in their forward and backward. The byte
counter (``count_bytes``, ``record``, ``SIDE_OPS``) lives in :mod:`lesson10.spmd.bytecount`
and is re-exported here::

    with count_bytes() as c:
        out = ring_attention(q, k, v)
    c.sent            # bytes this rank put on the wire
    c.by_op           # {"ring_shift": ..., "all_to_all": ...}
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from .bytecount import SIDE_OPS, ByteCounter, count_bytes, record, wire_factor  # noqa: F401


def group_size(group=None) -> int:
    """Number of ranks in ``group`` (``None`` = the default, world group)."""
    return dist.get_world_size(group)


def group_rank(group=None) -> int:
    """This rank's index inside ``group``."""
    return dist.get_rank(group)


def global_rank(i: int, group=None) -> int:
    """The global rank of rank ``i`` of ``group``."""
    return i if group is None else dist.get_global_rank(group, i)


def ring_next(group=None) -> int:
    """The global rank of the next rank of ``group`` (``r + 1 mod n``): where a ring
    collective sends this rank's bytes (the link its bytes are counted on)."""
    n = group_size(group)
    return global_rank((group_rank(group) + 1) % n, group)


def _nbytes(x: torch.Tensor) -> int:
    return x.numel() * x.element_size()


def all_reduce(x: torch.Tensor, group=None, op: str = "all_reduce") -> torch.Tensor:
    """Sum ``x`` over the ranks of ``group``, in place; returns ``x``.

    Bytes: ``2 (n-1)/n * x.nbytes`` (a ring reduce-scatter plus all-gather),
    recorded under the name ``op`` (every wrapper takes ``op=`` to label its bytes,
    e.g. ``"param_grad"`` or ``"metadata"``, so a test can separate them).
    """
    n = group_size(group)
    if n > 1:
        record(op, 2 * (n - 1) * _nbytes(x) // n, to=ring_next(group), kind="all_reduce")
        dist.all_reduce(x, group=group)
    return x


def all_gather(x: torch.Tensor, dim: int = 0, group=None, op: str = "all_gather") -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` in rank order.

    Shapes: ``x`` ``(..., m, ...)`` on each of ``n`` ranks -> ``(..., n m, ...)``.
    Every rank must pass the same shape. Bytes: ``(n-1)/n`` of the output
    = ``(n-1) * x.nbytes``.
    """
    n = group_size(group)
    if n == 1:
        return x
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(n)]
    record(op, (n - 1) * _nbytes(x), to=ring_next(group), kind="all_gather")
    dist.all_gather(parts, x, group=group)
    return torch.cat(parts, dim=dim)


def reduce_scatter(x: torch.Tensor, dim: int = 0, group=None, op: str = "reduce_scatter") -> torch.Tensor:
    """Sum ``x`` over ranks and keep this rank's chunk ``r`` of ``n`` along ``dim``.

    Shapes: ``(..., n m, ...)`` -> ``(..., m, ...)``; ``x.shape[dim]`` must be a
    multiple of ``n``. Bytes: ``(n-1)/n * x.nbytes``.
    """
    n = group_size(group)
    if x.shape[dim] % n:
        raise ValueError(f"reduce_scatter: size {x.shape[dim]} of dim {dim} is not a multiple "
                         f"of the {n} ranks; pad it to a multiple of {n}.")
    if n == 1:
        return x
    chunks = [c.contiguous() for c in x.chunk(n, dim=dim)]
    out = torch.empty_like(chunks[0])
    record(op, (n - 1) * _nbytes(x) // n, to=ring_next(group), kind="reduce_scatter")
    try:
        dist.reduce_scatter(out, chunks, group=group)
    except RuntimeError as e:  # old gloo builds have no reduce_scatter: same sum, via all_reduce
        if "support" not in str(e).lower():
            raise
        full = x.contiguous().clone()
        dist.all_reduce(full, group=group)
        out = full.chunk(n, dim=dim)[group_rank(group)].contiguous()
    return out


def _split_sizes(sizes, rows: int, n: int, name: str) -> list[int]:
    """``sizes`` as ``n`` ints; ``None``: ``rows`` split evenly (a ValueError if it cannot be)."""
    if sizes is None:
        if rows % n:
            raise ValueError(f"all_to_all_single: {rows} rows cannot be split evenly over {n} "
                             f"ranks; pass {name} or pad to a multiple of n.")
        return [rows // n] * n
    sizes = [int(v) for v in sizes]
    if len(sizes) != n:
        raise ValueError(f"{name} {sizes} must have {n} entries")
    return sizes


def all_to_all_single(x: torch.Tensor, output_split_sizes=None, input_split_sizes=None,
                      group=None, op: str = "all_to_all") -> torch.Tensor:
    """Block transpose along dim 0: rows ``input_split_sizes[j]`` go to rank ``j``.

    Shapes: ``x`` ``(sum(input_split_sizes), ...)`` -> ``(sum(output_split_sizes), ...)``
    where ``output_split_sizes[j]`` rows come from rank ``j`` (rank order). ``None`` =
    equal splits (dim 0 a multiple of ``n``). Splits may be uneven and may be 0.
    Bytes: the rows that leave the rank, ``x.nbytes - rows_kept * row_bytes``.
    """
    n = group_size(group)
    r = group_rank(group)
    rows = x.shape[0]
    input_split_sizes = _split_sizes(input_split_sizes, rows, n, "input_split_sizes")
    if sum(input_split_sizes) != rows:
        raise ValueError(f"input_split_sizes {input_split_sizes} must have {n} entries "
                         f"summing to dim 0 = {rows}")
    output_split_sizes = _split_sizes(output_split_sizes, rows, n, "output_split_sizes")
    row_bytes = math.prod(x.shape[1:]) * x.element_size()
    record(op, (rows - input_split_sizes[r]) * row_bytes,
           to={global_rank(j, group): b * row_bytes for j, b in enumerate(input_split_sizes) if j != r},
           kind="all_to_all")
    x = x.contiguous()
    out = x.new_empty((sum(output_split_sizes), *x.shape[1:]))
    if n == 1:
        out.copy_(x)
        return out
    dist.all_to_all_single(out, x, output_split_sizes, input_split_sizes, group=group)
    return out


_DTYPE_CODES = {torch.float64: 0, torch.float32: 1, torch.bfloat16: 2, torch.float16: 3}


def check_same_shape(x: torch.Tensor, group=None, what: str = "tensor", dims=None,
                     hint: str = "every rank must hold an equal shard (same batch, tokens, heads, "
                                 "dim); shard the sequence with shard_sequence()") -> None:
    """ValueError on every rank if ``x.shape`` (or ``x.shape[d] for d in dims``) or the
    dtype differs between the ranks of ``group``: a mismatched collective would hang,
    abort the process (gloo) or mix data.

    The one cross-rank shape check of the package: one all-gather of ten int64s,
    recorded under ``"metadata"`` (not activation traffic).
    """
    n = group_size(group)
    if n == 1:
        return
    shape = list(x.shape) if dims is None else [x.shape[d] for d in dims]
    if len(shape) > 8:
        raise ValueError(f"{what}: at most 8 dims are checked, got {len(shape)}")
    code = _DTYPE_CODES.get(x.dtype, 9)
    mine = torch.tensor([len(shape)] + shape + [-1] * (8 - len(shape)) + [code], dtype=torch.int64)
    dev = x.device if dist.get_backend(group) == "nccl" else torch.device("cpu")
    allv = all_gather(mine.to(dev)[None], dim=0, group=group, op="metadata").cpu()
    if not bool((allv == allv[0]).all()):
        names = {c: str(t).replace("torch.", "") for t, c in _DTYPE_CODES.items()}
        rows = {r: (tuple(allv[r, 1:1 + int(allv[r, 0])].tolist()), names.get(int(allv[r, -1]), "other"))
                for r in range(n)}
        raise ValueError(f"mismatched shards: {what} has different shapes or dtypes on the ranks "
                         f"(rank: (shape, dtype)) {rows}; {hint}.")
