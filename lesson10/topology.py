"""Which ranks share a node, and the rules that follow from it (shared by ``sim`` and ``spmd``).

A job of ``world`` ranks runs on ``nodes`` machines of ``node_size`` ranks each, numbered node
by node as ``torchrun`` numbers them: global rank ``i`` is on node ``i // node_size`` with
local index ``i % node_size``. Two ranks on one node talk over its fast links (NVLink,
shared memory); two on different nodes over the network, typically 5-20x slower. Example,
2 nodes of 2::

    node 0: ranks 0 1        node 1: ranks 2 3
    ring 0 -> 1 -> 2 -> 3 -> 0: the steps 1 -> 2 and 3 -> 0 cross the network

:func:`current` reads the topology of this process: ``LOCAL_WORLD_SIZE`` (set by ``torchrun``
on every node) gives ``node_size``; ``LESSON10_NODE_SIZE`` or :func:`assume` pretend nodes on
one machine (tests, demos); without either, every rank is on one node.

The rules here need no torch: USP's group shapes and head limit (:func:`check_ulysses_size`,
:func:`usp_group_ranks`, :func:`check_heads`, :func:`default_ulysses_size`,
:func:`usp_ulysses_size`, :func:`usp_ring_positions`) and the
node-limited routing of DeepSeek-V3 (:func:`check_nodes`).
"""
from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass

from .rules import count

__all__ = ["Topology", "current", "assume", "check_ulysses_size", "usp_group_ranks",
           "check_heads", "default_ulysses_size", "usp_ulysses_size", "usp_ring_positions",
           "ulysses_spans_nodes", "check_nodes"]


@dataclass(frozen=True)
class Topology:
    """``world`` ranks in nodes of ``node_size`` consecutive ranks."""
    world: int
    node_size: int

    def __post_init__(self):
        count("world", self.world)
        count("node_size", self.node_size)
        if self.world % self.node_size:
            raise ValueError(f"{self.world} ranks do not fill nodes of {self.node_size}: every "
                             f"node must run the same number of ranks (--node-size, torchrun "
                             f"--nproc-per-node), so use a world size that is a multiple of it")

    @property
    def nodes(self) -> int:
        return self.world // self.node_size

    def node_of(self, rank: int) -> int:
        return rank // self.node_size

    def local_index(self, rank: int) -> int:
        return rank % self.node_size

    def same_node(self, a: int, b: int) -> bool:
        return a // self.node_size == b // self.node_size

    def nodes_of(self, ranks) -> int:
        """How many nodes the global ranks ``ranks`` touch."""
        return len({self.node_of(r) for r in ranks})

    def aligned(self, ranks) -> bool:
        """Whether the group of global ``ranks`` (in group order) fills its nodes in blocks:
        the same number ``m`` of consecutive group ranks on each node, group rank ``i`` on the
        group's ``i // m``-th node (what a two-level dispatch needs)."""
        ranks = list(ranks)
        nodes = self.nodes_of(ranks)
        if len(ranks) % nodes:
            return False
        m = len(ranks) // nodes
        blocks = [ranks[i:i + m] for i in range(0, len(ranks), m)]
        return all(self.nodes_of(b) == 1 for b in blocks)


_ASSUMED: list[int] = []


@contextlib.contextmanager
def assume(node_size: int):
    """Inside the block, :func:`current` says nodes of ``node_size`` ranks (pretend nodes on
    one machine: the byte counter then splits bytes as if they crossed a network)."""
    _ASSUMED.append(count("node_size", node_size))
    try:
        yield
    finally:
        _ASSUMED.pop()


def current(world: int | None = None) -> Topology:
    """This job's topology: ``world`` (default: ``torch.distributed``'s world when it is up,
    else ``WORLD_SIZE``, else 1) in nodes of :func:`assume`'s size, else ``LESSON10_NODE_SIZE``,
    else ``LOCAL_WORLD_SIZE``, else one node."""
    if world is None:
        world = _world()
    size = _ASSUMED[-1] if _ASSUMED else None
    for var in ("LESSON10_NODE_SIZE", "LOCAL_WORLD_SIZE"):
        if size is None and os.environ.get(var, "").strip():
            try:
                size = int(os.environ[var])
            except ValueError:
                raise ValueError(f"{var}={os.environ[var]!r} must be a whole number of ranks "
                                 f"per node") from None
    return Topology(world, min(size or world, world))


def _world() -> int:
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
    except ImportError:
        pass
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


# ------------------------------------------------------------------------------ USP
def check_ulysses_size(ulysses_size, n: int) -> int:
    """``u = ulysses_size`` as an int, if it is >= 1 and divides the ``n`` ranks; else a
    ValueError that says what to do."""
    u = count("ulysses_size", ulysses_size)
    if n % u:
        raise ValueError(f"usp_attention: N = {n} ranks do not split into Ulysses groups of "
                         f"ulysses_size = {u}; use a ulysses_size that divides N (N = "
                         f"ulysses_size * ring_size)")
    return u


def usp_group_ranks(n: int, ulysses_size: int):
    """``(ulysses_groups, rings)`` as group-rank lists: the ``r = n/u`` Ulysses groups of ``u``
    consecutive ranks, and the ``u`` rings ``j, u + j, 2u + j, ...``."""
    u = check_ulysses_size(ulysses_size, n)
    return ([list(range(i * u, (i + 1) * u)) for i in range(n // u)],
            [list(range(j, n, u)) for j in range(u)])


def check_heads(a: int, a_kv: int, u: int, n: int) -> None:
    """USP's only head limit: GQA needs ``a_kv | a``, and the Ulysses part needs
    ``ulysses_size | a_kv`` (whole K/V heads per rank); else a ValueError that says what to do."""
    if a_kv == 0 or a % a_kv:
        raise ValueError(f"usp_attention: {a} query heads are not a multiple of {a_kv} K/V heads")
    if a_kv % u:
        raise ValueError(
            f"usp_attention: ulysses_size = {u} ranks cannot split n_kv = {a_kv} K/V heads into "
            f"whole heads: the Ulysses part is limited to ulysses_size <= n_kv, dividing n_kv. "
            f"Use a ulysses_size that divides {a_kv} (and N = {n}) and let the ring take the "
            f"rest of the degree (ring_size = N / ulysses_size)")


def default_ulysses_size(ranks, a_kv: int, topo: Topology) -> int:
    """USP's default ``u`` for the group of global ``ranks``: its ranks per node, so the
    all-to-alls stay inside a node and only the ring crosses the network; cut down to the
    largest divisor of that which also divides ``a_kv`` (whole K/V heads per rank)."""
    ranks = list(ranks)
    per_node = len(ranks) // topo.nodes_of(ranks)
    return math.gcd(per_node, a_kv) if a_kv else per_node


def usp_ulysses_size(ulysses_size, ranks, a_kv: int | None = None,
                     topo: Topology | None = None) -> int:
    """USP's ``u`` for the group of global ``ranks``: ``ulysses_size`` (checked: it divides the
    group), or when it is ``None`` the default, :func:`default_ulysses_size` (``a_kv=None``: no
    cut to the K/V heads) on ``topo`` (default :func:`current`). The one place both
    implementations, the checked runs and the byte formulas take ``u`` from."""
    ranks = list(ranks)
    if ulysses_size is None:
        topo = current(max(_world(), max(ranks, default=0) + 1)) if topo is None else topo
        ulysses_size = default_ulysses_size(ranks, a_kv or 0, topo)
    return check_ulysses_size(ulysses_size, len(ranks))


def usp_ring_positions(positions, ulysses_size: int) -> list:
    """The global tokens each ring index holds after USP's all-to-all: Ulysses group ``i``
    (ranks ``i u .. i u + u - 1``) holds the tokens of its ranks, here sorted (the ring is
    exact for any order; sorted, the contiguous and zig-zag layouts give the ring the
    layout's own shards over ``r = n/u`` ranks). ``positions``: one sequence per rank."""
    import numpy as np
    u = check_ulysses_size(ulysses_size, len(positions))
    return [np.sort(np.concatenate([np.asarray(p) for p in positions[i:i + u]]), kind="stable")
            for i in range(0, len(positions), u)]


def ulysses_spans_nodes(ranks, u: int, topo: Topology) -> list[list[int]]:
    """The Ulysses groups (global ranks) of ``u`` consecutive ``ranks`` that are not on one
    node: their all-to-alls cross the network."""
    ranks = list(ranks)
    return [ranks[i:i + u] for i in range(0, len(ranks), u) if topo.nodes_of(ranks[i:i + u]) > 1]


# ------------------------------------------------------------------------- MoE nodes
def check_nodes(E: int, k: int, nodes, max_nodes):
    """Validate node-limited routing ``(nodes, max_nodes)`` for ``E`` experts and top-``k``
    (the experts split evenly over ``nodes``; each token uses at most ``max_nodes`` of them);
    returns them as ints (``max_nodes=None``: no limit, returned as ``nodes``)."""
    if nodes is None:
        if max_nodes is not None:
            raise ValueError("max_nodes needs nodes: pass nodes= (how many nodes the experts are "
                             "split over) together with max_nodes=")
        return None, None
    nodes = count("nodes", nodes)
    if E % nodes:
        raise ValueError(f"E = {E} experts do not split evenly over nodes = {nodes}; use a number "
                         f"of nodes that divides E")
    if max_nodes is None:
        return nodes, nodes
    max_nodes = count("max_nodes", max_nodes)
    if max_nodes > nodes:
        raise ValueError(f"max_nodes = {max_nodes} is more than the nodes = {nodes} there are; "
                         f"use 1 <= max_nodes <= nodes")
    if max_nodes * (E // nodes) < k:
        raise ValueError(f"max_nodes = {max_nodes} nodes hold only {max_nodes * (E // nodes)} "
                         f"experts, fewer than k = {k}; raise max_nodes to at least "
                         f"{-(-k // (E // nodes))}")
    return nodes, max_nodes
