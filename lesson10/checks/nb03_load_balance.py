"""Checks of notebook 03: load balance."""
from __future__ import annotations

import numpy as np

from . import mistakes
from .core import (
    Cases,
    as_shard_list,
    close_number,
    compare_arrays,
    compare_shards,
    int_array,
    log_int,
    register_exercise,
    run_student,
)
from .diagnosis import Diagnosis
from .parts import in_part, recognised

NB03 = "03_load_balance"


# --------------------------------------------------------------------------- the mistakes
def zigzag_mistake(s, n, out) -> Diagnosis | None:
    m = s // (2 * n)

    def chunks(pairs):
        return [np.concatenate([np.arange(a * m, (a + 1) * m), np.arange(b * m, (b + 1) * m)])
                for a, b in pairs]
    return mistakes.first(out, [
        ("rank r holds chunks r and N_c + r: its late chunk lies as far into the second half as "
         "its early one into the first, so the ranks' work still differs; pair the chunks so "
         "that every rank's two chunks together carry the same work",
         lambda: chunks([(r, n + r) for r in range(n)])),
        ("your late chunks are one chunk off: rank 0's wrapped around to chunk 0, which it "
         "already holds (the 2N_c chunks are numbered 0 .. 2N_c - 1)",
         lambda: chunks([(r, (2 * n - r) % (2 * n)) for r in range(n)])),
        ("your ranks hold the chunks paired from the middle out (rank 0 the two middle ones): "
         "rank r holds chunk r of the first half", lambda: chunks([(n - 1 - r, n + r) for r in range(n)])),
        ("the right tokens, but the late chunk comes first: keep each rank's ids in increasing "
         "order", lambda: chunks([(2 * n - 1 - r, r) for r in range(n)])),
        ("your chunks have s/N_c tokens: the sequence is cut into 2N_c chunks of s/(2N_c)",
         lambda: [np.concatenate([np.arange(r * 2 * m, (r + 1) * 2 * m),
                                  np.arange((2 * n - 1 - r) * 2 * m, (2 * n - r) * 2 * m)])
                  for r in range(n)]),
    ])


def causal_work_mistake(positions, out) -> Diagnosis | None:
    n = len(positions)
    pos = [np.asarray(p) for p in positions]

    def count(rule, kv=lambda r, k: (r - k) % n):
        return np.array([[int(rule(pos[kv(r, k)][None, :], pos[r][:, None]).sum())
                          for r in range(n)] for k in range(n)])
    right = count(lambda key, q: key <= q)
    return mistakes.first(out, [
        ("your counts leave out the diagonal: a key at the query's own position is visible "
         "(key <= query)", lambda: count(lambda key, q: key < q)),
        ("rows and columns are swapped: rows are rounds, columns are ranks",
         lambda: right.T if n > 1 else None),
        ("in round k your rank r holds the block of rank r + k: the blocks travel to r + 1, so "
         "rank r holds that of rank r - k", lambda: count(lambda key, q: key <= q, lambda r, k: (r + k) % n)),
        ("your counts compare row numbers within each block (in this layout that is the same as "
         "counting every rank against its own block in every round): compare the token ids of "
         "the visiting block",
         lambda: np.array([[int((np.arange(len(pos[(r - k) % n]))[None, :]
                                 <= np.arange(len(pos[r]))[:, None]).sum())
                            for r in range(n)] for k in range(n)])),
        ("every round counts the rank against its own block: in round k the visiting block is "
         "another rank's", lambda: count(lambda key, q: key <= q, lambda r, k: r)),
        ("your counts assume sorted ids (np.searchsorted needs a sorted array): the ids of a "
         "rank may come in any order",
         lambda: np.array([[int(np.searchsorted(pos[(r - k) % n], pos[r], side="right").sum())
                            for r in range(n)] for k in range(n)])),
    ])


def ring_time_mistake(work, yours) -> Diagnosis | None:
    w = np.asarray(work, dtype=float)
    right = w.max(axis=1).sum()
    idle = ("your number is waiting time (how long ranks sit idle), not the time the ring "
            "takes: a rank that waits is still part of the ring's time")
    cands = [
        ("your time is the busiest rank's total work: the ranks wait for each other in every "
         "round, so a round is not over before its slowest rank is", w.sum(axis=0).max()),
        ("your time has the rounds and the ranks the other way round: work[k, r] is round k, "
         "rank r, and the ranks of one round wait for each other", w.max(axis=0).sum()),
        ("your time is that of the average rank (total work / ranks, the ideal): a round lasts "
         "as long as its slowest rank", w.mean(axis=1).sum()),
        (idle, right - w.sum(axis=0).min()),            # the least busy rank's waiting
        (idle, len(w[0]) * right - w.sum()),            # every rank's waiting, added up
        (idle, right - w.sum() / max(1, len(w[0]))),    # the average rank's waiting
        (idle, (w.max(axis=1, keepdims=True) - w).sum()),
        ("your time is rounded down to an integer: work may come in halves of a block",
         float(int(right))),
        ("your time is the busiest cell times the number of rounds: each round has its own "
         "busiest rank", w.max() * len(w)),
    ]
    return mistakes.first(yours, mistakes.unless_right(cands, right))


@register_exercise("zigzag_positions", NB03, "the zig-zag layout",
                   withholds={
                       "lesson10.layouts.shard_positions": "adapter:shard_positions"})
def check_zigzag_positions(zigzag_positions, rng):
    """``zigzag_positions(s, n) -> list`` of ``n`` integer arrays: rank r holds chunk r of
    the 2n chunks of s/(2n) tokens and the one late chunk that balances its causal work (the
    layout ``layouts.shard_positions(s, n, "zigzag")``), in increasing order."""
    from ..layouts import shard_positions
    cases = [(2, 1), (4, 1), (8, 4), (24, 3), (16, 2), (12, 6),       # n = 1, m = 1, m > 1
             (640, 2), (131072, 4)]                   # ids above 255 and above 65535
    for i in range(6):       # N_c up to 64, chunks up to 2048 tokens: no table covers them
        big = i % 2 == 1
        n = log_int(rng, 2, 64, big)
        cases.append((2 * n * log_int(rng, 1, 2048, big), n))
    run = Cases("zigzag_positions")
    for s, n in cases:
        with run.case():
            _zigzag_case(zigzag_positions, s, n, shard_positions(s, n, "zigzag"))
    run.verdict()
    return (f"{len(cases)} cases (N_c in 1..64, chunks of 1..2048 tokens): every rank holds chunk r "
            f"and the late chunk that balances its work")


def _zigzag_case(zigzag_positions, s, n, target):
    out = run_student("zigzag_positions", zigzag_positions, (), s, n)
    where = f"s={s}, N_c={n}"
    hint = (lambda: mistakes.explain(zigzag_mistake(s, n, out),
                f"cut the sequence into 2N_c = {2 * n} chunks of s/(2N_c) = {s // (2 * n)} tokens; "
                f"each rank holds one early and one late chunk, paired so that every rank's two "
                f"chunks together carry the same causal work"))
    for r, ids in enumerate(as_shard_list("zigzag_positions", out, n, where, "your list")):
        int_array("zigzag_positions", ids, f"{where}, rank {r}", "the token ids",
                   hint="token ids are integers (they index arrays): np.arange gives integers, "
                        "np.linspace and / give floats")
    compare_shards("zigzag_positions", out, target, where=where, what="token id",
                    axes=("slot",), exact=True, hint=hint)


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
                               ("contiguous", 6, 2), ("contiguous", 4, 1),
                               ("contiguous", 48, 2), ("contiguous", 600, 2))]   # counts > 255, > 65535
    # fixed, not drawn: no batch may hold sorted ids by chance
    cases.append(("shuffled token ids (3 per rank, in no particular order), N_c=3",
                  [np.array([4, 0, 7]), np.array([2, 8, 1]), np.array([6, 3, 5])]))
    cases.append(("uneven sizes: 2, 5 and 1 tokens",
                  [np.array([5, 1]), np.array([7, 0, 3, 6, 2]), np.array([4])]))
    for i in range(n_random):    # half random ids, half named layouts of up to 64 ranks:
        if i % 2:                # no table of the named layouts' counts covers these ranges
            lay = str(rng.choice(["contiguous", "zigzag", "striped"]))
            n = log_int(rng, 2, 64, upper=i == 1)
            unit = 2 * n if lay == "zigzag" else n
            s = unit * log_int(rng, 1, max(1, WORK_TOKENS // unit))
            cases.append((f"{lay} layout, s={s}, N_c={n}", shard_positions(s, n, lay)))
        else:
            n, c = int(rng.integers(2, 13)), int(rng.integers(1, 7))
            cases.append((f"random token ids, N_c={n}, c={c}", np.split(rng.permutation(n * c), n)))
    return cases


#: the most tokens of a random named-layout case of causal_work (a student's loop over
#: every pair stays quick)
WORK_TOKENS = 512


@register_exercise("causal_work", NB03, "causal work per round and rank",
                   parts=("named layouts", "any token ids"),
                   withholds={
                       "lesson10.layouts._token_work": "adapter:token_work",
                       "lesson10.layouts.visible": None,
                       "lesson10.layouts.block_plan": None,
                       "lesson10.layouts.plan_pairs": None,
                       "lesson10.layouts.plan_mask": None,
                       "lesson10.sim.ring.ring_attention": "adapter:ring_by_documents"},
                   use_instead="count the visible pairs with NumPy")
def check_causal_work(causal_work, rng):
    """``causal_work(positions) -> array (rounds, ranks)``: ``work[k, r]`` counts the pairs
    (query in ``positions[r]``, key in ``positions[(r-k) % n]``) with key <= query."""
    cases = _work_cases(rng)
    run = Cases("causal_work")
    for where, positions in cases:
        if not in_part("named layouts" if " layout, " in where else "any token ids"):
            continue
        with run.case():
            out = run_student("causal_work", causal_work, ("positions",),
                              [np.array(p) for p in positions])
            compare_arrays("causal_work", out, _pair_counts(positions), where=where,
                           what="work", axes=("round", "rank"), exact=True,
                           hint=_work_hint(positions, out))
    run.verdict()
    return (f"{len(cases)} cases (every layout with N_c up to 64, shuffled ids, uneven sizes, "
            f"counts above 65535) match pair counts")


def _work_hint(positions, out):
    return lambda: mistakes.explain(causal_work_mistake(positions, out), (
        "rows are rounds, columns are ranks; in round k rank r holds the K/V block that started "
        "on rank (r - k) mod N_c; count the visible (query, key) pairs by their token ids"))


@register_exercise("ring_time", NB03, "ring time",
                   withholds={
                       "lesson10.layouts.ring_time": "ring_time"})
def check_ring_time(ring_time, rng):
    """``ring_time(work) -> number``: the time the whole ring takes, in the units of
    ``work`` (``work[k, r]``: round k, rank r; the ranks of a round wait for each other).
    ``work`` may be fractional (block units, as ``layouts.causal_work(n, layout)`` returns
    them) and large (pair counts above 65504, which float16 cannot hold)."""
    from ..layouts import causal_work as ref_work
    from ..layouts import ring_time as ref_time
    cases = [("block units, contiguous, N_c=4", ref_work(4, "contiguous")),
             ("block units, zigzag, N_c=5", ref_work(5, "zigzag")),
             ("block units, striped, N_c=3", ref_work(3, "striped")),
             ("pair counts, contiguous, s=8, N_c=4", ref_work(4, "contiguous", s=8)),
             ("one rank", np.array([[3.5]])),
             ("large pair counts, contiguous, s=600, N_c=2", ref_work(2, "contiguous", s=600)),
             ("large fractional work", np.arange(16).reshape(4, 4)[::-1] * 1000.5),
             ("integer work", rng.integers(0, 20, size=(4, 4))),
             ("fractional work", rng.integers(0, 9, size=(5, 5)) / 2)]
    for i in range(8):
        n = int(rng.integers(2, 7))
        work = rng.integers(0, 30, size=(n, n))
        cases.append((f"random work {i}", work / 4 if rng.random() < 0.5 else work))
    run = Cases("ring_time")
    for label, work in cases:
        with run.case():
            out = run_student("ring_time", ring_time, ("work",), work)
            close_number("ring_time", out, ref_time(work),
                         where=f"{label} (work of shape {work.shape})", what="ring time",
                         hint=_time_hint(work, out))
    run.verdict()
    return f"{len(cases)} cases (block units with halves, pair counts, random work matrices)"


def _time_hint(work, out):
    return lambda: mistakes.explain(ring_time_mistake(work, out), (
        "work[k, r] is round k, rank r; no rank starts a round before every rank has finished "
        "the one before; work may be fractional"))


# the mistakes recognised above are noted for the class report (see lesson10.checks.parts)
for _name in [n for n in list(globals()) if n.endswith("_mistake")]:
    globals()[_name] = recognised(globals()[_name])
del _name
