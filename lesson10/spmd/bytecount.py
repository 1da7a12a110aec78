"""Byte counting for real runs (the collectives themselves are in :mod:`lesson10.spmd.comm`).

Every collective or point-to-point call a method makes goes through a wrapper of
:mod:`lesson10.spmd.comm` (or calls :func:`record` itself), so a run can be measured::

    with count_bytes() as c:
        out = ring_attention(q, k, v)
    c.sent            # bytes this rank put on the wire
    c.by_op           # {"ring_shift": ..., "all_to_all": ...}

Bytes are counted at ring-algorithm cost, like ``lesson10.sim.SimGroup``:
all-reduce 2(n-1)/n of the tensor, all-gather and reduce-scatter (n-1)/n of the
full tensor, all-to-all the blocks that leave the rank, a ring shift what is sent.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["ByteCounter", "SIDE_OPS", "count_bytes", "record"]

_active: list["ByteCounter"] = []

#: ops that are not activation traffic: shape/count exchanges, replicated weight-gradient
#: sums, and SP's backward re-gather of the LayerNorm output it kept only a shard of
SIDE_OPS = ("metadata", "param_grad", "ag_recompute")


@dataclass
class ByteCounter:
    sent: int = 0
    calls: int = 0
    by_op: dict = field(default_factory=dict)

    @property
    def activation(self) -> int:
        """The bytes the lesson's formulas count: everything but :data:`SIDE_OPS`."""
        return int(sum(v for op, v in self.by_op.items() if op not in SIDE_OPS))

    def add(self, op: str, nbytes: int) -> None:
        nbytes = int(nbytes)
        self.sent += nbytes
        self.calls += 1
        self.by_op[op] = self.by_op.get(op, 0) + nbytes


def record(op: str, nbytes: int) -> None:
    """Add ``nbytes`` sent by this rank under the name ``op`` to every open counter."""
    for c in _active:
        c.add(op, nbytes)


@contextmanager
def count_bytes():
    """Context manager yielding a :class:`ByteCounter` of the bytes sent inside it."""
    c = ByteCounter()
    _active.append(c)
    try:
        yield c
    finally:
        _active.remove(c)
