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
activation bytes (in the backward SP adds one re-gather, below). One more change: under SP
each rank applies the LayerNorm (and the row-parallel bias) to its own tokens only, so
their weight gradients are partial
sums and must be all-reduced over the TP group; we do it by passing those
weights through ``copy_to_tp`` (identity forward, all-reduce backward).

Under SP the column-parallel linear does not use ``gather_from_sp`` + ``F.linear``:
autograd would then keep the all-gathered input (all ``s`` tokens) on every rank
for the weight gradient. :class:`_SPColumnLinear` keeps only the rank's ``s/t``
shard and gathers it a second time in the backward (bytes under ``"ag_recompute"``),
while the input gradient is being computed, as Megatron-LM does: ``(t-1)/t`` of
``(b, s, h)`` more bytes per rank in the backward, for ``(t-1)/t`` of that tensor
less memory. The dropout mask is kept as ``bool`` (1 byte per element). With both,
every tensor a block saves per rank under SP is ``1/t`` of its TP-replicated
counterpart (see :func:`lesson10.cost.sp_block_activation_bytes`).
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
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


class _SeqCollective(torch.autograd.Function):
    """A sequence-dim collective and its dual: ``forward(x, dim, group, gather)`` all-gathers
    along ``dim`` (backward: reduce-scatter) when ``gather``, else reduce-scatters (backward:
    all-gather). Megatron's ``g`` and ``g-bar`` of sequence parallelism, one Function."""

    @staticmethod
    def forward(ctx, x, dim, group, gather):
        ctx.dim, ctx.group, ctx.gather = dim, group, gather
        move = comm.all_gather if gather else comm.reduce_scatter
        return move(x, dim=dim, group=group)

    @staticmethod
    def backward(ctx, dy):
        dual = comm.reduce_scatter if ctx.gather else comm.all_gather
        return dual(dy, dim=ctx.dim, group=ctx.group), None, None, None


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
    return _SeqCollective.apply(x, dim, group, True)


def reduce_scatter_to_sp(x, dim: int = 1, group=None):
    """TP partial sums -> SP region: ``(b, s, h)`` partial -> ``(b, s/t, h)`` summed."""
    return _SeqCollective.apply(x, dim, group, False)


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


class _MaskedScale(torch.autograd.Function):
    """``y = x * keep / (1 - p)``; saves only ``keep`` (``bool``, 1 byte per element)."""

    @staticmethod
    def forward(ctx, x, keep, p):
        ctx.save_for_backward(keep)
        ctx.p = p
        return x * keep / (1.0 - p)

    @staticmethod
    def backward(ctx, dy):
        (keep,) = ctx.saved_tensors
        return dy * keep / (1.0 - ctx.p), None, None


def token_dropout(x: torch.Tensor, p: float, seed: int, positions: torch.Tensor,
                  seq_len: int) -> torch.Tensor:
    """Dropout whose mask depends only on (seed, batch row, global token, feature).

    ``x``: ``(b, s_local, h)``; ``positions``: the ``s_local`` global token ids of
    this rank; ``seq_len``: the full ``s``. So a token is dropped the same way
    whether its row sits on one rank (TP) or was split over ranks (SP), and in the
    single-process reference. Kept values are scaled by ``1 / (1 - p)``. For the
    backward only the ``bool`` mask ``(b, s_local, h)`` is stored: 1 byte per element.
    """
    if p == 0.0:
        return x
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout p must be in [0, 1), got {p}")
    b, _, h = x.shape
    bi = torch.arange(b, dtype=torch.int64)[:, None, None]
    ti = positions.to(torch.int64)[None, :, None]
    fi = torch.arange(h, dtype=torch.int64)[None, None, :]
    keep = _hash_uniform((bi * seq_len + ti) * h + fi, seed) >= p      # bool
    return _MaskedScale.apply(x, keep.to(x.device), float(p))


# ------------------------------------------------------------------- linears
def _all_gather_start(x: torch.Tensor, group, op: str):
    """Start an all-gather of ``x`` (every rank the same shape); ``(work, parts)``.

    Bytes ``(n-1) x.nbytes`` go to :func:`comm.record` under ``op`` when it starts;
    ``torch.cat(parts, dim)`` after ``work.wait()`` is the gathered tensor.
    """
    n = comm.group_size(group)
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(n)]
    comm.record(op, (n - 1) * x.numel() * x.element_size(), to=comm.ring_next(group))
    return dist.all_gather(parts, x, group=group, async_op=True), parts


def _reduce_scatter_start(x: torch.Tensor, dim: int, group):
    """Start a reduce-scatter of ``x`` along ``dim``; ``(work or None, out)``.

    Same bytes and result as :func:`comm.reduce_scatter`; where the backend has no
    asynchronous reduce-scatter it runs that one synchronously (``work`` is None).
    """
    n = comm.group_size(group)
    chunks = [c.contiguous() for c in x.chunk(n, dim=dim)]
    out = torch.empty_like(chunks[0])
    try:
        work = dist.reduce_scatter(out, chunks, group=group, async_op=True)
    except RuntimeError as e:
        if "support" not in str(e).lower():
            raise
        return None, comm.reduce_scatter(x, dim=dim, group=group)
    comm.record("reduce_scatter", (n - 1) * x.numel() * x.element_size() // n,
                to=comm.ring_next(group))
    return work, out


class _SPColumnLinear(torch.autograd.Function):
    """Column-parallel ``y = all_gather_s(x) W_r^T + b_r`` that stores only the local ``x``.

    Shapes (``t`` ranks, rank ``r``): ``x`` ``(b, s/t, in)`` = tokens ``r s/t ..
    (r+1) s/t - 1``; ``W_r`` ``(out/t, in)``, ``b_r`` ``(out/t,)``: this rank's rows;
    ``X = all_gather_s(x)`` ``(b, s, in)``; ``y`` ``(b, s, out/t)``.

    Math. Forward ``y = X W_r^T + b_r``. Backward, from ``dy = dL/dy`` ``(b, s, out/t)``:

    * ``dX_r = dy W_r`` ``(b, s, in)`` is rank ``r``'s part of ``dL/dX``: every rank's
      output columns used all of ``X``, so ``dL/dX = sum_r dX_r``, and rank ``r`` needs
      only its own tokens of it: ``dx = reduce_scatter_s(dX_r)`` ``(b, s/t, in)``;
    * ``dW_r = dy^T X`` ``(out/t, in)`` (summed over batch and tokens) needs the full
      ``X``, which is not kept: it is all-gathered again from the saved ``x``
      (``(t-1)/t`` of ``X`` sent per rank, op name ``"ag_recompute"``);
    * ``db_r = sum over batch and tokens of dy``.

    Saved for the backward: ``x`` only (``s/t`` tokens; plain autograd around an
    all-gather would keep ``X``, ``s`` tokens). Order in the backward, to hide the
    extra all-gather: start it, compute ``dX_r`` meanwhile, wait, start the
    reduce-scatter of ``dX_r``, compute ``dW_r`` meanwhile, wait.

    Worked example, ``t = 2``, ``s = 4``, tokens ``x0 x1 x2 x3`` (each ``(in,)``), ``W``
    split into rows ``W_0`` (rank 0) and ``W_1`` (rank 1)::

        step               rank 0                        rank 1
        input (saved)      x0 x1                         x2 x3
        forward gather     X = x0 x1 x2 x3               X = x0 x1 x2 x3
        forward output     y = X W_0^T + b_0             y = X W_1^T + b_1
        kept until bwd     x0 x1                         x2 x3
        backward start     gather X again (async)        gather X again (async)
        meanwhile          dX_0 = dy W_0  (4 tokens)     dX_1 = dy W_1  (4 tokens)
        reduce-scatter     dx = (dX_0 + dX_1)[0:2]       dx = (dX_0 + dX_1)[2:4]
        meanwhile          dW_0 = dy^T X                 dW_1 = dy^T X

    Each rank sends ``(t-1)/t`` of ``X`` in the forward all-gather, the same again in
    the re-gather, and ``(t-1)/t`` of ``dX_r`` in the reduce-scatter.
    ``X`` lives only inside the forward and inside the backward, never in between.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, group):
        ctx.group, ctx.has_bias = group, bias is not None
        ctx.save_for_backward(x, weight)                       # x: (b, s/t, in) only
        full = comm.all_gather(x, dim=1, group=group)          # (b, s, in), not saved
        return F.linear(full, weight, bias)                    # (b, s, out/t)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dx = dw = db = None
        if need_w:                                             # re-gather X, overlapped
            gather, parts = _all_gather_start(x, ctx.group, "ag_recompute")
        if need_x:
            dX = dy.matmul(weight)                             # (b, s, in), partial sum
        if need_w:
            gather.wait()
        if need_x:
            rs, dx = _reduce_scatter_start(dX, 1, ctx.group)   # (b, s/t, in)
        if need_w:
            full = torch.cat(parts, dim=1)                     # (b, s, in)
            dw = dy.reshape(-1, dy.shape[-1]).t().matmul(full.reshape(-1, full.shape[-1]))
        if need_b and ctx.has_bias:
            db = dy.reshape(-1, dy.shape[-1]).sum(0)
        if need_x and rs is not None:
            rs.wait()
        return dx, dw, db, None


def _my_part(size: int, group, who: str, what: str) -> slice:
    """This rank's contiguous ``size/t`` of a weight dimension (a ValueError unless t divides it)."""
    n, r = comm.group_size(group), comm.group_rank(group)
    if size % n:
        raise ValueError(f"{who}: {size} {what} do not split over t = {n} ranks; use a "
                         f"multiple of {n}.")
    return slice(r * size // n, (r + 1) * size // n)


class ColumnParallelLinear(nn.Module):
    """``y = x W^T + b`` with the rows of ``W`` (output columns of ``y``) split over ranks.

    Built from the full ``weight`` ``(out, in)`` and ``bias`` ``(out,)``; rank ``r``
    keeps rows ``r out/t .. (r+1) out/t``. Input: ``(b, s, in)`` (TP, replicated) or
    ``(b, s/t, in)`` (SP: all-gathered here first; only the shard is kept for the
    backward, see :class:`_SPColumnLinear`). Output: ``(b, s, out/t)``.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 sequence_parallel: bool = False, group=None):
        super().__init__()
        rows = _my_part(weight.shape[0], group, "ColumnParallelLinear", "output features")
        self.weight = nn.Parameter(weight.detach()[rows].clone())
        self.bias = None if bias is None else nn.Parameter(bias.detach()[rows].clone())
        self.sequence_parallel, self.group = sequence_parallel, group

    def forward(self, x):
        if self.sequence_parallel:
            if comm.group_size(self.group) == 1:
                return F.linear(x, self.weight, self.bias)
            # (b, s/t, in) -> all-gather -> (b, s, out/t); stores only the s/t shard
            return _SPColumnLinear.apply(x, self.weight, self.bias, self.group)
        x = copy_to_tp(x, self.group)                        # (b, s, in), dx all-reduced
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
        cols = _my_part(weight.shape[1], group, "RowParallelLinear", "input features")
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
        rnd = lambda *shape: torch.randn(*shape, generator=g, dtype=dtype)
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
    all-gather and a reduce-scatter in each direction instead, same bytes, plus in the
    backward one more all-gather of the LN output (``"ag_recompute"``, ``(t-1)/t`` of
    ``(b, s, h)``), because only its ``s/t`` shard is kept (:class:`_SPColumnLinear`).
    The weights come from ``reference`` (a :class:`ReferenceBlock`, else one is built
    from ``seed``), so the result matches it exactly, gradients included.
    Under SP the forward first checks that every rank holds a shard of the same shape
    (a clear ValueError instead of a hang; ``"metadata"`` bytes).
    """

    def __init__(self, h: int, ffn: int, sequence_parallel: bool = False, p: float = 0.0,
                 group=None, seed: int = 0, dropout_seed: int = 1234, dtype=torch.float32,
                 reference: ReferenceBlock | None = None, eps: float = 1e-5):
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

    def forward(self, x):
        n, r = comm.group_size(self.group), comm.group_rank(self.group)
        if x.dim() != 3 or x.shape[-1] != self.ln.normalized_shape[0]:
            raise ValueError(f"expected x of shape (b, s, {self.ln.normalized_shape[0]}), "
                             f"got {tuple(x.shape)}")
        if self.sequence_parallel:
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
