"""How MoE copies travel: the flat all-to-all, and the two-level (node, GPU) dispatch.

Both take a :class:`DispatchPlan`, this rank's kept :class:`Copies` (copy ``j = slot`` of
token ``tok`` goes to expert ``e = experts[tok, slot]``, local expert ``e % (E/N_e)`` of group
rank ``e // (E/N_e)``) and the shape of the group, and return ``y (T, h)``, the
gate-weighted sum of each token's expert outputs. ``experts_fn(rows, counts)`` runs this
rank's experts on the rows it received, ``counts (N_e, E/N_e)`` rows per (source rank, local
expert) in that order.

**Flat** (:func:`flat_exchange`): one all-to-all sends every copy to its expert's rank, a
second brings the outputs back; a token with two experts on one remote node crosses the
network twice, each way.

**Two-level** (:func:`two_level_exchange`, DeepSeek-V3's dispatch). The group's ranks fill
``G`` nodes of ``g`` ranks (node ``i // g``, local index ``i % g``). A token on rank ``src``
(node ``ns``, local index ``l``):

1. crosses once to every *remote* node that holds one of its kept experts, to that node's
   rank with the same local index ``l`` (its *relay*), with the gates of its copies there
   (:func:`to_relays`, planned by :class:`RelayPlan`);
2. the holder of the token on each node (``src`` itself on its own node, the relay on a
   remote one) sends one row per copy to the experts' ranks over the node's fast links;
3. the experts run; their outputs go back to the holder (the same links) (2-3:
   :func:`fan_out`);
4. the relay sums the outputs of its node with their gates, so one vector per (token,
   remote node) crosses back, and ``src`` adds them up (:func:`combine_on_relays`).

Worked example: 2 nodes of 2 ranks, ``E = 4`` (expert ``i`` on rank ``i``), token t on rank
0 routed to experts 2 and 3, both on node 1. Flat: two rows 0 -> 2 and 0 -> 3 cross the
network, two come back. Two-level: one row 0 -> 2 (the relay, local index 0) crosses; rank
2 keeps its copy and forwards one row to rank 3 on the node; rank 3's output returns to 2,
which sends ``g_2 y_2 + g_3 y_3`` back to 0 as one row. Network: 2 rows instead of 4.
Inter-node bytes are those of :func:`lesson10.sim.nodes.node_bytes`; the gates and expert
ids sent to the relays are recorded as ``"routing"``, the counts as ``"metadata"``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import comm

__all__ = ["all_to_all", "Copies", "DispatchPlan", "RelayPlan", "Relayed", "flat_exchange",
           "two_level_exchange", "to_relays", "fan_out", "combine_on_relays", "flat_rows"]


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


# ------------------------------------------------------------------- the data
@dataclass(frozen=True)
class Copies:
    """``m`` kept (token, expert) copies, each ``(m,)`` long: copy ``slot`` of token ``tok``
    goes to local expert ``expert_local`` of group rank ``dest``."""
    tok: torch.Tensor
    slot: torch.Tensor
    dest: torch.Tensor
    expert_local: torch.Tensor

    def where(self, mask: torch.Tensor) -> Copies:
        """The copies where ``mask (m,)`` is True, in their order."""
        return Copies(self.tok[mask], self.slot[mask], self.dest[mask], self.expert_local[mask])

    def gates(self, gates: torch.Tensor, dtype) -> torch.Tensor:
        """Each copy's gate, ``gates (T, k)`` -> ``(m,)`` in ``dtype``."""
        return gates[self.tok, self.slot].to(dtype)


@dataclass(frozen=True)
class DispatchPlan:
    """What a layer decided before a token moves: its kept :class:`Copies`; the group of
    ``n`` ranks with ``El`` experts each, in nodes of ``node_size`` ranks; and
    ``recv_counts (n, El)``, the rows each rank sends here per local expert, when the count
    exchange already told (else :func:`flat_rows` exchanges them)."""
    copies: Copies
    n: int
    El: int
    node_size: int
    group: object = None
    recv_counts: torch.Tensor | None = None


def _weighted_sum(like: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor,
                  out: torch.Tensor) -> torch.Tensor:
    """``zeros_like(like)`` with ``weights[i] * out[i]`` added at row ``rows[i]``."""
    return torch.zeros_like(like).index_add(0, rows, weights[:, None] * out)


# ----------------------------------------------------------------------- flat
def flat_exchange(x, gates, plan: DispatchPlan, experts_fn):
    """One copy per (token, expert) to the expert's rank and back (the flat dispatch)."""
    c = plan.copies
    out = flat_rows(x[c.tok], c.dest, c.expert_local, plan, experts_fn, plan.recv_counts)
    return _weighted_sum(x, c.tok, c.gates(gates, x.dtype), out)       # (T, h)


def flat_rows(rows, dest, expert_local, plan: DispatchPlan, experts_fn, recv_counts=None):
    """Rows ``(m, h)`` to the ranks ``dest`` for their local experts and the experts'
    outputs back, in the rows' order (the last two steps of both dispatches); ``recv_counts``
    as in :class:`DispatchPlan` (None: exchanged here)."""
    n, El, group = plan.n, plan.El, plan.group
    order = torch.argsort(dest * El + expert_local, stable=True)
    counts = torch.zeros(n, El, dtype=torch.long, device=rows.device)
    counts.index_put_((dest, expert_local), torch.ones_like(dest), accumulate=True)
    if recv_counts is None:
        recv_counts = _exchange_counts(counts, group)
    send_splits, recv_splits = counts.sum(1).tolist(), recv_counts.sum(1).tolist()
    xr = all_to_all(rows[order], recv_splits, send_splits, group)
    yb = all_to_all(experts_fn(xr, recv_counts), send_splits, recv_splits, group)
    return yb[torch.argsort(order)]                               # back to the rows' order


# ------------------------------------------------------------------ two-level
@dataclass(frozen=True)
class RelayPlan:
    """Step 1 planned: this rank's remote copies and one row per (relay, token).

    ``copies``: the copies whose expert is on another node; ``relay (m_r,)`` the group rank
    that relays each; ``row (m_r,)`` its row among the ``U`` rows sent (sorted by relay, then
    token); ``u_tok (U,)`` the token of each row; ``rows_to``, ``copies_to`` ``(n,)``: rows
    and copies per relay; ``rows_from``, ``copies_from``: the same that each rank sends here."""
    copies: Copies
    relay: torch.Tensor
    row: torch.Tensor
    u_tok: torch.Tensor
    rows_to: torch.Tensor
    copies_to: torch.Tensor
    rows_from: list
    copies_from: list

    @classmethod
    def build(cls, remote: Copies, T: int, plan: DispatchPlan) -> RelayPlan:
        """The relays of the ``remote`` copies of ``T`` tokens (one count exchange)."""
        g = plan.node_size
        relay = (remote.dest // g) * g + comm.group_rank(plan.group) % g   # same local index
        span = max(T, 1)
        uniq, row = torch.unique(relay * span + remote.tok, sorted=True, return_inverse=True)
        rows_to = torch.bincount(uniq // span, minlength=plan.n)          # tokens per relay
        copies_to = torch.bincount(relay, minlength=plan.n)
        got = _exchange_counts(torch.stack([rows_to, copies_to], 1), plan.group)   # (n, 2)
        return cls(remote, relay, row, uniq % span, rows_to, copies_to,
                   got[:, 0].tolist(), got[:, 1].tolist())


@dataclass(frozen=True)
class Relayed:
    """What a relay received in step 1: ``x1 (R1, h)`` the relayed token rows, and for each of
    the ``m1`` copies they stand for (each ``(m1,)``) its ``row`` of ``x1``, its expert's group
    rank ``dest`` and local expert ``expert_local``, and its ``gate``."""
    x1: torch.Tensor
    row: torch.Tensor
    dest: torch.Tensor
    expert_local: torch.Tensor
    gate: torch.Tensor


def to_relays(x, gates, rp: RelayPlan, group) -> Relayed:
    """Step 1: each (relay, token) row once across the network, and the gate, expert rank and
    local expert of every copy it stands for (``"routing"`` bytes)."""
    c = rp.copies
    x1 = all_to_all(x[rp.u_tok], rp.rows_from, rp.rows_to.tolist(), group)     # (R1, h)
    by_relay = torch.argsort(rp.relay, stable=True)                # copies grouped by relay
    first = torch.cumsum(rp.rows_to, 0) - rp.rows_to               # first row per relay
    meta = torch.stack([rp.row - first[rp.relay], c.dest, c.expert_local], 1)[by_relay]
    copies_to = rp.copies_to.tolist()
    meta1 = comm.all_to_all_single(meta, rp.copies_from, copies_to, group, op="routing")
    gate1 = all_to_all(c.gates(gates, x.dtype)[by_relay][:, None], rp.copies_from, copies_to,
                       group, op="routing")[:, 0]
    dev = x.device
    rows_from = torch.tensor(rp.rows_from, device=dev)
    src_of = torch.repeat_interleave(torch.arange(len(rp.rows_from), device=dev),
                                     torch.tensor(rp.copies_from, device=dev))
    row1 = meta1[:, 0] + (torch.cumsum(rows_from, 0) - rows_from)[src_of]   # (m1,) row of x1
    return Relayed(x1, row1, meta1[:, 1], meta1[:, 2], gate1)


def fan_out(x, own: Copies, relayed: Relayed, plan: DispatchPlan, experts_fn):
    """Steps 2-3: the holder's copies (its own tokens on this node, the relayed ones) to the
    experts' ranks inside the node and their outputs back: ``(out_own, out_relayed)``."""
    r = relayed
    rows = torch.cat([x[own.tok], r.x1[r.row]])
    out = flat_rows(rows, torch.cat([own.dest, r.dest]),
                    torch.cat([own.expert_local, r.expert_local]), plan, experts_fn)
    m_own = own.tok.shape[0]
    return out[:m_own], out[m_own:]


def combine_on_relays(relayed: Relayed, out_relayed, rp: RelayPlan, group):
    """Step 4: each relay sums the gated outputs of its node per token row and sends one row
    back per (token, remote node): ``(U, h)`` in the order of ``rp.u_tok``."""
    partial = _weighted_sum(relayed.x1, relayed.row, relayed.gate, out_relayed)
    return all_to_all(partial, rp.rows_to.tolist(), rp.rows_from, group)


def two_level_exchange(x, gates, plan: DispatchPlan, experts_fn):
    """The dispatch and combine of the module docstring (``plan.node_size`` ranks per node):
    to the relays, fan out on each node, combine on the relays."""
    c = plan.copies
    remote = c.dest // plan.node_size != comm.group_rank(plan.group) // plan.node_size
    own = c.where(~remote)
    rp = RelayPlan.build(c.where(remote), x.shape[0], plan)
    relayed = to_relays(x, gates, rp, plan.group)
    out_own, out_relayed = fan_out(x, own, relayed, plan, experts_fn)
    y = _weighted_sum(x, own.tok, own.gates(gates, x.dtype), out_own)
    back = combine_on_relays(relayed, out_relayed, rp, plan.group)
    return y.index_add(0, rp.u_tok, back)
