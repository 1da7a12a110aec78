"""Ring attention (context parallelism) on torch.distributed, forward and backward.

Each of the ``N_c`` ranks holds ``c = s/N_c`` tokens of Q, K and V, shape
``(b, c, a, d)`` (K/V: ``a_kv`` heads, GQA), in the layout's order (see
:func:`lesson10.spmd.shard.shard_sequence`). Queries stay; K/V blocks travel: in
round ``k`` rank ``r`` holds the K/V of rank ``(r - k) mod N_c``, computes the
attention of its queries against it with a fused kernel that returns the lse, and
merges the result into its running ``(out, lse)`` with the lse formula (float32,
NaN-free). Meanwhile the block moves on to rank ``r + 1`` (``batch_isend_irecv``),
so the transfer hides behind the compute when ``c >= F/W``.

Causal masks skip what is fully masked:

* contiguous: round 0 is the diagonal block (causal); a block from an earlier rank
  (``j < r``) is fully visible; one from a later rank (``j > r``) is skipped, so rank
  ``N_c-1`` works every round and rank 0 only in round 0 (ring time ``N_c - 1/2``);
* zigzag (rank ``r`` holds chunks ``r`` and ``2N_c-1-r``): round 0 is causal on
  the local tokens; for ``j < r`` all queries see the early K/V chunk ``j`` and none
  sees the late one; for ``j > r`` only the late query chunk sees anything, and it
  sees both K/V chunks. Every rank does half a block per round: ring time ``N_c/2``.

Backward recomputes every block from the saved final ``(out, lse)``; ``dQ`` stays,
and ``dK``/``dV`` accumulators travel around the ring with K/V, picking up each
rank's share, and arrive back home after ``N_c`` hops.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from .attention import _check_float, local_attention, local_attention_backward, merge
from .comm import record

__all__ = ["RingComm", "ring_attention", "RingAttention", "ring_blocks"]

RING_LAYOUTS = ("contiguous", "zigzag")


# ------------------------------------------------------------------ communicator
class _Shift:
    """An in-flight shift: ``wait()`` then read ``received`` (same shapes as sent)."""

    def __init__(self, handles, sent, received):
        self.handles, self.sent, self.received = handles, sent, received

    def wait(self):
        for h in self.handles:
            h.wait()
        self.handles = []
        return self.received


class RingComm:
    """Point-to-point ring inside ``group``: send to rank ``r+1``, receive from ``r-1``."""

    def __init__(self, group=None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        to_global = (lambda i: i) if group is None else (lambda i: dist.get_global_rank(group, i))
        self.next = to_global((self.rank + 1) % self.size)
        self.prev = to_global((self.rank - 1) % self.size)

    def shift(self, tensors, tag: int = 0) -> _Shift:
        """Start sending every tensor to ``r+1`` and receiving as many from ``r-1`` (async).

        Returns a :class:`_Shift`; the sent tensors must not change until ``wait()``.
        Every sent byte is recorded as ``"p2p"`` in :func:`lesson10.spmd.comm.count_bytes`.
        """
        sent = [t.contiguous() for t in tensors]
        received = [torch.empty_like(t) for t in sent]
        ops = []
        for i, (t, buf) in enumerate(zip(sent, received)):
            ops.append(dist.P2POp(dist.isend, t, self.next, self.group, tag + i))
            ops.append(dist.P2POp(dist.irecv, buf, self.prev, self.group, tag + i))
            record("p2p", t.numel() * t.element_size())
        return _Shift(dist.batch_isend_irecv(ops), sent, received)


# -------------------------------------------------------------------- the plan
def ring_blocks(layout: str, causal: bool, rank: int, src: int, c: int):
    """The blocks rank ``rank`` computes against the K/V of rank ``src``.

    A list of ``(q_slice, kv_slice, causal)`` over the local ``c`` tokens; empty when
    everything is masked.
    """
    full = slice(0, c)
    if not causal:
        return [(full, full, False)]
    if src == rank:
        return [(full, full, True)]      # local tokens are in increasing order
    if layout == "contiguous":
        return [(full, full, False)] if src < rank else []
    half = c // 2
    if src < rank:
        return [(full, slice(0, half), False)]      # all queries vs the early K/V chunk
    return [(slice(half, c), full, False)]          # the late query chunk vs all K/V


def _acc_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check(q, k, v, layout, group, check_ranks):
    _check_float(q=q, k=k, v=v)
    if layout not in RING_LAYOUTS:
        raise ValueError(f"ring_attention supports layout in {RING_LAYOUTS}, got {layout!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be a local shard of shape (b, s/N_c, a, d), got {tuple(t.shape)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(
            f"q {tuple(q.shape)} and k/v {tuple(k.shape)} must agree in batch, local sequence "
            "length and head dim")
    if k.shape[2] == 0 or q.shape[2] % k.shape[2]:
        raise ValueError(
            f"the number of query heads ({q.shape[2]}) must be a multiple of the number of K/V "
            f"heads ({k.shape[2]}) (GQA)")
    c = q.shape[1]
    if layout == "zigzag" and c % 2:
        raise ValueError(
            f"the zigzag layout gives each rank two chunks of c/2 tokens, so the local length c "
            f"must be even (s a multiple of 2*N_c); got c = {c}. Pad the sequence.")
    if check_ranks and dist.get_world_size(group) > 1:
        dev = q.device
        code = {torch.float64: 0, torch.float32: 1, torch.bfloat16: 2, torch.float16: 3}.get(q.dtype, 9)
        mine = torch.tensor([*q.shape, k.shape[2], code], dtype=torch.int64, device=dev)
        allv = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
        dist.all_gather(allv, mine, group=group)        # a few ints: not counted as traffic
        if any(not torch.equal(x, mine) for x in allv):
            shapes = [tuple(x.tolist()) for x in allv]
            raise ValueError(
                "ring_attention needs the same (b, c, a, d, a_kv, dtype) on every rank; got "
                f"{shapes}. Shard the sequence with shard_sequence() so every rank has s/N_c tokens.")


# ------------------------------------------------------------------- autograd
class RingAttention(torch.autograd.Function):
    """``out = ring_attention(q, k, v)`` with the ring backward (see the module doc)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, layout, group, overlap, scale, impl, timings):
        comm = RingComm(group)
        r, n, c = comm.rank, comm.size, q.shape[1]
        acc = _acc_dtype(q.dtype)
        out = lse = None
        kv = [k, v]
        for step in range(n):
            src = (r - step) % n
            t0 = time.perf_counter()
            pending = comm.shift(kv, tag=0) if step < n - 1 else None
            if pending is not None and not overlap:
                pending.wait()                         # transfer first, then compute
            t1 = time.perf_counter()
            for qs, ks, cz in ring_blocks(layout, causal, r, src, c):
                o_b, l_b = local_attention(q[:, qs], kv[0][:, ks], kv[1][:, ks], causal=cz,
                                           scale=scale, impl=impl)
                if out is None:                        # round 0 always covers every query
                    out, lse = o_b.to(acc), l_b.to(acc)
                else:
                    o_m, l_m = merge(out[:, qs], lse[:, :, qs].transpose(1, 2), o_b, l_b.transpose(1, 2))
                    out[:, qs] = o_m
                    lse[:, :, qs] = l_m.transpose(1, 2)
            t2 = time.perf_counter()
            if pending is not None:
                kv = pending.wait()
            t3 = time.perf_counter()
            if timings is not None:
                timings.append({"phase": "forward", "round": step, "compute_s": t2 - t1,
                                "wait_s": (t1 - t0) + (t3 - t2)})
        out_q = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out_q, lse)
        ctx.cfg = (causal, layout, group, overlap, scale, impl, timings)
        return out_q

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        causal, layout, group, overlap, scale, impl, timings = ctx.cfg
        comm = RingComm(group)
        r, n, c = comm.rank, comm.size, q.shape[1]
        acc = _acc_dtype(q.dtype)
        dout = dout.contiguous()
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        kv = [k, v]
        travelling = None                              # the dK/dV accumulators on their way
        for step in range(n):
            src = (r - step) % n
            t0 = time.perf_counter()
            pending = comm.shift(kv, tag=0) if step < n - 1 else None
            if pending is not None and not overlap:
                pending.wait()
            t1 = time.perf_counter()
            dk_b = torch.zeros(k.shape, dtype=acc, device=k.device)
            dv_b = torch.zeros(v.shape, dtype=acc, device=v.device)
            for qs, ks, cz in ring_blocks(layout, causal, r, src, c):
                g_q, g_k, g_v = local_attention_backward(
                    dout[:, qs], q[:, qs], kv[0][:, ks], kv[1][:, ks], out[:, qs],
                    lse[:, :, qs], causal=cz, scale=scale, impl=impl)
                dq[:, qs] += g_q
                dk_b[:, ks] += g_k
                dv_b[:, ks] += g_v
            t2 = time.perf_counter()
            if travelling is not None:                 # add our share to the arriving sums
                got_k, got_v = travelling.wait()
                dk_b += got_k
                dv_b += got_v
            t3 = time.perf_counter()
            travelling = comm.shift([dk_b, dv_b], tag=2)
            if not overlap:
                travelling.wait()
            if pending is not None:
                kv = pending.wait()
            t4 = time.perf_counter()
            if timings is not None:
                timings.append({"phase": "backward", "round": step, "compute_s": t2 - t1,
                                "wait_s": (t1 - t0) + (t4 - t2)})
        dk, dv = travelling.wait()                     # N_c hops: our own dK/dV, complete
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype),
                None, None, None, None, None, None, None)


def ring_attention(q, k, v, causal: bool = True, layout: str = "zigzag", group=None, *,
                   overlap: bool = True, scale=None, impl: str = "auto", check: bool = True,
                   timings: list | None = None):
    """Exact attention over the whole sequence from local shards, by a ring of K/V blocks.

    ``q``: ``(b, c, a, d)``, ``k``/``v``: ``(b, c, a_kv, d)``, this rank's ``c = s/N_c``
    tokens in ``layout`` order (``"zigzag"`` or ``"contiguous"``). Returns this rank's
    output ``(b, c, a, d)``; differentiable in ``q``, ``k``, ``v``.

    Bytes per rank: forward ``N_c - 1`` shifts of the compact K and V (``4ch/g`` in
    bf16); backward ``N_c - 1`` K/V shifts plus ``N_c`` dK/dV shifts (in float32 for
    low-precision inputs). ``overlap=False`` waits for each transfer before computing
    (for benchmarks). ``impl``: local kernel choice (see
    :func:`lesson10.spmd.attention.local_attention`). ``check``: one tiny all-gather
    that checks every rank passes the same shapes. ``timings``: a list that receives
    ``{"phase", "round", "compute_s", "wait_s"}`` per round.
    """
    layout = {"zig-zag": "zigzag", "zig_zag": "zigzag"}.get(layout, layout)
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("ring_attention runs inside a rank: use lesson10.spmd.launch or torchrun")
    _check(q, k, v, layout, group, check)
    return RingAttention.apply(q, k, v, bool(causal), layout, group, bool(overlap), scale, impl, timings)
