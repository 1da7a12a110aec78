"""Checks of notebook 03: load balance."""
from __future__ import annotations

import numpy as np

from . import mistakes
from .core import (
    as_shard_list,
    close_number,
    compare_arrays,
    compare_shards,
    int_array,
    log_int,
    register_exercise,
    run_student,
)
from .parts import in_part

NB03 = "03_load_balance"


@register_exercise("zigzag_positions", NB03, 1, "the zig-zag layout")
def check_zigzag_positions(zigzag_positions, rng):
    """``zigzag_positions(s, n) -> list`` of ``n`` integer arrays: rank r holds chunk r and
    chunk 2n-1-r of the 2n chunks of s/(2n) tokens, in increasing order."""
    from ..layouts import shard_positions
    cases = [(2, 1), (4, 1), (8, 4), (24, 3), (16, 2), (12, 6)]       # n = 1, m = 1, m > 1
    for i in range(6):       # N_c up to 64, chunks up to 2048 tokens: no table covers them
        big = i % 2 == 1
        n = log_int(rng, 2, 64, big)
        cases.append((2 * n * log_int(rng, 1, 2048, big), n))
    for s, n in cases:
        target = shard_positions(s, n, "zigzag")
        out = run_student("zigzag_positions", zigzag_positions, (), s, n)
        where = f"s={s}, N_c={n}"
        hint = (lambda: mistakes.zigzag_mistake(s, n, out) or
                f"cut the sequence into 2N_c = {2 * n} chunks of s/(2N_c) = {s // (2 * n)} tokens; "
                f"each rank holds one early and one late chunk, paired so that every rank's two "
                f"chunks together carry the same causal work")
        for r, ids in enumerate(as_shard_list("zigzag_positions", out, n, where, "your list")):
            int_array("zigzag_positions", ids, f"{where}, rank {r}", "the token ids",
                       hint="token ids are integers (they index arrays): np.arange gives integers, "
                            "np.linspace and / give floats")
        compare_shards("zigzag_positions", out, target, where=where, what="token id",
                        axes=("slot",), exact=True, hint=hint)
    return (f"{len(cases)} cases (N_c in 1..64, chunks of 1..2048 tokens): every rank holds chunks r "
            f"and 2N_c-1-r")


def _pair_counts(positions) -> np.ndarray:
    """work[k, r] for any positions (the layouts module counts the named layouts only)."""
    n = len(positions)
    return np.array([[int((positions[(r - k) % n][None, :] <= positions[r][:, None]).sum())
                      for r in range(n)] for k in range(n)])


def _work_cases(rng, n_random=6):
    """(label, positions): every layout, shuffled ids, uneven sizes, N_c = 1, then random."""
    from ..layouts import shard_positions
    cases = [(f"{lay} layout, s={s}, N_c={n}", shard_positions(s, n, lay))
             for lay, s, n in (("contiguous", 8, 4), ("zigzag", 12, 3), ("striped", 12, 4),
                               ("contiguous", 6, 2), ("contiguous", 4, 1))]
    ids = rng.permutation(9)
    cases.append(("shuffled token ids (3 per rank, in no particular order), N_c=3",
                  np.split(ids, 3)))
    ids = rng.permutation(8)
    cases.append(("uneven sizes: 2, 5 and 1 tokens", [ids[:2], ids[2:7], ids[7:]]))
    for i in range(n_random):    # half of them (at least) random ids: no table covers them
        n, c = int(rng.integers(2, 13)), int(rng.integers(1, 7))
        if i % 2 and rng.random() < 0.5:
            lay = str(rng.choice(["contiguous", "zigzag", "striped"]))
            s = 2 * n * c if lay == "zigzag" else n * c
            cases.append((f"{lay} layout, s={s}, N_c={n}", shard_positions(s, n, lay)))
        else:
            cases.append((f"random token ids, N_c={n}, c={c}", np.split(rng.permutation(n * c), n)))
    return cases


@register_exercise("causal_work", NB03, 2, "causal work per round and rank",
                   parts=(("named layouts", 1), ("any token ids", 1)))
def check_causal_work(causal_work, rng):
    """``causal_work(positions) -> array (rounds, ranks)``: ``work[k, r]`` counts the pairs
    (query in ``positions[r]``, key in ``positions[(r-k) % n]``) with key <= query."""
    cases = _work_cases(rng)
    for where, positions in cases:
        if not in_part("named layouts" if " layout, " in where else "any token ids"):
            continue
        out = run_student("causal_work", causal_work, ("positions",), [np.array(p) for p in positions])
        compare_arrays("causal_work", out, _pair_counts(positions), where=where,
                 what="work", axes=("round", "rank"), exact=True,
                 hint=lambda: mistakes.causal_work_mistake(positions, out) or (
                     "rows are rounds, columns are ranks; in round k rank r holds the K/V block "
                     "that started on rank (r - k) mod N_c; count the visible (query, key) pairs "
                     "by their token ids"))
    return f"{len(cases)} cases (every layout, shuffled ids, uneven sizes, N_c in 1..12) match pair counts"


@register_exercise("ring_time", NB03, 1, "ring time")
def check_ring_time(ring_time, rng):
    """``ring_time(work) -> number``: every round lasts as long as its busiest rank, so the
    ring takes ``sum over rounds of max over ranks``. ``work`` may be fractional (block
    units, as ``layouts.causal_work(n, layout)`` returns them)."""
    from ..layouts import causal_work as ref_work
    from ..layouts import ring_time as ref_time
    cases = [("block units, contiguous, N_c=4", ref_work(4, "contiguous")),
             ("block units, zigzag, N_c=5", ref_work(5, "zigzag")),
             ("block units, striped, N_c=3", ref_work(3, "striped")),
             ("pair counts, contiguous, s=8, N_c=4", ref_work(4, "contiguous", s=8)),
             ("one rank", np.array([[3.5]])),
             ("integer work", rng.integers(0, 20, size=(4, 4))),
             ("fractional work", rng.integers(0, 9, size=(5, 5)) / 2)]
    for i in range(8):
        n = int(rng.integers(2, 7))
        work = rng.integers(0, 30, size=(n, n))
        cases.append((f"random work {i}", work / 4 if rng.random() < 0.5 else work))
    for label, work in cases:
        out = run_student("ring_time", ring_time, ("work",), work)
        close_number("ring_time", out, ref_time(work), where=f"{label} (work of shape {work.shape})",
                      what="ring time",
                      hint=lambda: mistakes.ring_time_mistake(work, out) or (
                          "work[k, r] is round k, rank r; in every round all ranks wait for the "
                          "slowest one; work may be fractional"))
    return f"{len(cases)} cases (block units with halves, pair counts, random work matrices)"
