"""A ring attention timed round by round on real ranks: the events of the timeline figure.

:func:`ring_timeline` is a rank worker (start it with :func:`lesson10.spmd.launch.launch`);
:func:`record_ring_timeline` starts it and returns every rank's rounds in one list, which
:func:`lesson10.figures.timeline.draw_ring_timeline` draws. The recorder itself is the ring's
own ``timings`` (:class:`lesson10.spmd.ring.RingSettings`): off, it costs nothing.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ..spmd.launch import launch
from ..spmd.ring import ring_attention, ring_options

__all__ = ["ring_timeline", "ring_timelines", "record_ring_timeline", "TIMES"]

#: the timestamps of a round record, in seconds
TIMES = ("compute_start", "compute_end", "send_start", "send_end")


def ring_timeline(s: int = 2048, a: int = 4, d: int = 64, layout: str = "zigzag",
                  overlap: bool = True, backward: bool = False, bandwidth: float | None = None,
                  seed: int = 0) -> list[dict]:
    """Rank worker: one causal ring attention of ``(1, s/N_c, a, d)`` float32 shards per rank,
    after one untimed warm-up, with the per-round timings on (``backward``: the backward too).

    Returns this rank's round records (see ``RingSettings``), their times in seconds since a
    barrier all ranks left together (one origin for the whole ring)."""
    n, rank = dist.get_world_size(), dist.get_rank()
    if s % (2 * n):
        raise ValueError(f"s must split into 2*N_c = {2 * n} equal chunks, got s={s}")
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    q, k, v = (torch.randn(1, s // n, a, d, generator=g, requires_grad=backward)
               for _ in range(3))
    with ring_options(overlap=overlap, bandwidth=bandwidth):
        ring_attention(q, k, v, causal=True, layout=layout)          # warm-up, untimed
    rounds: list = []
    dist.barrier()
    origin = time.perf_counter()
    with ring_options(overlap=overlap, timings=rounds, bandwidth=bandwidth):
        out = ring_attention(q, k, v, causal=True, layout=layout)
        if backward:
            out.sum().backward()
    for r in rounds:
        for key in TIMES:
            if r[key] is not None:
                r[key] -= origin
    return rounds


def ring_timelines(cases: list[dict]) -> list[list[dict]]:
    """Rank worker: :func:`ring_timeline` of each case (its keyword arguments), one launch."""
    return [ring_timeline(**case) for case in cases]


def record_ring_timeline(nprocs: int = 2, timeout: float = 300.0, **kwargs) -> list[dict]:
    """Start :func:`ring_timeline` on ``nprocs`` ranks; every rank's rounds, rank by rank."""
    per_rank = launch(ring_timeline, nprocs, timeout=timeout, quiet=True, **kwargs)
    return [r for rounds in per_rank for r in rounds]
