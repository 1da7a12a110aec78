"""What the ring exercise is served besides its network: the block kernel of each round
(:class:`ServedBlockAttention`) and the merge (:class:`ServedMerge`). Part of
:mod:`lesson10.checks.network` (see there for the rules of served objects).

The kernel watches the rounds. Rank r's t-th call (t = 0, 1, ...) must be on the K/V
block rank r holds in round t, that of rank (r - t) mod N_c, as the ring delivered it.
:class:`~lesson10.checks.network.RingNetwork` refuses step t of a rank until that rank's
call of round t has happened, so a rank attends to every block before passing it on, and
the check counts N_c calls per rank. In substituted cases the kernel adds a secret offset
to each ``out`` it returns: the target is the merge of what the kernel returned, so a
ring that computes attention itself (from the blocks it kept, say) gets another result.
"""
from __future__ import annotations

import numpy as np

from .served_attention import numeric_array, plural, same_values

__all__ = ["ServedBlockAttention", "ServedMerge"]

_KERNEL_HINT = ("in round t a rank calls the block_attention it was given once, with its own "
                "queries and the K/V block it holds in that round (as ring_shift delivered it), "
                "then passes that block on")


class ServedBlockAttention:
    """The block kernel of ``check_ring_attention``, with the signature of the student's
    ``block_attention(q, k, v, q_pos, k_pos, causal=True) -> (out, lse)``.

    ``q`` must be some rank's ``q_shards[r]`` (that names the rank), ``k`` and ``v`` the
    blocks that rank holds now on ``net`` (a RingNetwork): holding the block of rank
    (r - t) mod N_c, it is in round t, and each round gets one call. A round whose block
    the causal mask hides entirely (``causal``: the case's flag) may be skipped. It
    computes with the positions and the ``causal`` it is given. ``offsets[r][t]`` (or
    None) is added to the ``out`` of rank r's round t (the substitution)."""

    __name__ = "block_attention"

    def __init__(self, referee, net, q_shards, offsets=None, causal=True):
        self._ref, self._net = referee, net
        self._q = [np.array(q, dtype=float) for q in q_shards]
        self._offsets, self._causal = offsets, causal
        self.done: list[set] = [set() for _ in self._q]     # rounds rank r has called
        net._kernel = self

    def __repr__(self) -> str:
        return "<the check's block_attention: one call per rank and round>"

    def skippable(self, r: int, t: int) -> bool:
        """Does the causal mask hide every key of round t's block from rank r's queries?"""
        pos, j = self._net._real["positions"], (r - t) % len(self._q)
        return bool(self._causal) and len(pos[j]) > 0 and pos[j].min() > pos[r].max()

    def ready(self, r: int, t: int) -> bool:
        """May rank r pass on the block of round t (its call happened, or it may skip)?"""
        return t in self.done[r] or self.skippable(r, t)

    def _rank_of(self, q):
        return next((r for r, x in enumerate(self._q) if same_values(q, x)), None)

    def __call__(self, q, k, v, q_pos, k_pos, causal=True):
        from ..sim.attention import attention
        ref, n = self._ref, len(self._q)
        ref.guard("block_attention")
        q, k, v = (numeric_array(x) for x in (q, k, v))
        qp, kp = numeric_array(q_pos), numeric_array(k_pos)
        if q is None or k is None or v is None or qp is None or kp is None:
            ref.breach("block_attention got something that is not an array of numbers",
                       "pass NumPy arrays: q, k, v and the positions q_pos, k_pos")
        r = self._rank_of(q)
        if r is None:
            ref.breach(f"block_attention got q of shape {q.shape}, which is not the queries of any "
                       f"rank: a rank attends with its own q_shards[r], as it was given",
                       _KERNEL_HINT)
        t = self._rule_blocks(r, k, v)
        if t in self.done[r]:
            ref.breach(f"block_attention ran for rank {r} a second time in round {t} (on the block "
                       f"of rank {(r - t) % n})", "attend, merge, shift: one call per rank and "
                                                  "round, then the block moves on")
        if qp.shape != (len(q),) or kp.shape != (len(k),):
            ref.breach(f"block_attention got q_pos of shape {qp.shape} and k_pos of shape "
                       f"{kp.shape} for {plural(len(q), 'query', 'queries')} and "
                       f"{plural(len(k), 'key')}", "one global position per query row and one "
                                                   "per key row")
        with np.errstate(all="ignore"):
            out, lse = attention(q.astype(float), k.astype(float), v.astype(float),
                                 causal=bool(causal), q_pos=qp, k_pos=kp)
        if self._offsets is not None:
            out = out + self._offsets[r][t]
        self.done[r].add(t)
        return out, lse

    def _rule_blocks(self, r, k, v) -> int:
        """k and v are the blocks rank r holds now, of one round: returns that round."""
        ref, net, n = self._ref, self._net, len(self._q)
        j = net._holds["K"][r]
        if net._holds["V"][r] != j:
            ref.breach(f"block_attention for rank {r}: it holds the K block of rank {j} but the V "
                       f"block of rank {net._holds['V'][r]}", "K and V of a block belong to one "
                                                              "round: shift both before the next call")
        for kind, x in (("K", k), ("V", v)):
            if not same_values(x, net._value[kind][r]):
                found = net._classify(x)
                hint = ("a rank attends only to the block it holds in this round, as ring_shift "
                        "delivered it; it keeps no other block")
                if found is not None and found[0] == kind and found[1] == j:
                    hint = ("a rank may use only its own k_shards[r], v_shards[r] and what "
                            "ring_shift returned to it: reading k_shards[j] of another rank means "
                            "reading another GPU's memory")
                if found is not None and found[0] == kind:
                    what = (f"the {kind} block of rank {found[1]}" + (
                        f" as {'k' if kind == 'K' else 'v'}_shards[{found[1]}] holds it, not the "
                        f"copy the ring delivered" if found[1] == j else ""))
                elif x.ndim >= 1 and len(x) > len(net._value[kind][r]):
                    what = (f"{len(x)} rows, several blocks at once: a rank holds one block per "
                            f"round")
                else:
                    what = f"an array of shape {x.shape} that is not the {kind} block it holds"
                ref.breach(f"block_attention for rank {r}: {'k' if kind == 'K' else 'v'} is "
                           f"{what}; rank {r} holds the {kind} block of rank {j} now", hint)
        return (r - j) % n

    def _finish(self) -> None:
        ref, n = self._ref, len(self._q)
        ref.verdict()
        if not any(self.done):
            ref.fail("your ring_attention never called the block_attention it was given",
                     "the check counts the rounds: in each one a rank calls the block_attention "
                     "it was given (the function's argument) on the block it holds, and merges "
                     "the result into its running output")
        for r in range(n):
            missing = [t for t in range(n) if not self.ready(r, t)]
            if missing:
                ref.fail(f"block_attention ran {plural(len(self.done[r]), 'time')} for rank {r}; "
                         f"{'round' if len(missing) == 1 else 'rounds'} {missing} of N_c = {n} "
                         f"had no call", "the check counts the rounds: in each one a rank calls "
                                         "the block_attention it was given on the block it holds")

    def _target(self, causal: bool):
        """What an honest ring gets: per rank, the merge over the rounds of the kernel's
        output on the block the network delivered (with the offsets)."""
        from ..sim.attention import attention, merge
        net, n, out = self._net, len(self._q), []
        pos = net._real["positions"]
        for r in range(n):
            o = np.zeros(self._q[r].shape[:2] + net._real["V"][r].shape[2:])
            lse = np.full(self._q[r].shape[:2], -np.inf)
            for t in range(n):
                j = (r - t) % n
                k, v = ((net._real if j == r else net._deliv)[kind][j] for kind in ("K", "V"))
                ob, lb = attention(self._q[r], k, v, causal=causal, q_pos=pos[r], k_pos=pos[j])
                if self._offsets is not None:
                    ob = ob + self._offsets[r][t]
                o, lse = merge(o, lse, ob, lb)
            out.append(o)
        return out

    def _plain_merge(self, causal: bool):
        """The output without the offsets (what a ring gets that computes attention itself)."""
        kept, self._offsets = self._offsets, None
        try:
            return self._target(causal)
        finally:
            self._offsets = kept


class ServedMerge:
    """The merge of ``check_ring_attention``: ``merge(o1, lse1, o2, lse2) -> (o, lse)``, the
    course's own (a ring may also merge inline)."""

    __name__ = "merge"

    def __init__(self, referee):
        self._ref = referee

    def __repr__(self) -> str:
        return "<the check's merge>"

    def __call__(self, o1, lse1, o2, lse2):
        from ..sim.attention import merge
        ref = self._ref
        ref.guard("merge")
        arrs = [numeric_array(x) for x in (o1, lse1, o2, lse2)]
        if any(a is None for a in arrs):
            ref.breach("merge got something that is not an array of numbers",
                       "pass the running (o, lse) and the block's (out, lse) as NumPy arrays")
        o1a, l1a, o2a, l2a = (a.astype(float) for a in arrs if a is not None)
        if o1a.shape != o2a.shape or l1a.shape != l2a.shape or o1a.shape[:2] != l1a.shape:
            ref.breach(f"merge got o1 {o1a.shape}, lse1 {l1a.shape}, o2 {o2a.shape}, lse2 "
                       f"{l2a.shape}", "o1 and o2 are (c, a, d), lse1 and lse2 (c, a): one rank's "
                                       "running result and the block's result")
        with np.errstate(all="ignore"):
            return merge(o1a, l1a, o2a, l2a)
