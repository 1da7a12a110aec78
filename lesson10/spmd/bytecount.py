"""Byte counting for real runs (the collectives themselves are in :mod:`lesson10.spmd.comm`).

Every collective or point-to-point call a method makes goes through a wrapper of
:mod:`lesson10.spmd.comm` (or calls :func:`record` itself), so a run can be measured::

    with count_bytes() as c:
        out = ring_attention(q, k, v)
    c.sent            # bytes this rank put on the wire
    c.by_op           # {"ring_shift": ..., "all_to_all": ...}
    c.intra, c.inter  # of c.activation: to ranks on this node / on other nodes

Bytes are counted at ring-algorithm cost, like ``lesson10.sim.SimGroup``:
all-reduce 2(n-1)/n of the tensor, all-gather and reduce-scatter (n-1)/n of the
full tensor, all-to-all the blocks that leave the rank, a ring shift what is sent.

**Per link.** Each record names where its bytes go (``to=``: a global rank, or ``{rank:
bytes}``), and :mod:`lesson10.topology` says whether that rank is on this node. The ring
collectives send everything to the next rank of the group, so in a ring laid out node by
node only the last rank of each node sends across the network; an all-to-all sends each
block to its own rank. Two nodes of two, a ring all-gather of a 1 MB shard::

    rank 0 -> 1: 3 MB intra      rank 1 -> 2: 3 MB inter
    rank 2 -> 3: 3 MB intra      rank 3 -> 0: 3 MB inter

**On the wire.** The lesson's counts (``sent``, ``by_op``, ``intra``, ``inter``) stay the
ring-algorithm model. Next to them every record also adds what the backend really sends
(``wire_by_link``, ``wire_inter``: side traffic included), from :func:`wire_factor`. Measured
with the kernel's counters on a veth between two hosts (2 nodes of 2 ranks, gloo): its
all-gather and all-reduce are rings in rank order, and its all-to-all sends each block
straight to its rank, exactly the model; its reduce-scatter is an all-reduce of the whole
tensor followed by a copy of the rank's chunk, so it sends 2 (n-1)/n of the full tensor, twice
the model. NCCL picks its algorithm at run time (ring or tree for all-reduce, NVLS on NVSwitch
machines): there the wire figure is the model, and ``wire_model`` says so.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

from .. import topology

__all__ = ["ByteCounter", "SIDE_OPS", "LINKS", "COLLECTIVES", "count_bytes", "record",
           "wire_factor"]

#: where a byte goes: to a rank on this node, on another node, or unknown (no ``to=``)
LINKS = ("intra", "inter", "unknown")

_active: list[ByteCounter] = []

#: ops that are not activation traffic: shape/count exchanges, replicated weight-gradient
#: sums, SP's backward re-gather of the LayerNorm output it kept only a shard of, and the
#: gates and expert ids a two-level MoE dispatch sends along with each relayed token
SIDE_OPS = ("metadata", "param_grad", "ag_recompute", "routing")

#: the kinds of record :func:`wire_factor` knows (an op named like one of them is of that kind)
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "ring_shift")


def wire_factor(kind: str | None, backend: str | None) -> tuple[float, bool]:
    """``(factor, model)``: the backend sends ``factor`` times the lesson's bytes of a ``kind``
    collective, to the same ranks; ``model`` is True where that is the lesson's model rather
    than what the backend is known to do (NCCL chooses its algorithm at run time; no backend:
    no wire). gloo's reduce-scatter is an all-reduce (2 (n-1)/n of the tensor): factor 2."""
    if backend == "gloo":
        return (2.0 if kind == "reduce_scatter" else 1.0), False
    return 1.0, True


@dataclass
class ByteCounter:
    """The bytes this rank sent: ``sent`` in all, ``by_op`` per op name, ``by_link`` per op
    name and link (``{op: {"intra": ..., "inter": ...}}``)."""
    sent: int = 0
    calls: int = 0
    by_op: dict = field(default_factory=dict)
    by_link: dict = field(default_factory=dict)
    wire_by_link: dict = field(default_factory=dict)
    wire_model: bool = False

    @property
    def activation(self) -> int:
        """The bytes the lesson's formulas count: everything but :data:`SIDE_OPS`."""
        return int(sum(v for op, v in self.by_op.items() if op not in SIDE_OPS))

    def link(self, link: str) -> int:
        """Activation bytes (no :data:`SIDE_OPS`) sent over ``link`` (one of :data:`LINKS`)."""
        return int(sum(v.get(link, 0) for op, v in self.by_link.items() if op not in SIDE_OPS))

    @property
    def intra(self) -> int:
        """Activation bytes sent to ranks on this node."""
        return self.link("intra")

    @property
    def inter(self) -> int:
        """Activation bytes sent to ranks on other nodes, at the lesson's ring model."""
        return self.link("inter")

    @property
    def wire_inter(self) -> int:
        """Every byte (side traffic included) the backend sent to ranks on other nodes: what
        the network carries (:func:`wire_factor`; a model where ``wire_model``)."""
        return int(sum(v.get("inter", 0) for v in self.wire_by_link.values()))

    @property
    def wire_intra(self) -> int:
        """Every byte the backend sent to ranks on this node."""
        return int(sum(v.get("intra", 0) for v in self.wire_by_link.values()))

    def add(self, op: str, nbytes: int, links: dict | None = None, factor: float = 1.0,
            model: bool = False) -> None:
        nbytes = int(nbytes)
        self.sent += nbytes
        self.calls += 1
        self.by_op[op] = self.by_op.get(op, 0) + nbytes
        mine = self.by_link.setdefault(op, {})
        wire = self.wire_by_link.setdefault(op, {})
        for link, b in (links or {"unknown": nbytes}).items():
            mine[link] = mine.get(link, 0) + int(b)
            wire[link] = wire.get(link, 0) + int(round(b * factor))
        self.wire_model = self.wire_model or model


def record(op: str, nbytes: int, to=None, kind: str | None = None) -> None:
    """Add ``nbytes`` sent by this rank under the name ``op`` to every open counter.

    ``to``: the global rank they go to, or ``{global rank: bytes}`` when they go to several
    (its values must add up to ``nbytes``); ``None``: the link is unknown. ``kind``: which
    collective it was (one of :data:`COLLECTIVES`; default ``op`` when ``op`` is one), for
    the bytes on the wire (:func:`wire_factor`)."""
    if _active:
        links = _links(int(nbytes), to)
        factor, model = wire_factor(kind or (op if op in COLLECTIVES else None), _backend())
        for c in _active:
            c.add(op, nbytes, links, factor, model)


def _backend() -> str | None:
    try:
        import torch.distributed as dist
        return dist.get_backend() if dist.is_initialized() else None
    except (ImportError, RuntimeError):
        return None


def _links(nbytes: int, to) -> dict:
    """``{"intra": ..., "inter": ...}`` for bytes sent from this rank to ``to``."""
    if to is None:
        return {"unknown": nbytes}
    import torch.distributed as dist
    me = dist.get_rank() if dist.is_initialized() else 0
    topo = topology.current()
    dests = {int(to): nbytes} if not isinstance(to, dict) else {int(r): int(b) for r, b in to.items()}
    if sum(dests.values()) != nbytes:
        raise ValueError(f"record: the bytes per destination {dests} do not add up to {nbytes}")
    out = {"intra": 0, "inter": 0}
    for rank, b in dests.items():
        out["intra" if topo.same_node(me, rank) else "inter"] += b
    return out


@contextmanager
def count_bytes():
    """Context manager yielding a :class:`ByteCounter` of the bytes sent inside it."""
    c = ByteCounter()
    _active.append(c)
    try:
        yield c
    finally:
        _active.remove(c)
