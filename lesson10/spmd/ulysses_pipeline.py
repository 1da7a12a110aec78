"""Ulysses with one all-to-all for Q, K and V, pipelined by head groups.

The plain Ulysses (:mod:`lesson10.spmd.ulysses`) sends Q, K and V in three all-to-alls and
waits for each. Here a rank's heads are cut into ``G`` head groups; group ``j`` of rank
``r`` is the query heads ``r a/N_c + j a/(N_c G) ..`` and the K/V heads they read,
``r n_kv/N_c + j n_kv/(N_c G) ..`` (GQA stays compact). Per group one buffer carries Q, K
and V packed side by side along the head dim, and one ``all_to_all_single`` moves it. All
``G`` exchanges are posted at once (``async_op=True``): while group ``j`` attends, group
``j+1`` is still on the wire, and the output of group ``j`` goes back while group ``j+1``
attends. The backward does the same with ``dout`` and with ``dQ, dK, dV`` packed together.

Buffer layout ``(N_c, c, b, P, d)``: block ``r`` goes to (comes from) rank ``r``; ``P`` is
the packed width (the heads of every tensor, side by side). A received buffer read as
``(b, N_c c, P, d)`` is a view (no copy): rows in rank order, the global ids
``concat(positions)``, as in the plain version. Outputs and gradients are those of the
plain version, bitwise: the same kernel on the same numbers.

:func:`ulysses_timings` adds the seconds of each part (packing copies, waiting for an
all-to-all, the attention kernels) to a dict, for ``bench ulysses --breakdown``.
"""
from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist

from . import comm
from .attention import local_attention, local_attention_backward

__all__ = ["PipelinedUlysses", "check_head_groups", "ulysses_timings", "clock"]

_CLOCK: list = [None]          # the dict of an open ulysses_timings(), else None


@contextlib.contextmanager
def ulysses_timings(acc: dict):
    """Inside the block, every Ulysses call adds its parts' seconds to ``acc`` (keys like
    ``"fwd wait"``, ``"bwd attention"``, ``"fwd copies"``)."""
    old, _CLOCK[0] = _CLOCK[0], acc
    try:
        yield acc
    finally:
        _CLOCK[0] = old


@contextlib.contextmanager
def clock(key: str):
    """Time the block into the open :func:`ulysses_timings` dict under ``key`` (else no-op)."""
    acc = _CLOCK[0]
    if acc is None:
        yield
        return
    t0 = time.perf_counter()
    try:
        yield
    finally:
        acc[key] = acc.get(key, 0.0) + time.perf_counter() - t0


def check_head_groups(groups, heads: int, kv_heads: int, n: int) -> int:
    """``groups`` as an int dividing both the ``heads/n`` query heads and the ``kv_heads/n``
    K/V heads of a rank (a ValueError that says which values work, otherwise)."""
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"head_groups must be a positive int, got {groups!r}")
    per_q, per_kv = heads // n, kv_heads // n
    if per_q % groups or per_kv % groups:
        ok = [g for g in range(1, per_kv + 1) if per_q % g == 0 and per_kv % g == 0]
        raise ValueError(f"head_groups = {groups} must divide the {per_q} query heads and the "
                         f"{per_kv} K/V heads of each of the N_c = {n} ranks; use one of {ok}")
    return groups


# ----------------------------------------------------------------- the buffers
def _heads_send(ts, n: int, groups: int, j: int) -> torch.Tensor:
    """``(b, c, H_t, d)`` each -> the send buffer ``(n, c, b, sum_t H_t/(n G), d)`` of head
    group ``j``: block ``r`` holds rank ``r``'s heads of that group, every tensor's side by
    side. One copy per tensor (``torch.cat`` of permuted views)."""
    parts = [t.unflatten(2, (n, groups, -1))[:, :, :, j].permute(2, 1, 0, 3, 4) for t in ts]
    return torch.cat(parts, dim=3)


def _seq_send(ts, n: int) -> torch.Tensor:
    """``(b, n c, h_t, d)`` each (rows in rank order) -> ``(n, c, b, sum_t h_t, d)``: block
    ``r`` holds rank ``r``'s ``c`` rows. One copy per tensor."""
    return torch.cat([t.unflatten(1, (n, -1)).permute(1, 2, 0, 3, 4) for t in ts], dim=3)


def _as_rows(recv: torch.Tensor, widths) -> tuple:
    """Received ``(n, c, b, P, d)`` -> views ``(b, n c, w, d)``, one per width in ``widths``
    (``sum(widths) = P``): no copy."""
    return torch.split(recv.flatten(0, 1).permute(1, 0, 2, 3), list(widths), dim=2)


def _scatter_heads(recv: torch.Tensor, outs, n: int, groups: int, j: int) -> None:
    """Received ``(n, c, b, P, d)`` (block ``r``: rank ``r``'s heads of group ``j`` for this
    rank's tokens) -> written into ``outs`` ``(b, c, H_t, d)`` each, at those heads."""
    off = 0
    for out in outs:
        dst = out.unflatten(2, (n, groups, -1))[:, :, :, j]          # (b, c, n, H_t/(n G), d)
        w = dst.shape[3]
        dst.copy_(recv[:, :, :, off:off + w].permute(2, 1, 0, 3, 4))
        off += w


def _post(send: torch.Tensor, group):
    """Start the all-to-all of ``send`` ``(n, ...)`` (block ``r`` to rank ``r``); returns
    ``(recv, work)``, ``recv`` valid after ``work.wait()`` (``work`` None on one rank).
    Bytes as :func:`lesson10.spmd.comm.all_to_all_single` counts them."""
    n, r = comm.group_size(group), comm.group_rank(group)
    block = send[0].numel() * send.element_size()
    comm.record("all_to_all", (n - 1) * block, kind="all_to_all",
                to={comm.global_rank(i, group): block for i in range(n) if i != r})
    if n == 1:
        return send, None
    recv = torch.empty_like(send)
    return recv, dist.all_to_all_single(recv, send, group=group, async_op=True)


def _wait(posted, key: str) -> torch.Tensor:
    recv, work = posted
    if work is not None:
        with clock(key):
            work.wait()
    return recv


def _rows(t: torch.Tensor, idx):
    """``t[:, idx]`` (``idx`` None: ``t`` itself): rows to another token order."""
    return t if idx is None else t[:, idx]


# ------------------------------------------------------------------ the function
class PipelinedUlysses(torch.autograd.Function):
    """``PipelinedUlysses.apply(q, k, v, perm, causal, scale, impl, group, groups)``: local
    ``q (b, c, a, d)``, ``k``/``v`` ``(b, c, n_kv, d)`` -> the output shard ``(b, c, a, d)``.

    ``perm``: ``None`` when the received rows are in token order already (contiguous
    layout, or no mask), else ``(inv, order)``: rows ``inv`` are the tokens in order, and
    ``order`` takes the kernel's output back to the rows' order."""

    @staticmethod
    def forward(ctx, q, k, v, perm, causal, scale, impl, group, groups):
        n = comm.group_size(group)
        inv, order = perm if perm is not None else (None, None)
        with clock("fwd copies"):
            posted = [_post(_heads_send((q, k, v), n, groups, j), group) for j in range(groups)]
        widths = (q.shape[2] // (n * groups), k.shape[2] // (n * groups), v.shape[2] // (n * groups))
        saved, back = [], []
        for j in range(groups):
            recv = _wait(posted[j], "fwd q/k/v all-to-all wait")
            with clock("fwd copies"):
                qh, kh, vh = (_rows(t, inv) for t in _as_rows(recv, widths))  # (b, s, ./(N G), d)
            with clock("fwd attention"):
                o, lse = local_attention(qh, kh, vh, causal=causal, scale=scale, impl=impl)
            saved += [qh, kh, vh, o, lse]
            with clock("fwd copies"):
                back.append(_post(_seq_send([_rows(o, order)], n), group))
        out = q.new_empty(q.shape)
        for j in range(groups):
            recv = _wait(back[j], "fwd output all-to-all wait")
            with clock("fwd copies"):
                _scatter_heads(recv, [out], n, groups, j)
        ctx.save_for_backward(*saved)
        ctx.cfg = (perm, causal, scale, impl, group, groups, k.shape, v.shape)
        return out

    @staticmethod
    def backward(ctx, dout):
        perm, causal, scale, impl, group, groups, k_shape, v_shape = ctx.cfg
        inv, order = perm if perm is not None else (None, None)
        n, saved = comm.group_size(group), ctx.saved_tensors
        with clock("bwd copies"):
            posted = [_post(_heads_send((dout,), n, groups, j), group) for j in range(groups)]
        back = []
        for j in range(groups):
            qh, kh, vh, o, lse = saved[5 * j:5 * j + 5]
            recv = _wait(posted[j], "bwd dout all-to-all wait")
            with clock("bwd copies"):
                (do,) = _as_rows(recv, [qh.shape[2]])
                do = _rows(do, inv)
            with clock("bwd attention"):
                grads = local_attention_backward(do, qh, kh, vh, o, lse, causal=causal,
                                                 scale=scale, impl=impl)
            with clock("bwd copies"):
                back.append(_post(_seq_send([_rows(g, order) for g in grads], n), group))
        dq = dout.new_empty(dout.shape)
        dk, dv = dout.new_empty(k_shape), dout.new_empty(v_shape)
        for j in range(groups):
            recv = _wait(back[j], "bwd dq/dk/dv all-to-all wait")
            with clock("bwd copies"):
                _scatter_heads(recv, [dq, dk, dv], n, groups, j)
        return dq, dk, dv, None, None, None, None, None, None


def time_backward(out: torch.Tensor, inp: torch.Tensor, key: str) -> None:
    """With :func:`ulysses_timings` open: add to ``key`` the seconds autograd spends from
    ``out``'s gradient to ``inp``'s (one differentiable step's backward)."""
    acc = _CLOCK[0]
    if acc is None or not (out.requires_grad and inp.requires_grad):
        return
    start: list = []
    out.register_hook(lambda g: start.append(time.perf_counter()))
    inp.register_hook(lambda g: acc.__setitem__(
        key, acc.get(key, 0.0) + time.perf_counter() - (start.pop() if start else time.perf_counter())))
