"""USP on torch.distributed: Ulysses inside groups of consecutive ranks, ring across them.

``N = u * r`` ranks (``u = ulysses_size``): rank ``i`` of ``group`` is Ulysses index
``i % u`` in Ulysses group ``i // u`` (``u`` consecutive ranks, as inside a node) and
ring index ``i // u`` in the ring of the ``r`` ranks with the same Ulysses index
(:func:`lesson10.topology.usp_group_ranks`, the rule the simulation uses too). The
sub-groups come from ``torch.distributed.new_group`` and are made once per
``(group, u)``.

1. :func:`~lesson10.spmd.seq_to_heads` inside the Ulysses group: a rank holds the
   ``u c`` tokens of its group for ``a/u`` query heads and ``a_kv/u`` K/V heads, sorted
   (:func:`lesson10.topology.usp_ring_positions`; for the ``zigzag`` and ``contiguous``
   layouts exactly the shard of the same layout over ``r`` ranks, for any other layout or
   positions some other set of tokens), so
2. the ring attention runs on the ring group at those positions (exact for any);
3. :func:`~lesson10.spmd.heads_to_seq` goes back. Autograd flows through all three.

Bytes per rank (forward): ``(u-1)/u (2 + 2/g) c h e + (r-1) 2 (s/r) h e / (g u)``
(:func:`lesson10.cost.usp_bytes`): ``"all_to_all"`` and ``"ring_shift"`` in ``count_bytes``.
The head limit applies only to ``u``: it must divide ``a_kv``.

**Topology.** The all-to-alls want the fast links of a node, the ring tolerates the network.
``ulysses_size=None`` therefore takes the group's ranks per node (:mod:`lesson10.topology`:
``LOCAL_WORLD_SIZE`` under torchrun), cut to a divisor of ``a_kv``; any ``u`` whose Ulysses
groups straddle two nodes gets a warning. On 2 nodes of 4 GPUs with 8 K/V heads: ``u = 4``,
each node one Ulysses group, and 4 rings of 2 ranks, each ring step crossing the network.
"""
from __future__ import annotations

import warnings

import numpy as np
import torch
import torch.distributed as dist

from .. import topology
from ..topology import check_heads, check_ulysses_size, usp_group_ranks, usp_ring_positions
from . import comm
from .ring import ring_over
from .shard import layout_positions
from .ulysses import heads_to_seq, seq_to_heads
from .validate import check_doc_ids, check_local_qkv, require_rank

__all__ = ["usp_attention", "usp_groups", "choose_ulysses_size"]

_GROUPS: dict = {}


def usp_groups(ulysses_size: int, group=None):
    """``(ulysses_group, ring_group)`` of this rank for ``ulysses_size`` over ``group``.

    Every rank of ``group`` must call it (the first call per ``(group, u)`` creates the
    sub-groups with ``new_group``; later calls reuse them). Over the world every rank creates
    every sub-group in the same order; over a sub-group only its ranks are there, so its
    sub-groups use ``use_local_synchronization`` (whose names torch derives from how many
    groups each rank knows: create groups on every rank alike before, e.g. also a group for
    the ranks a group leaves out, or such a call can wait forever)."""
    n = comm.group_size(group)
    u = check_ulysses_size(ulysses_size, n)
    ranks = _group_ranks(group)
    world = dist.distributed_c10d._get_default_group()    # a new world: new sub-groups
    key = (id(world), tuple(ranks), u)
    if key not in _GROUPS:
        mine = {}
        for kind, blocks in zip(("ulysses", "ring"), usp_group_ranks(n, u)):
            for members in ([ranks[i] for i in b] for b in blocks):   # all in the same order
                pg = _sub_group(members, local=group is not None)
                if dist.get_rank() in members:
                    mine[kind] = pg
        _GROUPS[key] = (mine["ulysses"], mine["ring"])
    return _GROUPS[key]


def choose_ulysses_size(ulysses_size, a_kv: int, group=None) -> int:
    """``u`` for this group: ``ulysses_size``, or the group's ranks per node when it is
    ``None`` (see the module docstring); warns when a Ulysses group would span nodes."""
    ranks = _group_ranks(group)
    topo = topology.current()
    u = topology.usp_ulysses_size(ulysses_size, ranks, a_kv, topo)
    spans = topology.ulysses_spans_nodes(ranks, u, topo)
    if spans:
        warnings.warn(f"usp_attention: ulysses_size = {u} puts the ranks {spans[0]} in one Ulysses "
                      f"group across nodes (nodes of {topo.node_size} ranks), so its all-to-alls "
                      f"cross the network; ulysses_size = "
                      f"{topology.default_ulysses_size(ranks, a_kv, topo)} (the default, the ranks "
                      f"per node) keeps them inside a node", UserWarning, stacklevel=3)
    return u


def _group_ranks(group) -> list[int]:
    """The global ranks of ``group`` (None: the world), in group order."""
    if group is None:
        return list(range(comm.group_size(group)))
    return list(dist.get_process_group_ranks(group))


def _sub_group(members, local: bool):
    """``new_group(members)``: by every rank (``local=False``) or only by the members."""
    if not local:
        return dist.new_group(members)
    return dist.new_group(members, use_local_synchronization=True) \
        if dist.get_rank() in members else None


def usp_attention(q, k, v, causal: bool = True, layout="zigzag", group=None, *,
                  doc_ids=None, ulysses_size: int | None = None, scale=None, impl: str = "auto"):
    """USP attention of local shards ``q`` ``(b, c, a, d)``, ``k``/``v`` ``(b, c, a_kv, d)``.

    ``c = s/N`` tokens per rank in ``layout`` order: a layout name (as :func:`shard_sequence`
    gives them) or this rank's positions (the global token ids of its local tokens, in
    order). ``ulysses_size`` must divide ``N`` and ``a_kv``; ``None``: the ranks per node
    (:func:`lesson10.topology.usp_ulysses_size`, see :func:`choose_ulysses_size`). After the
    all-to-all the ring runs on the tokens of each Ulysses group
    (:func:`lesson10.topology.usp_ring_positions`). Returns this rank's output
    ``(b, c, a, d)``, differentiable; ``doc_ids``: a document mask over the ``s`` global
    positions.
    """
    require_rank("usp_attention")
    n, rank = comm.group_size(group), comm.group_rank(group)
    check_local_qkv(q, k, v, "usp_attention")
    u = choose_ulysses_size(ulysses_size, k.shape[2], group)
    check_heads(q.shape[2], k.shape[2], u, n)
    comm.check_same_shape(q, group, "usp_attention: q")
    comm.check_same_shape(k, group, "usp_attention: k")
    pos = layout_positions(layout, q.shape[1], group, q.device)      # validates s for a name
    doc = check_doc_ids(doc_ids, n * q.shape[1], q.device, "usp_attention")
    ring_pos = usp_ring_positions(pos, u)                   # the ring's ranks' tokens, sorted
    held = torch.as_tensor(np.concatenate(pos[rank - rank % u:rank - rank % u + u]))
    fwd = torch.argsort(held, stable=True).to(q.device)    # rows after seq_to_heads -> sorted
    back = torch.argsort(fwd)
    uly_pg, ring_pg = usp_groups(u, group)
    qh, kh, vh = (seq_to_heads(t, uly_pg)[:, fwd] for t in (q, k, v))   # (b, u c, ., d), sorted
    o = ring_over(qh, kh, vh, ring_pos, bool(causal), ring_pg, doc, scale, impl)
    return heads_to_seq(o[:, back], uly_pg)
