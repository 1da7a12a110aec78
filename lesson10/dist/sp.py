"""Megatron tensor + sequence parallelism on real ``torch.distributed``.

Activations are ``(b, s, h)``; the TP group has ``t`` ranks. Four operators move a
tensor between the regions of a layer, each an autograd Function whose backward
is the *other* collective of its pair (Korthikanti et al. 2022, Fig. 5-6):

========================  ==========================  ==========================
operator                  forward                     backward
========================  ==========================  ==========================
``copy_to_tp``            identity                    all-reduce
``reduce_from_tp``        all-reduce                  identity
``gather_from_sp``        all-gather along ``s``      reduce-scatter along ``s``
``reduce_scatter_to_sp``  reduce-scatter along ``s``  all-gather along ``s``
========================  ==========================  ==========================

Plain TP uses the first pair around a column-parallel then row-parallel matmul;
TP + SP replaces it by the second pair, so the token-wise parts of the layer
(LayerNorm, dropout, residual) hold only ``s/t`` tokens per rank. A ring
all-reduce is a reduce-scatter plus an all-gather, so both modes send the same
bytes. One thing changes: under SP each rank applies the LayerNorm (and the
row-parallel bias) to its own tokens only, so their weight gradients are partial
sums and must be all-reduced over the TP group; we do it by passing those
weights through ``copy_to_tp`` (identity forward, all-reduce backward).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import comm

__all__ = [
    "copy_to_tp", "reduce_from_tp", "gather_from_sp", "reduce_scatter_to_sp",
    "ColumnParallelLinear", "RowParallelLinear", "SequenceParallelBlock",
    "ReferenceBlock", "token_dropout", "sp_shard",
]


# ------------------------------------------------------------------ operators
class _CopyToTP(torch.autograd.Function):
    """Identity forward; all-reduce of the gradient backward (Megatron's ``f``)."""

    @staticmethod
    def forward(ctx, x, group, op):
        ctx.group, ctx.op = group, op
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        return comm.all_reduce(dy.contiguous().clone(), ctx.group, op=ctx.op), None, None


class _ReduceFromTP(torch.autograd.Function):
    """All-reduce forward; identity backward (Megatron's ``g``)."""

    @staticmethod
    def forward(ctx, x, group):
        return comm.all_reduce(x.contiguous().clone(), group)

    @staticmethod
    def backward(ctx, dy):
        return dy, None


class _GatherFromSP(torch.autograd.Function):
    """All-gather along ``dim`` forward; reduce-scatter along ``dim`` backward."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return comm.all_gather(x, dim=dim, group=group)

    @staticmethod
    def backward(ctx, dy):
        return comm.reduce_scatter(dy, dim=ctx.dim, group=ctx.group), None, None


class _ReduceScatterToSP(torch.autograd.Function):
    """Reduce-scatter along ``dim`` forward; all-gather along ``dim`` backward."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return comm.reduce_scatter(x, dim=dim, group=group)

    @staticmethod
    def backward(ctx, dy):
        return comm.all_gather(dy, dim=ctx.dim, group=ctx.group), None, None


def copy_to_tp(x, group=None, op: str = "all_reduce"):
    """Enter a TP region: same ``x`` on every rank; backward sums the ranks' gradients.

    ``op`` labels the backward bytes (``"param_grad"`` for weights shared under SP).
    """
    return _CopyToTP.apply(x, group, op)


def reduce_from_tp(x, group=None):
    """Leave a TP region: sum the ranks' partial results (``(b, s, h)`` -> same shape)."""
    return _ReduceFromTP.apply(x, group)


def gather_from_sp(x, dim: int = 1, group=None):
    """SP -> TP region: ``(b, s/t, h)`` -> ``(b, s, h)``; backward reduce-scatters."""
    return _GatherFromSP.apply(x, dim, group)


def reduce_scatter_to_sp(x, dim: int = 1, group=None):
    """TP partial sums -> SP region: ``(b, s, h)`` partial -> ``(b, s/t, h)`` summed."""
    return _ReduceScatterToSP.apply(x, dim, group)


def sp_shard(x: torch.Tensor, group=None, dim: int = 1) -> torch.Tensor:
    """This rank's contiguous ``s/t`` tokens of a full ``(b, s, h)`` tensor (a copy, no comm)."""
    n, r = comm.group_size(group), comm.group_rank(group)
    if x.shape[dim] % n:
        raise ValueError(f"sequence parallelism splits s = {x.shape[dim]} tokens over t = {n} "
                         f"ranks: pad s to a multiple of {n}.")
    return x.chunk(n, dim=dim)[r].clone()


# ------------------------------------------------------------------- dropout
def _hash_uniform(idx: torch.Tensor, seed: int) -> torch.Tensor:
    """A uniform number in [0, 1) per int64 index: a few multiply-xorshift rounds mod 2^31."""
    m = 2**31 - 1
    x = (idx * 2654435761 + int(seed) * 40503 + 12345) % m   # < 2^31 * 2^32: no overflow
    for _ in range(3):
        x = (x * 48271) % m
        x = x ^ (x >> 13)
        x = (x * 69621 + 1) % m
    return x.to(torch.float64) / m


def token_dropout(x: torch.Tensor, p: float, seed: int, positions: torch.Tensor,
                  seq_len: int) -> torch.Tensor:
    """Dropout whose mask depends only on (seed, batch row, global token, feature).

    ``x``: ``(b, s_local, h)``; ``positions``: the ``s_local`` global token ids of
    this rank; ``seq_len``: the full ``s``. So a token is dropped the same way
    whether its row sits on one rank (TP) or was split over ranks (SP), and in the
    single-process reference. Kept values are scaled by ``1 / (1 - p)``.
    """
    if p == 0.0:
        return x
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout p must be in [0, 1), got {p}")
    b, _, h = x.shape
    bi = torch.arange(b, dtype=torch.int64)[:, None, None]
    ti = positions.to(torch.int64)[None, :, None]
    fi = torch.arange(h, dtype=torch.int64)[None, None, :]
    keep = _hash_uniform((bi * seq_len + ti) * h + fi, seed) >= p
    return x * keep.to(device=x.device, dtype=x.dtype) / (1.0 - p)


# ------------------------------------------------------------------- linears
class ColumnParallelLinear(nn.Module):
    """``y = x W^T + b`` with the rows of ``W`` (output columns of ``y``) split over ranks.

    Built from the full ``weight`` ``(out, in)`` and ``bias`` ``(out,)``; rank ``r``
    keeps rows ``r out/t .. (r+1) out/t``. Input: ``(b, s, in)`` (TP, replicated) or
    ``(b, s/t, in)`` (SP: all-gathered here first). Output: ``(b, s, out/t)``.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 sequence_parallel: bool = False, group=None):
        super().__init__()
        n, r = comm.group_size(group), comm.group_rank(group)
        out = weight.shape[0]
        if out % n:
            raise ValueError(f"ColumnParallelLinear: {out} output features do not split over "
                             f"t = {n} ranks; use a multiple of {n}.")
        rows = slice(r * out // n, (r + 1) * out // n)
        self.weight = nn.Parameter(weight.detach()[rows].clone())
        self.bias = None if bias is None else nn.Parameter(bias.detach()[rows].clone())
        self.sequence_parallel, self.group = sequence_parallel, group

    def forward(self, x):
        if self.sequence_parallel:
            x = gather_from_sp(x, dim=1, group=self.group)   # (b, s/t, in) -> (b, s, in)
        else:
            x = copy_to_tp(x, self.group)                    # (b, s, in), dx all-reduced
        return F.linear(x, self.weight, self.bias)           # (b, s, out/t)


class RowParallelLinear(nn.Module):
    """``y = x W^T + b`` with the columns of ``W`` (input features) split over ranks.

    Input: ``(b, s, in/t)`` (the output of a column-parallel layer). Each rank
    computes a partial ``(b, s, out)``; TP all-reduces it, SP reduce-scatters it to
    ``(b, s/t, out)``. The bias is added after the sum; under SP it acts on this
    rank's tokens only, so its gradient is all-reduced (``copy_to_tp``).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 sequence_parallel: bool = False, group=None):
        super().__init__()
        n, r = comm.group_size(group), comm.group_rank(group)
        inp = weight.shape[1]
        if inp % n:
            raise ValueError(f"RowParallelLinear: {inp} input features do not split over "
                             f"t = {n} ranks; use a multiple of {n}.")
        cols = slice(r * inp // n, (r + 1) * inp // n)
        self.weight = nn.Parameter(weight.detach()[:, cols].clone())
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())
        self.sequence_parallel, self.group = sequence_parallel, group

    def forward(self, x):
        partial = F.linear(x, self.weight)                   # (b, s, out), partial sum
        if self.sequence_parallel:
            y = reduce_scatter_to_sp(partial, dim=1, group=self.group)   # (b, s/t, out)
            bias = None if self.bias is None else copy_to_tp(self.bias, self.group, op="param_grad")
        else:
            y = reduce_from_tp(partial, self.group)          # (b, s, out)
            bias = self.bias
        return y if bias is None else y + bias


# -------------------------------------------------------------------- blocks
class ReferenceBlock(nn.Module):
    """Single-process block: ``x + dropout(W2 gelu(W1 LN(x) + b1) + b2)``, ``x`` ``(b, s, h)``.

    Weights are drawn from a generator seeded with ``seed``, so every rank can
    build the same full block; LayerNorm weights are not all ones, so their
    gradients are a real test.
    """

    def __init__(self, h: int, ffn: int, p: float = 0.0, seed: int = 0,
                 dropout_seed: int = 1234, dtype=torch.float32, eps: float = 1e-5):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        rnd = lambda *shape: torch.randn(*shape, generator=g, dtype=dtype)  # noqa: E731
        self.ln = nn.LayerNorm(h, eps=eps, dtype=dtype)
        self.fc1 = nn.Linear(h, ffn, dtype=dtype)
        self.fc2 = nn.Linear(ffn, h, dtype=dtype)
        with torch.no_grad():
            self.ln.weight.copy_(1 + 0.1 * rnd(h))
            self.ln.bias.copy_(0.1 * rnd(h))
            self.fc1.weight.copy_(rnd(ffn, h) / math.sqrt(h))
            self.fc1.bias.copy_(0.1 * rnd(ffn))
            self.fc2.weight.copy_(rnd(h, ffn) / math.sqrt(ffn))
            self.fc2.bias.copy_(0.1 * rnd(h))
        self.p, self.dropout_seed = p, dropout_seed

    def forward(self, x):
        y = self.fc2(F.gelu(self.fc1(self.ln(x))))
        s = x.shape[1]
        return x + token_dropout(y, self.p, self.dropout_seed, torch.arange(s), s)


class SequenceParallelBlock(nn.Module):
    """LayerNorm -> column-parallel Linear -> GELU -> row-parallel Linear -> dropout -> residual.

    ``sequence_parallel=False`` (TP): input and output ``(b, s, h)``, the same on
    every rank; one all-reduce forward (after the row-parallel matmul) and one
    backward (``copy_to_tp`` before the column-parallel one).
    ``sequence_parallel=True`` (TP + SP): input and output ``(b, s/t, h)``, rank
    ``r`` holding tokens ``r s/t .. (r+1) s/t - 1`` (see :func:`sp_shard`); an
    all-gather and a reduce-scatter in each direction instead, same bytes.
    The weights come from ``reference`` (a :class:`ReferenceBlock`, else one is built
    from ``seed``), so the result matches it exactly, gradients included.
    ``check_shapes``: under SP, first check that every rank holds a shard of the same
    shape (a clear ValueError instead of a hang); turn off when timing.
    """

    def __init__(self, h: int, ffn: int, sequence_parallel: bool = False, p: float = 0.0,
                 group=None, seed: int = 0, dropout_seed: int = 1234, dtype=torch.float32,
                 reference: ReferenceBlock | None = None, eps: float = 1e-5,
                 check_shapes: bool = True):
        super().__init__()
        n = comm.group_size(group)
        if ffn % n:
            raise ValueError(f"ffn = {ffn} must be a multiple of the TP degree t = {n}")
        ref = reference if reference is not None else ReferenceBlock(
            h, ffn, p, seed=seed, dropout_seed=dropout_seed, dtype=dtype, eps=eps)
        if ref.fc1.weight.shape != (ffn, h):
            raise ValueError(f"reference block has fc1 {tuple(ref.fc1.weight.shape)}, "
                             f"expected ({ffn}, {h})")
        self.ln = nn.LayerNorm(h, eps=ref.ln.eps, dtype=ref.ln.weight.dtype)
        with torch.no_grad():
            self.ln.weight.copy_(ref.ln.weight)
            self.ln.bias.copy_(ref.ln.bias)
        self.fc1 = ColumnParallelLinear(ref.fc1.weight, ref.fc1.bias, sequence_parallel, group)
        self.fc2 = RowParallelLinear(ref.fc2.weight, ref.fc2.bias, sequence_parallel, group)
        self.sequence_parallel, self.group = sequence_parallel, group
        self.p, self.dropout_seed = ref.p, ref.dropout_seed
        self.check_shapes = check_shapes

    def forward(self, x):
        n, r = comm.group_size(self.group), comm.group_rank(self.group)
        if x.dim() != 3 or x.shape[-1] != self.ln.normalized_shape[0]:
            raise ValueError(f"expected x of shape (b, s, {self.ln.normalized_shape[0]}), "
                             f"got {tuple(x.shape)}")
        if self.sequence_parallel:
            if self.check_shapes:   # one tiny all-gather ("metadata" bytes)
                comm.check_same_shape(x, self.group, "the SP input shard")
            c = x.shape[1]                                   # s/t tokens of this rank
            s, positions = c * n, torch.arange(r * c, (r + 1) * c)
            # LN acts on this rank's tokens only: its weight gradients are partial sums
            w = copy_to_tp(self.ln.weight, self.group, op="param_grad")
            bias = copy_to_tp(self.ln.bias, self.group, op="param_grad")
            z = F.layer_norm(x, self.ln.normalized_shape, w, bias, self.ln.eps)  # (b, s/t, h)
        else:
            s, positions = x.shape[1], torch.arange(x.shape[1])
            z = self.ln(x)                                   # (b, s, h), replicated
        y = self.fc2(F.gelu(self.fc1(z)))                    # (b, s/t or s, h)
        return x + token_dropout(y, self.p, self.dropout_seed, positions, s)


def run(args) -> int:
    """``python -m lesson10 run sp --nproc N [--seq S --heads A --dim D --dtype ...]``:
    TP and TP + SP against one process, with the bytes of each (h = heads * dim)."""
    from ._workers import cli_run
    return cli_run("sp", args)
