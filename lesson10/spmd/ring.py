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

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from ..layouts import block_plan, ring_source, shard_positions
from . import comm
from .attention import acc_dtype, attend_blocks, attend_blocks_backward, block_kwargs
from .comm import record
from .device import synchronize_device
from .shard import layout_positions
from .validate import check_doc_ids, check_local_qkv, require_rank

__all__ = ["RingComm", "RingSettings", "ring_settings", "set_ring_settings", "ring_options",
           "ring_attention", "ring_over", "RingAttention", "ring_blocks", "RingPlan"]


# ------------------------------------------------------------------ settings
@dataclass(frozen=True)
class RingSettings:
    """The experiment knobs of the ring, apart from its arguments (benchmarks set them):

    * ``overlap`` (default True): start each transfer before the round's compute; False
      waits for it first, so nothing hides (benchmark 2 of ``bench ring``);
    * ``timings``: a list that receives ``{"phase", "round", "rank", "compute_s", "wait_s"}``
      per round; ``wait_s`` is the communication the compute did not hide. The same record
      holds the round's timeline in ``perf_counter`` seconds: ``compute_start/_end`` of the
      block attention, ``send_start/_end`` of the K/V transfer posted that round (from the
      post to the end of its wait; None in the last round), drawn by
      :mod:`lesson10.figures.timeline`. None (the default) records nothing, costs
      nothing. On CUDA each clock read then first waits for the GPU (``torch.cuda.synchronize``), so the times are
      the kernels' and the transfers', not their launches' (only while timing: a sync per
      round costs overlap);
    * ``bandwidth`` (bytes/s, default None = as fast as the backend): emulate a slower
      link. A shift of ``B`` bytes (all its tensors) is not complete before ``B /
      bandwidth`` seconds after it started: ``wait()`` sleeps for what is left. Compute
      in between hides that time, as on a real link (the c* experiment, ``bench cstar``).
    """
    overlap: bool = True
    timings: list | None = None
    bandwidth: float | None = None

    def __post_init__(self):
        bw = self.bandwidth
        if bw is not None and (isinstance(bw, bool) or not isinstance(bw, (int, float))
                               or not bw > 0 or bw == float("inf")):
            raise ValueError(f"bandwidth must be a finite number of bytes/s > 0 (or None: the "
                             f"backend's own speed), got {bw!r}")
        object.__setattr__(self, "overlap", bool(self.overlap))


_current = [RingSettings()]


def ring_settings() -> RingSettings:
    """The :class:`RingSettings` the next ring attention call uses."""
    return _current[0]


def set_ring_settings(settings: RingSettings) -> RingSettings:
    """Use ``settings`` for the ring attention calls from now on; returns the previous ones."""
    if not isinstance(settings, RingSettings):
        raise ValueError(f"settings must be a RingSettings, got {type(settings).__name__}")
    old, _current[0] = _current[0], settings
    return old


@contextmanager
def ring_options(overlap: bool = True, timings: list | None = None, bandwidth: float | None = None):
    """Run the ring attention calls inside the ``with`` block with these
    :class:`RingSettings` (see there); restored afterwards. The backward of a call uses the
    settings of its forward."""
    old = set_ring_settings(RingSettings(overlap, timings, bandwidth))
    try:
        yield
    finally:
        set_ring_settings(old)


# ------------------------------------------------------------------ communicator
class _Shift:
    """An in-flight shift: ``wait()`` then read ``received`` (same shapes as sent)."""

    def __init__(self, handles, sent, received):
        self.handles, self.sent, self.received = handles, sent, received

    def wait(self):
        for h in self.handles:
            h.wait()
        self.handles = []
        self.sent = None                    # sent: the sender may drop its block now
        return self.received


class _PacedShift(_Shift):
    """A shift on an emulated slower link: ``wait()`` does not return before ``done_at``
    (a ``perf_counter`` time: the transfer's start plus bytes / bandwidth)."""

    def __init__(self, handles, sent, received, done_at: float):
        super().__init__(handles, sent, received)
        self.done_at = done_at

    def wait(self):
        received = super().wait()
        left = self.done_at - time.perf_counter()
        if left > 0:                                   # the emulated link is still busy
            time.sleep(left)
        return received


class RingComm:
    """Point-to-point ring inside ``group``: send to rank ``r+1``, receive from ``r-1``.

    ``overlap``, ``timings``, ``bandwidth``: a :class:`RingSettings` (see there); ring
    attention builds its communicator from :func:`ring_settings`, which
    :func:`ring_options` sets around a call.
    """

    def __init__(self, group=None, overlap: bool = True, timings: list | None = None,
                 bandwidth: float | None = None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        to_global = (lambda i: i) if group is None else (lambda i: dist.get_global_rank(group, i))
        self.next = to_global((self.rank + 1) % self.size)
        self.prev = to_global((self.rank - 1) % self.size)
        self.settings = RingSettings(overlap, timings, bandwidth)
        self.overlap, self.timings, self.bandwidth = overlap, timings, bandwidth

    @classmethod
    def with_settings(cls, group, settings: RingSettings) -> RingComm:
        return cls(group, settings.overlap, settings.timings, settings.bandwidth)

    def shift(self, tensors, tag: int = 0) -> _Shift:
        """Start sending every tensor to ``r+1`` and receiving as many from ``r-1`` (async).

        Returns a shift to ``wait()`` on; the sent tensors must not change until then.
        Every sent byte is recorded as ``"ring_shift"`` in :func:`lesson10.spmd.comm.count_bytes`.
        Without overlap the transfer completes before this returns.
        """
        sent = [t.contiguous() for t in tensors]
        if self.size == 1:                             # a ring of one: the block stays here
            return _Shift([], sent, [t.clone() for t in sent])
        return self._start(sent, [torch.empty_like(t) for t in sent], tag)

    def shift_into(self, send: torch.Tensor, recv: torch.Tensor, tag: int = 0) -> _Shift:
        """:meth:`shift` of one contiguous tensor into a buffer of the caller's, ``recv`` (same
        shape and dtype, not ``send``): the ring reuses its buffers from round to round, and
        sends K and V packed in one tensor, so a round is one send and one receive."""
        if not send.is_contiguous() or not recv.is_contiguous() or recv.shape != send.shape \
                or recv.dtype != send.dtype or (send.numel() and recv.data_ptr() == send.data_ptr()):
            raise ValueError("shift_into needs two distinct contiguous tensors of one shape and dtype")
        if self.size == 1:
            recv.copy_(send)
            return _Shift([], [send], [recv])
        return self._start([send], [recv], tag)

    def _start(self, sent, received, tag: int) -> _Shift:
        """Post the sends of ``sent`` to ``r+1`` and the receives into ``received`` from ``r-1``
        (one ``batch_isend_irecv``)."""
        ops = []
        nbytes = 0
        for i, (t, buf) in enumerate(zip(sent, received)):
            ops.append(dist.P2POp(dist.isend, t, self.next, self.group, tag + i))
            ops.append(dist.P2POp(dist.irecv, buf, self.prev, self.group, tag + i))
            record("ring_shift", t.numel() * t.element_size(), to=self.next)
            nbytes += t.numel() * t.element_size()
        start = time.perf_counter()
        handles = dist.batch_isend_irecv(ops)
        shift = _PacedShift(handles, sent, received, start + nbytes / self.bandwidth) \
            if self.bandwidth else _Shift(handles, sent, received)
        if not self.overlap:
            shift.wait()
        return shift

    def clock(self, like: torch.Tensor) -> float:
        """``perf_counter()``; while recording timings, after the GPU work of ``like``'s device."""
        if self.timings is not None:
            synchronize_device(like)
        return time.perf_counter()

    def log(self, phase: str, step: int, clocks: tuple, shifted: bool) -> None:
        """Record round ``step`` (only while recording timings): ``clocks`` = (t0, t1, t2, t3),
        the :meth:`clock` before posting the K/V transfer, after it, after the block's compute
        and after the transfer's wait; ``shifted``: whether this round sent a block on. Without
        overlap the transfer is complete when its post returns (t1)."""
        if self.timings is None:
            return
        t0, t1, t2, t3 = clocks
        self.timings.append({
            "phase": phase, "round": step, "rank": self.rank,
            "compute_s": t2 - t1, "wait_s": (t1 - t0) + (t3 - t2),
            # the timeline (perf_counter seconds): the block attention, and the transfer
            # posted this round (it brings round step + 1's block; None in the last round)
            "compute_start": t1, "compute_end": t2,
            "send_start": t0 if shifted else None,
            "send_end": (t3 if self.overlap else t1) if shifted else None})


# -------------------------------------------------------------------- the plan
def ring_blocks(layout: str, causal: bool, rank: int, src: int, c: int, n: int | None = None):
    """The blocks rank ``rank`` computes against the K/V of rank ``src`` for a named layout:
    :func:`lesson10.layouts.block_plan` as ``(q_slice, kv_slice, masked)`` over the local
    ``c`` tokens; empty when everything is masked. ``n`` (default ``max(rank, src) + 1``, which
    gives the same blocks for the contiguous and zig-zag layouts): the ring size."""
    n = max(rank, src) + 1 if n is None else n
    pos = shard_positions(n * c, n, layout)
    return [(b.q, b.k, b.mask != "none") for b in block_plan(pos[rank], pos[src], causal)]


@dataclass
class RingPlan:
    """Everything one ring call needs besides the tensors, decided once at the API boundary
    and shared by forward and backward: the group, per round the
    :class:`lesson10.layouts.Block` s to compute with their kernel arguments
    (:func:`lesson10.spmd.attention.block_kwargs`), the kernel choice and the
    :class:`RingSettings` of the call."""
    group: object
    blocks: list                 # per round: [(Block, kwargs), ...]
    scale: float | None
    impl: str
    settings: RingSettings

    @classmethod
    def build(cls, positions, rank: int, causal: bool, doc, device, group, scale, impl,
              settings: RingSettings) -> RingPlan:
        """The plan of rank ``rank`` of the ring whose ranks hold the global tokens
        ``positions`` (one array per ring rank); ``doc``: the checked ``doc_ids`` or None."""
        n = len(positions)
        doc_np = None if doc is None else doc.cpu().numpy()

        def as_t(p):
            return torch.as_tensor(np.asarray(p), dtype=torch.long, device=device)
        q_pos = as_t(positions[rank])
        blocks = []
        for step in range(n):
            src = ring_source(rank, step, n)
            k_pos = as_t(positions[src])
            blocks.append([(blk, block_kwargs(blk, q_pos, k_pos, causal, doc))
                           for blk in block_plan(positions[rank], positions[src], causal, doc_np)])
        return cls(group, blocks, scale, impl, settings)


# ------------------------------------------------------------------- autograd
def _pack(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """K and V in one flat buffer (what travels: one tensor per round), see :func:`_unpack`."""
    flat = torch.empty(k.numel() + v.numel(), dtype=k.dtype, device=k.device)
    kk, vv = _unpack(flat, k.shape, v.shape)
    kk.copy_(k)
    vv.copy_(v)
    return flat


def _unpack(flat: torch.Tensor, k_shape, v_shape):
    """The K and V views of a buffer of :func:`_pack` (no copy)."""
    nk = math.prod(k_shape)
    return flat[:nk].view(k_shape), flat[nk:].view(v_shape)


class RingAttention(torch.autograd.Function):
    """``out = ring_attention(q, k, v)`` with the ring backward (see the module doc).

    Fixed costs per round kept small: K and V travel packed in one buffer (one send and one
    receive per round), into a second buffer allocated once and swapped with the first each
    round; the backward's dK/dV sums rotate through three such buffers (the one being
    computed, the one in flight, the one arriving); blocks merge in place."""

    @staticmethod
    def forward(ctx, q, k, v, plan: RingPlan):
        ring = RingComm.with_settings(plan.group, plan.settings)
        n = ring.size
        out: torch.Tensor | None = None
        lse: torch.Tensor | None = None
        cur = _pack(k, v)
        spare = torch.empty_like(cur) if n > 1 else cur
        for step in range(n):
            t0 = ring.clock(q)
            pending = ring.shift_into(cur, spare, tag=0) if step < n - 1 else None
            t1 = ring.clock(q)
            kk, vv = _unpack(cur, k.shape, v.shape)
            out, lse = attend_blocks(q, kk, vv, plan.blocks[step], plan.scale, plan.impl, out, lse)
            t2 = ring.clock(q)
            if pending is not None:
                pending.wait()
                cur, spare = spare, cur                # the block that arrived; the sent one is free
            ring.log("forward", step, (t0, t1, t2, ring.clock(q)), pending is not None)
        assert out is not None and lse is not None        # n >= 1 rounds, each returns both
        out_q = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out_q, lse)
        ctx.plan = plan
        return out_q

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        plan = ctx.plan
        ring = RingComm.with_settings(plan.group, plan.settings)
        n = ring.size
        dout = dout.contiguous()
        acc = acc_dtype(q.dtype)
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        cur = _pack(k, v)
        spare = torch.empty_like(cur) if n > 1 else cur
        # dK/dV sums, packed: computed here (A), in flight (B), arriving (C); rotate per round
        A, B, C = (torch.empty(cur.shape, dtype=acc, device=q.device) for _ in range(3))
        travelling: _Shift | None = None               # the dK/dV accumulators on their way
        for step in range(n):
            t0 = ring.clock(q)
            pending = ring.shift_into(cur, spare, tag=0) if step < n - 1 else None
            t1 = ring.clock(q)
            kk, vv = _unpack(cur, k.shape, v.shape)
            attend_blocks_backward(dout, q, kk, vv, out, lse, plan.blocks[step], dq, plan.scale,
                                   plan.impl, dkv=_unpack(A, k.shape, v.shape))
            t2 = ring.clock(q)
            if travelling is not None:                 # add our share to the arriving sums
                travelling.wait()
                A += C
            travelling = ring.shift_into(A, B, tag=2)  # B: sent last round, free since the wait
            A, B, C = C, A, B                          # next: compute into C; A in flight into B
            if pending is not None:
                pending.wait()
                cur, spare = spare, cur
            ring.log("backward", step, (t0, t1, t2, ring.clock(q)), pending is not None)
        assert travelling is not None                  # n >= 1 rounds, each shifts them
        travelling.wait()                              # N_c hops: our own dK/dV, complete
        dk, dv = _unpack(C, k.shape, v.shape)          # C: where the last shift arrived
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def ring_attention(q, k, v, causal: bool = True, layout="zigzag", group=None, *,
                   doc_ids=None, scale=None, impl: str = "auto"):
    """Exact attention over the whole sequence from local shards, by a ring of K/V blocks.

    ``q``: ``(b, c, a, d)``, ``k``/``v``: ``(b, c, a_kv, d)``, this rank's ``c = s/N_c``
    tokens in ``layout`` order. ``layout``: a layout name (``"zigzag"``, ``"contiguous"``,
    ``"striped"``) or this rank's positions (a sequence or 1-D tensor of the global token
    indices of its local tokens, in order; all ranks together must hold ``0..s-1`` once):
    any permutation is exact, and causal blocks that are fully masked are skipped
    (:func:`lesson10.layouts.block_plan`). Returns this rank's output ``(b, c, a, d)``;
    differentiable in ``q``, ``k``, ``v``.

    Bytes per rank: forward ``N_c - 1`` shifts of the compact K and V (``4ch/g`` in
    bf16); backward ``N_c - 1`` K/V shifts plus ``N_c`` dK/dV shifts (in float32 for
    low-precision inputs); plus a shape check (``"metadata"``) so that ranks with
    different shards get a ValueError instead of a hang (and, for positions, their
    all-gather, also ``"metadata"``). ``impl``: local kernel choice (see
    :func:`lesson10.spmd.attention.local_attention`). Overlap and per-round timings:
    :func:`ring_options`. ``doc_ids``: the document of every global position (length
    ``s``, the same on every rank), a document mask; a block in which no query sees any
    key is skipped (it still travels: the same bytes).

    Worked example, ``N_c = 2``, zig-zag, ``s = 8``: rank 0 holds tokens
    ``[0, 1, 6, 7]``, rank 1 ``[2, 3, 4, 5]``. Round 0: each rank attends causally to its
    own tokens while sending its K/V on. Round 1: rank 0 gets rank 1's K/V (src 1 > 0),
    so only its late queries ``6, 7`` attend, to all of ``2..5``; rank 1 gets rank 0's
    (src 0 < 1), so all its queries attend to the early chunk ``0, 1`` only. Both do half
    a block: balanced.
    """
    require_rank("ring_attention")
    check_local_qkv(q, k, v, "ring_attention")
    comm.check_same_shape(q, group, "ring_attention: q")
    comm.check_same_shape(k, group, "ring_attention: k")
    positions = layout_positions(layout, q.shape[1], group, q.device)
    doc = check_doc_ids(doc_ids, len(positions) * q.shape[1], q.device, "ring_attention")
    return ring_over(q, k, v, positions, bool(causal), group, doc, scale, impl)


def ring_over(q, k, v, positions, causal: bool, group, doc, scale=None, impl: str = "auto"):
    """Ring attention of checked local shards (what :func:`ring_attention` runs after its
    checks; USP calls it on its ring): ``positions``, the global tokens of every rank of
    ``group`` (a list of arrays); ``doc``, checked ``doc_ids`` or None."""
    plan = RingPlan.build(positions, comm.group_rank(group), causal, doc, q.device, group,
                          scale, impl, ring_settings())
    return RingAttention.apply(q, k, v, plan)
