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
from contextlib import contextmanager

import torch
import torch.distributed as dist

from ..layouts import layout_name, shard_positions
from .attention import (_check_float, check_doc_ids, local_attention, local_attention_backward,
                        merge, visible_mask)
from . import comm
from .comm import record
from .launch import synchronize_device

__all__ = ["RingComm", "ring_options", "ring_attention", "RingAttention", "ring_blocks"]

RING_LAYOUTS = ("contiguous", "zigzag")


# ------------------------------------------------------------------ communicator
class _Shift:
    """An in-flight shift: ``wait()`` then read ``received`` (same shapes as sent).
    ``done_at``: with a paced link, the ``perf_counter`` time before which ``wait()`` does
    not return (the transfer's start plus bytes / bandwidth)."""

    def __init__(self, handles, sent, received, done_at: float = 0.0):
        self.handles, self.sent, self.received = handles, sent, received
        self.done_at = done_at

    def wait(self):
        for h in self.handles:
            h.wait()
        self.handles = []
        self.sent = None                    # sent: the sender may drop its block now
        left = self.done_at - time.perf_counter()
        if left > 0:                                   # the emulated link is still busy
            time.sleep(left)
        return self.received


class RingComm:
    """Point-to-point ring inside ``group``: send to rank ``r+1``, receive from ``r-1``.

    Two knobs for experiments live here, not in ``ring_attention``'s signature; set them
    with :func:`ring_options` around a call (the backward reuses the forward's values):

    * ``overlap`` (default True): start each transfer before the round's compute; False
      waits for it first, so nothing hides (benchmark 2 of ``bench ring``);
    * ``timings``: a list that receives ``{"phase", "round", "compute_s", "wait_s"}``
      per round; ``wait_s`` is the communication the compute did not hide. On CUDA each
      clock read then first waits for the GPU (``torch.cuda.synchronize``), so the times are
      the kernels' and the transfers', not their launches' (only while timing: a sync per
      round costs overlap);
    * ``bandwidth`` (bytes/s, default None = as fast as the backend): emulate a slower
      link. A shift of ``B`` bytes (all its tensors) is not complete before ``B /
      bandwidth`` seconds after it started: ``wait()`` sleeps for what is left. Compute
      in between hides that time, as on a real link (the c* experiment, ``bench cstar``).
    """

    def __init__(self, group=None, overlap: bool = True, timings: list | None = None,
                 bandwidth: float | None = None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        to_global = (lambda i: i) if group is None else (lambda i: dist.get_global_rank(group, i))
        self.next = to_global((self.rank + 1) % self.size)
        self.prev = to_global((self.rank - 1) % self.size)
        self.overlap, self.timings, self.bandwidth = overlap, timings, bandwidth

    def shift(self, tensors, tag: int = 0) -> _Shift:
        """Start sending every tensor to ``r+1`` and receiving as many from ``r-1`` (async).

        Returns a :class:`_Shift`; the sent tensors must not change until ``wait()``.
        Every sent byte is recorded as ``"p2p"`` in :func:`lesson10.spmd.comm.count_bytes`.
        Without overlap the transfer completes before this returns.
        """
        sent = [t.contiguous() for t in tensors]
        if self.size == 1:                             # a ring of one: the block stays here
            return _Shift([], sent, [t.clone() for t in sent])
        received = [torch.empty_like(t) for t in sent]
        ops = []
        nbytes = 0
        for i, (t, buf) in enumerate(zip(sent, received)):
            ops.append(dist.P2POp(dist.isend, t, self.next, self.group, tag + i))
            ops.append(dist.P2POp(dist.irecv, buf, self.prev, self.group, tag + i))
            record("p2p", t.numel() * t.element_size())
            nbytes += t.numel() * t.element_size()
        start = time.perf_counter()
        done_at = start + nbytes / self.bandwidth if self.bandwidth else 0.0
        shift = _Shift(dist.batch_isend_irecv(ops), sent, received, done_at)
        if not self.overlap:
            shift.wait()
        return shift

    def clock(self, like: torch.Tensor) -> float:
        """``perf_counter()``; while recording timings, after the GPU work of ``like``'s device."""
        if self.timings is not None:
            synchronize_device(like)
        return time.perf_counter()

    def log(self, phase: str, step: int, compute_s: float, wait_s: float) -> None:
        if self.timings is not None:
            self.timings.append({"phase": phase, "round": step, "compute_s": compute_s,
                                 "wait_s": wait_s})


_OPTIONS = {"overlap": True, "timings": None, "bandwidth": None}


@contextmanager
def ring_options(overlap: bool = True, timings: list | None = None, bandwidth: float | None = None):
    """Run the ring attention calls inside the ``with`` block with these
    :class:`RingComm` settings (see there); restored afterwards."""
    if bandwidth is not None and (isinstance(bandwidth, bool) or not isinstance(bandwidth, (int, float))
                                  or not bandwidth > 0 or bandwidth == float("inf")):
        raise ValueError(f"bandwidth must be a finite number of bytes/s > 0 (or None: the "
                         f"backend's own speed), got {bandwidth!r}")
    old = dict(_OPTIONS)
    _OPTIONS.update(overlap=bool(overlap), timings=timings, bandwidth=bandwidth)
    try:
        yield
    finally:
        _OPTIONS.update(old)


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


def _doc_plan(layout: str, causal: bool, doc, n: int, c: int, device):
    """With a document mask: ``plan(rank, src)`` -> blocks ``(q_slice, kv_slice, kwargs)``
    over the whole local block, with the global positions and ``doc_ids`` for the mask, or
    ``[]`` when no query of ``rank`` sees any key of ``src`` (the block is skipped)."""
    pos = [torch.as_tensor(p, dtype=torch.long, device=device)
           for p in shard_positions(n * c, n, layout)]
    full = slice(0, c)

    def plan(rank, src):
        mask = visible_mask(pos[rank], pos[src], causal, doc_ids=doc)
        if not bool(mask.any()):
            return []
        return [(full, full, dict(causal=causal, q_pos=pos[rank], k_pos=pos[src], doc_ids=doc))]
    return plan


def _layout_plan(layout: str, causal: bool, c: int):
    def plan(rank, src):
        return [(qs, ks, dict(causal=cz)) for qs, ks, cz in ring_blocks(layout, causal, rank, src, c)]
    return plan


def _acc_dtype(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check(q, k, v, layout, group):
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
    comm.check_same_shape(q, group, "ring_attention: q")
    comm.check_same_shape(k, group, "ring_attention: k")


# ------------------------------------------------------------------- autograd
class RingAttention(torch.autograd.Function):
    """``out = ring_attention(q, k, v)`` with the ring backward (see the module doc)."""

    @staticmethod
    def forward(ctx, q, k, v, causal, layout, group, scale, impl, doc):
        ring = RingComm(group, **_OPTIONS)
        r, n, c = ring.rank, ring.size, q.shape[1]
        plan = _layout_plan(layout, causal, c) if doc is None else \
            _doc_plan(layout, causal, doc, n, c, q.device)
        acc = _acc_dtype(q.dtype)
        out = lse = None
        kv = [k, v]
        for step in range(n):
            src = (r - step) % n
            t0 = ring.clock(q)
            pending = ring.shift(kv, tag=0) if step < n - 1 else None
            t1 = ring.clock(q)
            for qs, ks, kw in plan(r, src):
                o_b, l_b = local_attention(q[:, qs], kv[0][:, ks], kv[1][:, ks], scale=scale,
                                           impl=impl, **kw)
                if out is None:       # round 0 covers every query (each sees itself)
                    out, lse = o_b.to(acc), l_b.to(acc)
                else:
                    o_m, l_m = merge(out[:, qs], lse[:, :, qs].transpose(1, 2), o_b, l_b.transpose(1, 2))
                    out[:, qs] = o_m
                    lse[:, :, qs] = l_m.transpose(1, 2)
            t2 = ring.clock(q)
            if pending is not None:
                kv = pending.wait()
            ring.log("forward", step, t2 - t1, (t1 - t0) + (ring.clock(q) - t2))
        out_q = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out_q, lse)
        ctx.cfg = (causal, layout, group, scale, impl, ring.overlap, ring.timings, doc,
                   ring.bandwidth)
        return out_q

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        causal, layout, group, scale, impl, overlap, timings, doc, bandwidth = ctx.cfg
        ring = RingComm(group, overlap, timings, bandwidth)
        r, n, c = ring.rank, ring.size, q.shape[1]
        plan = _layout_plan(layout, causal, c) if doc is None else \
            _doc_plan(layout, causal, doc, n, c, q.device)
        acc = _acc_dtype(q.dtype)
        dout = dout.contiguous()
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        kv = [k, v]
        travelling = None                              # the dK/dV accumulators on their way
        for step in range(n):
            src = (r - step) % n
            t0 = ring.clock(q)
            pending = ring.shift(kv, tag=0) if step < n - 1 else None
            t1 = ring.clock(q)
            dk_b = torch.zeros(k.shape, dtype=acc, device=k.device)
            dv_b = torch.zeros(v.shape, dtype=acc, device=v.device)
            for qs, ks, kw in plan(r, src):
                g_q, g_k, g_v = local_attention_backward(
                    dout[:, qs], q[:, qs], kv[0][:, ks], kv[1][:, ks], out[:, qs],
                    lse[:, :, qs], scale=scale, impl=impl, **kw)
                dq[:, qs] += g_q
                dk_b[:, ks] += g_k
                dv_b[:, ks] += g_v
            t2 = ring.clock(q)
            if travelling is not None:                 # add our share to the arriving sums
                got_k, got_v = travelling.wait()
                dk_b += got_k
                dv_b += got_v
            travelling = ring.shift([dk_b, dv_b], tag=2)
            if pending is not None:
                kv = pending.wait()
            ring.log("backward", step, t2 - t1, (t1 - t0) + (ring.clock(q) - t2))
        dk, dv = travelling.wait()                     # N_c hops: our own dK/dV, complete
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None


def ring_attention(q, k, v, causal: bool = True, layout: str = "zigzag", group=None, *,
                   scale=None, impl: str = "auto", doc_ids=None):
    """Exact attention over the whole sequence from local shards, by a ring of K/V blocks.

    ``q``: ``(b, c, a, d)``, ``k``/``v``: ``(b, c, a_kv, d)``, this rank's ``c = s/N_c``
    tokens in ``layout`` order (``"zigzag"`` or ``"contiguous"``). Returns this rank's
    output ``(b, c, a, d)``; differentiable in ``q``, ``k``, ``v``.

    Bytes per rank: forward ``N_c - 1`` shifts of the compact K and V (``4ch/g`` in
    bf16); backward ``N_c - 1`` K/V shifts plus ``N_c`` dK/dV shifts (in float32 for
    low-precision inputs); plus a shape check (``"metadata"``) so that ranks with
    different shards get a ValueError instead of a hang. ``impl``: local kernel choice
    (see :func:`lesson10.spmd.attention.local_attention`). Overlap and per-round
    timings: :func:`ring_options`. ``doc_ids``: the document of every global position
    (length ``s``, the same on every rank), a document mask; a block in which no query
    sees any key is skipped (it still travels: the same bytes).

    Worked example, ``N_c = 2``, zig-zag, ``s = 8``: rank 0 holds tokens
    ``[0, 1, 6, 7]``, rank 1 ``[2, 3, 4, 5]``. Round 0: each rank attends causally to its
    own tokens while sending its K/V on. Round 1: rank 0 gets rank 1's K/V (src 1 > 0),
    so only its late queries ``6, 7`` attend, to all of ``2..5``; rank 1 gets rank 0's
    (src 0 < 1), so all its queries attend to the early chunk ``0, 1`` only. Both do half
    a block: balanced.
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("ring_attention runs inside a rank: use lesson10.spmd.launch or torchrun")
    try:
        layout = layout_name(layout)
    except ValueError:
        pass                                # _check names the layouts the ring supports
    _check(q, k, v, layout, group)
    doc = check_doc_ids(doc_ids, dist.get_world_size(group) * q.shape[1], q.device, "ring_attention")
    return RingAttention.apply(q, k, v, bool(causal), layout, group, scale, impl, doc)
