"""Checks of notebook 03: load balance."""
from __future__ import annotations

from .core import _exercise, _call, _close_number, _compare, _compare_shards


NB03 = "03_load_balance"


@_exercise("zigzag_positions", NB03, 1, "the zig-zag layout")
def check_zigzag_positions(zigzag_positions, rng):
    """``zigzag_positions(s, n) -> list`` of ``n`` int arrays: rank r holds chunk r and chunk
    2n-1-r of the 2n chunks of s/(2n) tokens, in increasing order."""
    from ..layouts import shard_positions
    cases = [(2 * n * m, n) for n, m in zip(rng.integers(2, 9, size=5), rng.integers(1, 5, size=5))]
    cases.append((8, 4))
    for s, n in cases:
        s, n = int(s), int(n)
        target = shard_positions(s, n, "zigzag")
        out = _call(zigzag_positions, s, n)
        _compare_shards("zigzag_positions", out, target, where=f"s={s}, N_c={n}",
                        what="token id", axes=("slot",), exact=True,
                        hint=f"cut the sequence into 2n = {2 * n} chunks of s/(2n) = {s // (2 * n)} "
                             f"tokens; rank r takes chunk r and chunk 2n-1-r (rank 0: the first "
                             f"and the last chunk), chunk r's ids first, so each array is sorted")
    return f"{len(cases)} cases (N_c in 2..8): every rank holds chunks r and 2N_c-1-r"


@_exercise("causal_work", NB03, 2, "causal work per round and rank")
def check_causal_work(causal_work, rng):
    """``causal_work(positions) -> array (rounds, ranks)``: ``work[k, r]`` counts the pairs
    (query in ``positions[r]``, key in ``positions[(r-k) % n]``) with key <= query."""
    from ..layouts import causal_work as ref_work, shard_positions
    cases = []
    for layout in ("contiguous", "zigzag", "striped"):
        n = int(rng.integers(3, 7))
        cases.append((layout, n, 2 * n * int(rng.integers(1, 4))))
    for layout, n, s in cases:
        target = ref_work(n, layout, s=s)
        out = _call(causal_work, [p.copy() for p in shard_positions(s, n, layout)])
        _compare("causal_work", out, target, where=f"{layout} layout, s={s}, N_c={n}",
                 what="work", axes=("round", "rank"), exact=True,
                 hint="rows are rounds, columns are ranks; in round k rank r holds the K/V of "
                      "rank (r - k) mod N_c; count pairs with key <= query (the diagonal counts)")
    return f"{len(cases)} random cases (contiguous, zigzag, striped; N_c in 3..6) match pair counts"


@_exercise("ring_time", NB03, 1, "ring time")
def check_ring_time(ring_time, rng):
    """``ring_time(work) -> number``: every round lasts as long as its busiest rank, so the
    ring takes ``sum over rounds of max over ranks``."""
    from ..layouts import causal_work as ref_work, ring_time as ref_time
    cases = [rng.integers(0, 20, size=(int(n), int(n))) for n in rng.integers(3, 7, size=4)]
    cases += [ref_work(n, lay) for n, lay in ((4, "contiguous"), (5, "zigzag"))]
    for i, work in enumerate(cases):
        out = _call(ring_time, work.copy())
        _close_number("ring_time", out, ref_time(work), where=f"case {i} (work of shape {work.shape})",
                      what="ring time",
                      hint="work[k, r] is round k, rank r; all ranks wait for the slowest in each "
                           "round: sum over rounds (axis 0) of the max over ranks (axis 1)")
    return f"{len(cases)} cases (random work matrices and the lesson's layouts)"
