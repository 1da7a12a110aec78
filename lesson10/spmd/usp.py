"""USP on torch.distributed: Ulysses inside groups of consecutive ranks, ring across them.

``N = u * r`` ranks (``u = ulysses_size``): rank ``i`` of ``group`` is Ulysses index
``i % u`` in Ulysses group ``i // u`` (``u`` consecutive ranks, as inside a node) and
ring index ``i // u`` in the ring of the ``r`` ranks with the same Ulysses index. The
sub-groups come from ``torch.distributed.new_group`` and are made once per
``(group, u)``.

1. :func:`~lesson10.spmd.seq_to_heads` inside the Ulysses group: a rank holds the
   ``u c`` tokens of its group for ``a/u`` query heads and ``a_kv/u`` K/V heads. For the
   ``zigzag`` and ``contiguous`` layouts these tokens, sorted, are exactly the shard of the
   same layout over ``r`` ranks, so
2. :func:`~lesson10.spmd.ring_attention` runs on the ring group in that layout;
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
from ..layouts import layout_name, shard_positions
from ..topology import check_heads, check_ulysses_size
from . import comm
from .attention import check_local_qkv, require_rank
from .ring import ring_attention
from .ulysses import heads_to_seq, seq_to_heads

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
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(n))
    world = dist.distributed_c10d._get_default_group()    # a new world: new sub-groups
    key = (id(world), tuple(ranks), u)
    if key not in _GROUPS:
        uly = [ranks[i * u:(i + 1) * u] for i in range(n // u)]    # u consecutive ranks each
        rings = [ranks[j::u] for j in range(u)]                    # one rank of each of those
        mine = {}
        for kind, blocks in (("ulysses", uly), ("ring", rings)):
            for members in blocks:                                 # all in the same order
                pg = _sub_group(members, local=group is not None)
                if dist.get_rank() in members:
                    mine[kind] = pg
        _GROUPS[key] = (mine["ulysses"], mine["ring"])
    return _GROUPS[key]


def choose_ulysses_size(ulysses_size, a_kv: int, group=None) -> int:
    """``u`` for this group: ``ulysses_size``, or the group's ranks per node when it is
    ``None`` (see the module docstring); warns when a Ulysses group would span nodes."""
    n = comm.group_size(group)
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(n))
    topo = topology.current()
    if ulysses_size is None:
        ulysses_size = topology.default_ulysses_size(ranks, a_kv, topo)
    u = check_ulysses_size(ulysses_size, n)
    spans = topology.ulysses_spans_nodes(ranks, u, topo)
    if spans:
        warnings.warn(f"usp_attention: ulysses_size = {u} puts the ranks {spans[0]} in one Ulysses "
                      f"group across nodes (nodes of {topo.node_size} ranks), so its all-to-alls "
                      f"cross the network; ulysses_size = "
                      f"{topology.default_ulysses_size(ranks, a_kv, topo)} (the default, the ranks "
                      f"per node) keeps them inside a node", UserWarning, stacklevel=3)
    return u


def _sub_group(members, local: bool):
    """``new_group(members)``: by every rank (``local=False``) or only by the members."""
    if not local:
        return dist.new_group(members)
    return dist.new_group(members, use_local_synchronization=True) \
        if dist.get_rank() in members else None


def usp_attention(q, k, v, causal: bool = True, layout: str = "zigzag", ulysses_size: int = None,
                  group=None, *, doc_ids=None, scale=None, impl: str = "auto"):
    """USP attention of local shards ``q`` ``(b, c, a, d)``, ``k``/``v`` ``(b, c, a_kv, d)``.

    ``c = s/N`` tokens per rank in ``layout`` order (``"zigzag"`` or ``"contiguous"``, as
    :func:`shard_sequence` gives them). ``ulysses_size`` must divide ``N`` and ``a_kv``;
    ``None``: the ranks per node (:func:`choose_ulysses_size`).
    Returns this rank's output ``(b, c, a, d)``, differentiable; ``doc_ids``: a document
    mask over the ``s`` global positions.
    """
    require_rank("usp_attention")
    try:
        layout = layout_name(layout)
    except ValueError:
        pass                                 # named below with the layouts USP supports
    if layout not in ("zigzag", "contiguous"):
        raise ValueError(f"usp_attention supports layout 'zigzag' or 'contiguous' (those of the "
                         f"ring), got {layout!r}")
    n, rank = comm.group_size(group), comm.group_rank(group)
    check_local_qkv(q, k, v, "usp_attention")
    u = choose_ulysses_size(ulysses_size, k.shape[2], group)
    a, a_kv = q.shape[2], k.shape[2]
    check_heads(a, a_kv, u, n)
    comm.check_same_shape(q, group, "usp_attention: q")
    comm.check_same_shape(k, group, "usp_attention: k")
    c = q.shape[1]
    s, ring_size, ring_index = n * c, n // u, rank // u
    pos = shard_positions(s, n, layout)                     # validates s for the layout
    held = np.concatenate(pos[ring_index * u:(ring_index + 1) * u])   # after seq_to_heads
    order = np.argsort(held, kind="stable")
    assert np.array_equal(held[order], shard_positions(s, ring_size, layout)[ring_index])
    fwd = torch.as_tensor(order, dtype=torch.long, device=q.device)
    back = torch.argsort(fwd)
    uly_pg, ring_pg = usp_groups(u, group)
    qh, kh, vh = (seq_to_heads(t, uly_pg)[:, fwd] for t in (q, k, v))   # (b, u c, ., d), sorted
    o = ring_attention(qh, kh, vh, causal=causal, layout=layout, group=ring_pg, scale=scale,
                       impl=impl, doc_ids=doc_ids)
    return heads_to_seq(o[:, back], uly_pg)
