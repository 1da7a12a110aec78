"""How MoE copies travel: the flat all-to-all, and the two-level (node, GPU) dispatch.

Both take this rank's kept copies (``tok``, ``slot``: copy ``j = slot`` of token ``tok``
goes to expert ``e = experts[tok, slot]`` on group rank ``e // (E/N_e)``) and return
``y (T, h)``, the gate-weighted sum of each token's expert outputs. ``experts_fn(rows,
counts)`` runs this rank's experts on the rows it received, ``counts (N_e, E/N_e)`` rows per
(source rank, local expert) in that order.

**Flat** (:func:`flat_exchange`): one all-to-all sends every copy to its expert's rank, a
second brings the outputs back; a token with two experts on one remote node crosses the
network twice, each way.

**Two-level** (:func:`two_level_exchange`, DeepSeek-V3's dispatch). The group's ranks fill
``G`` nodes of ``g`` ranks (node ``i // g``, local index ``i % g``). A token on rank ``src``
(node ``ns``, local index ``l``):

1. crosses once to every *remote* node that holds one of its kept experts, to that node's
   rank with the same local index ``l`` (its *relay*), with the gates of its copies there;
2. the holder of the token on each node (``src`` itself on its own node, the relay on a
   remote one) sends one row per copy to the experts' ranks over the node's fast links;
3. the experts run; their outputs go back to the holder (the same links);
4. the relay sums the outputs of its node with their gates, so one vector per (token,
   remote node) crosses back, and ``src`` adds them up.

Worked example: 2 nodes of 2 ranks, ``E = 4`` (expert ``i`` on rank ``i``), token t on rank
0 routed to experts 2 and 3, both on node 1. Flat: two rows 0 -> 2 and 0 -> 3 cross the
network, two come back. Two-level: one row 0 -> 2 (the relay, local index 0) crosses; rank
2 keeps its copy and forwards one row to rank 3 on the node; rank 3's output returns to 2,
which sends ``g_2 y_2 + g_3 y_3`` back to 0 as one row. Network: 2 rows instead of 4.
Inter-node bytes are those of :func:`lesson10.sim.nodes.node_bytes`; the gates and expert
ids sent to the relays are recorded as ``"routing"``, the counts as ``"metadata"``.
"""
from __future__ import annotations

import torch

from . import comm

__all__ = ["all_to_all", "flat_exchange", "two_level_exchange"]


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` with uneven splits; backward = the same with splits swapped."""

    @staticmethod
    def forward(ctx, x, output_splits, input_splits, group, op):
        ctx.splits, ctx.group, ctx.op = (output_splits, input_splits), group, op
        return comm.all_to_all_single(x, output_splits, input_splits, group, op=op)

    @staticmethod
    def backward(ctx, dy):
        out_s, in_s = ctx.splits
        return comm.all_to_all_single(dy, in_s, out_s, ctx.group, op=ctx.op), None, None, None, None


def all_to_all(x: torch.Tensor, output_splits, input_splits, group=None,
               op: str = "all_to_all") -> torch.Tensor:
    """Differentiable ``all_to_all_single`` along dim 0: ``input_splits[j]`` rows go to rank
    ``j``, ``output_splits[j]`` rows come from it; bytes recorded under ``op``."""
    return _AllToAll.apply(x, [int(v) for v in output_splits], [int(v) for v in input_splits],
                           group, op)


def _exchange_counts(counts: torch.Tensor, group) -> torch.Tensor:
    """``counts (N_e, m)`` row ``j`` for rank ``j`` -> ``(N_e, m)`` row ``j`` from rank ``j``."""
    n = counts.shape[0]
    return comm.all_to_all_single(counts.reshape(n, -1), group=group, op="metadata")


def flat_exchange(x, gates, tok, slot, dest, expert_local, n, El, experts_fn, group,
                  recv_counts=None):
    """One copy per (token, expert) to the expert's rank and back; ``dest (m,)`` group rank
    and ``expert_local (m,)`` local expert of each kept copy; ``recv_counts (N_e, El)``: the
    rows each rank sends here per local expert, when the caller knows them (else exchanged)."""
    out = flat_rows(x[tok], dest, expert_local, n, El, experts_fn, group, recv_counts)  # (m, h)
    return torch.zeros_like(x).index_add(0, tok, gates[tok, slot, None].to(x.dtype) * out)


def two_level_exchange(x, gates, tok, slot, dest, expert_local, n, El, g, experts_fn, group):
    """The dispatch and combine of the module docstring, ``g`` ranks per node; same
    arguments as :func:`flat_exchange`."""
    r = comm.group_rank(group)
    node, dest_node = r // g, dest // g
    remote = dest_node != node
    # 1. one row per (token, remote node) to the relay; the copies' gates and experts with it
    relay = dest_node[remote] * g + r % g                         # (m_remote,) group ranks
    key = relay * max(x.shape[0], 1) + tok[remote]
    uniq, which = torch.unique(key, sorted=True, return_inverse=True)   # (U,), (m_remote,)
    u_relay, u_tok = uniq // max(x.shape[0], 1), uniq % max(x.shape[0], 1)
    copy_order = torch.argsort(relay, stable=True)                # copies grouped by relay
    rows_to = torch.bincount(u_relay, minlength=n)                # (N_e,) tokens per relay
    copies_to = torch.bincount(relay, minlength=n)
    got = _exchange_counts(torch.stack([rows_to, copies_to], 1), group)   # (N_e, 2)
    rows_from, copies_from = got[:, 0].tolist(), got[:, 1].tolist()
    x1 = all_to_all(x[u_tok], rows_from, rows_to.tolist(), group)         # (R1, h) relayed
    first = torch.cumsum(rows_to, 0) - rows_to                    # first row per relay
    meta = torch.stack([which - first[relay],                     # row within the relay block
                        dest[remote], expert_local[remote]], 1)[copy_order]
    meta1 = comm.all_to_all_single(meta, copies_from, copies_to.tolist(), group, op="routing")
    gate1 = all_to_all(gates[tok[remote], slot[remote]][copy_order].to(x.dtype)[:, None],
                       copies_from, copies_to.tolist(), group, op="routing")[:, 0]
    src_first = torch.cumsum(torch.tensor(rows_from, device=x.device), 0) \
        - torch.tensor(rows_from, device=x.device)
    src_of = torch.repeat_interleave(torch.arange(n, device=x.device),
                                     torch.tensor(copies_from, device=x.device))
    row1 = meta1[:, 0] + src_first[src_of]                        # (m1,) row of x1
    # 2.-3. the holder's copies (own tokens on this node, relayed ones) to the experts
    own = ~remote
    hold_x = torch.cat([x[tok[own]], x1[row1]])
    out = flat_rows(hold_x, torch.cat([dest[own], meta1[:, 1]]),
                    torch.cat([expert_local[own], meta1[:, 2]]), n, El, experts_fn, group)
    m_own = int(own.sum())
    # 4. own copies summed here; relayed ones summed on the relay, one row back per token
    y = torch.zeros_like(x).index_add(0, tok[own],
                                      gates[tok[own], slot[own], None].to(x.dtype) * out[:m_own])
    partial = torch.zeros_like(x1).index_add(0, row1, gate1[:, None] * out[m_own:])
    back = all_to_all(partial, rows_to.tolist(), rows_from, group)      # (U, h)
    return y.index_add(0, u_tok, back)


def flat_rows(rows, dest, expert_local, n, El, experts_fn, group, recv_counts=None):
    """Rows ``(m, h)`` to the ranks ``dest`` for their local experts and the experts'
    outputs back, in the rows' order (the last two steps of both dispatches); ``recv_counts``
    as in :func:`flat_exchange`."""
    order = torch.argsort(dest * El + expert_local, stable=True)
    counts = torch.zeros(n, El, dtype=torch.long, device=rows.device)
    counts.index_put_((dest, expert_local), torch.ones_like(dest), accumulate=True)
    if recv_counts is None:
        recv_counts = _exchange_counts(counts, group)
    send_splits, recv_splits = counts.sum(1).tolist(), recv_counts.sum(1).tolist()
    xr = all_to_all(rows[order], recv_splits, send_splits, group)
    yb = all_to_all(experts_fn(xr, recv_counts), send_splits, recv_splits, group)
    return yb[torch.argsort(order)]                               # back to the rows' order
