"""Which tokens each rank holds, and how much causal attention work that gives it.

A *layout* maps the ``s`` tokens of one sequence onto ``n`` ranks:

* ``"contiguous"``: rank ``r`` holds block ``r`` of ``c = s/n`` tokens;
* ``"zigzag"``: cut the sequence into ``2n`` chunks of ``c/2`` tokens; rank ``r``
  holds chunk ``r`` (early) and chunk ``2n-1-r`` (late), as in Llama 3;
* ``"striped"``: token ``i`` lives on rank ``i mod n``.

In ring attention round ``k`` (``k = 0 .. n-1``) rank ``r`` holds the K/V tokens of
rank ``(r - k) mod n``; with a causal mask it only computes the (query, key)
pairs with ``key <= query``. :func:`causal_work` counts them per (round, rank)
and :func:`ring_time` turns that into the time of the ring, where every round
lasts as long as its busiest rank.

Positions are the one currency: a layout name becomes positions once
(:func:`shard_positions`), and :func:`block_plan` turns the positions of some queries and
some keys into the kernel-sized blocks worth computing. The real ring and all-gather
(``lesson10.spmd``), the simulation's work and skip counts, :func:`causal_work` and the
ring figure all read that one plan, so a new layout needs no edit anywhere else.
"""
from __future__ import annotations

from fractions import Fraction
from typing import NamedTuple

import numpy as np

from .rules import count

__all__ = [
    "LAYOUTS",
    "shard_positions",
    "layout_unit",
    "ring_source",
    "check_permutation",
    "visible",
    "kernel_mask",
    "Block",
    "block_plan",
    "plan_pairs",
    "plan_mask",
    "causal_work",
    "ring_time",
    "efficiency",
]

#: the layouts every function here accepts
LAYOUTS = ("contiguous", "zigzag", "striped")
_ALIASES = {"zig-zag": "zigzag", "zig_zag": "zigzag", "stripe": "striped"}


def layout_name(layout) -> str:
    """The canonical name of ``layout`` (``"zig-zag"`` -> ``"zigzag"``); ValueError if unknown."""
    if isinstance(layout, str):
        name = _ALIASES.get(layout.lower(), layout.lower())
        if name in LAYOUTS:
            return name
    raise ValueError(f"unknown layout {layout!r}; use one of {', '.join(map(repr, LAYOUTS))}")


def layout_unit(n: int, layout: str) -> int:
    """The smallest sequence length ``layout`` splits over ``n`` ranks (every valid ``s`` is a
    multiple of it): ``2n`` for ``"zigzag"`` (two chunks a rank), ``n`` otherwise."""
    return 2 * n if layout_name(layout) == "zigzag" else n


def _check_divisible(s: int, n: int, layout: str) -> None:
    unit = layout_unit(n, layout)
    if s % unit:
        what = f"2*n = {unit} chunks" if layout == "zigzag" else f"n = {n} ranks"
        lo, hi = (s // unit) * unit, (s // unit + 1) * unit
        options = f"{lo} or {hi}" if lo > 0 else f"{hi}"
        raise ValueError(
            f"the {layout} layout splits the sequence into {what}, so s must be a multiple "
            f"of {unit} (each rank's chunks even); got s = {s}. Pad the sequence to {options} tokens, or change n.")


def shard_positions(s: int, n: int, layout: str = "contiguous") -> list[np.ndarray]:
    """Global token ids held by each of ``n`` ranks, as a list of ``n`` sorted int arrays.

    Every rank gets ``s/n`` tokens and every token ``0..s-1`` appears on exactly one
    rank. ``s`` must be a multiple of ``n`` (of ``2n`` for ``"zigzag"``).
    """
    s = count("s (sequence length)", s)
    n = count("n (number of ranks)", n)
    layout = layout_name(layout)
    _check_divisible(s, n, layout)
    if layout == "contiguous":
        c = s // n
        return [np.arange(r * c, (r + 1) * c) for r in range(n)]
    if layout == "zigzag":
        half = s // (2 * n)                    # one chunk = c/2 tokens
        return [np.concatenate([np.arange(r * half, (r + 1) * half),
                                np.arange((2 * n - 1 - r) * half, (2 * n - r) * half)])
                for r in range(n)]
    return [np.arange(r, s, n) for r in range(n)]   # striped


def check_permutation(pos: np.ndarray, where: str) -> None:
    """The concatenated positions of all ranks must be the token ids 0..s-1, each once."""
    s = pos.size
    if pos.ndim != 1 or not np.issubdtype(pos.dtype, np.integer) or (
            s and (pos.min() < 0 or pos.max() >= s or np.bincount(pos, minlength=s).max() > 1)):
        raise ValueError(f"{where}: the positions of all ranks together must hold every token id "
                         f"0..{s - 1} exactly once (use layouts.shard_positions)")


def ring_source(r: int, k: int, n: int) -> int:
    """Rank whose K/V block rank ``r`` holds in ring round ``k``: ``(r - k) mod n``."""
    n = count("n (number of ranks)", n)
    return (r - k) % n


def visible(q_pos, k_pos, causal: bool = False, doc_ids=None) -> np.ndarray:
    """Bool ``(s_q, s_k)``: which keys each query sees. ``k_pos[j] <= q_pos[i]`` when causal,
    and ``doc_ids[k_pos[j]] == doc_ids[q_pos[i]]`` with a document mask (positions are global
    token ids, ``doc_ids`` has one entry per global position)."""
    return kernel_mask(q_pos, k_pos, causal, doc_ids)


def kernel_mask(q_pos, k_pos, causal: bool = False, doc_ids=None) -> np.ndarray:
    """The same mask as :func:`visible`, under the name the simulated attention kernels call:
    notebook 03's grader withholds ``visible`` (counting its pairs is that notebook's
    exercise) and keeps the kernels working."""
    q_pos, k_pos = np.asarray(q_pos), np.asarray(k_pos)
    mask = np.ones((q_pos.size, k_pos.size), dtype=bool)
    if causal:
        mask &= k_pos[None, :] <= q_pos[:, None]
    if doc_ids is not None:
        doc_ids = np.asarray(doc_ids)
        for name, pos in (("q_pos", q_pos), ("k_pos", k_pos)):
            if pos.size and (pos.min() < 0 or pos.max() >= doc_ids.size):
                raise ValueError(f"{name} holds token ids outside 0..{doc_ids.size - 1}, the "
                                 f"positions that doc_ids describes")
        mask &= doc_ids[k_pos][None, :] == doc_ids[q_pos][:, None]
    return mask


class Block(NamedTuple):
    """One kernel call of a plan: local query rows ``q``, local key rows ``k``, and ``mask``:

    * ``"none"``: every query of the block sees every key;
    * ``"causal"``: the block is square and query ``i`` sees local keys ``0..i`` (the
      fused kernel's own causal mask);
    * ``"positions"``: the mask comes from the global positions (and ``doc_ids``).

    ``pairs``: the visible (query, key) pairs in the block.
    """
    q: slice
    k: slice
    mask: str
    pairs: int


def _runs(pos: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs of consecutive increasing token ids, as ``(start row, stop row)``."""
    cuts = np.flatnonzero(np.diff(pos) != 1) + 1
    edges = [0, *cuts.tolist(), pos.size]
    return list(zip(edges, edges[1:]))


def _causal_run_blocks(qp, q0, q1, kp, k0, k1) -> list[Block]:
    """Blocks of one run of queries against one run of keys, both consecutive ids."""
    a, m, b, ln = int(qp[q0]), q1 - q0, int(kp[k0]), k1 - k0
    blocks = []
    before = min(b + ln, a) - b                   # keys earlier than every query
    if before > 0:
        blocks.append(Block(slice(q0, q1), slice(k0, k0 + before), "none", m * before))
    lo, hi = max(a, b), min(a + m, b + ln)        # keys among the queries' own ids
    if lo < hi:
        qs, ks = slice(q0 + lo - a, q0 + hi - a), slice(k0 + lo - b, k0 + hi - b)
        blocks.append(Block(qs, ks, "causal", (hi - lo) * (hi - lo + 1) // 2))
        if hi < a + m:                            # later queries see these keys in full
            blocks.append(Block(slice(q0 + hi - a, q1), ks, "none", (a + m - hi) * (hi - lo)))
    return blocks


def _fuse(blocks: list[Block]) -> list[Block]:
    """Join unmasked blocks that share their key rows and touch in query rows, or the
    other way round (fewer, larger kernel calls)."""
    out: list[Block] = []
    for blk in blocks:
        for i, old in enumerate(out):
            if old.mask == blk.mask == "none":
                if old.k == blk.k and old.q.stop == blk.q.start:
                    out[i] = Block(slice(old.q.start, blk.q.stop), old.k, "none", old.pairs + blk.pairs)
                    break
                if old.q == blk.q and old.k.stop == blk.k.start:
                    out[i] = Block(old.q, slice(old.k.start, blk.k.stop), "none", old.pairs + blk.pairs)
                    break
        else:
            out.append(blk)
    return out


def block_plan(q_positions, k_positions, causal: bool = True, doc_ids=None,
               max_runs: int = 4) -> list[Block]:
    """The blocks worth computing for queries at ``q_positions`` against keys at
    ``k_positions`` (global token ids, any order, of the local rows), as :class:`Block` s.

    Fully masked parts are left out (an empty list: nothing visible, skip the block).
    Without a document mask, runs of consecutive ids (contiguous and zig-zag layouts hold
    one or two) become unmasked blocks and causal diagonal blocks, the shapes a fused
    kernel takes; more than ``max_runs`` runs on a side (striped, a random permutation) or
    a document mask give one ``"positions"`` block over everything.
    """
    qp, kp = np.asarray(q_positions).reshape(-1), np.asarray(k_positions).reshape(-1)
    whole = (slice(0, qp.size), slice(0, kp.size))
    if not causal and doc_ids is None:
        return [Block(*whole, "none", qp.size * kp.size)]
    if doc_ids is None and qp.size == kp.size and np.array_equal(qp, kp) and \
            bool(np.all(np.diff(qp) > 0)):
        return [Block(*whole, "causal", qp.size * (qp.size + 1) // 2)]   # own tokens, in order
    q_runs, k_runs = _runs(qp), _runs(kp)
    if doc_ids is not None or len(q_runs) > max_runs or len(k_runs) > max_runs:
        pairs = int(visible(qp, kp, causal, doc_ids).sum())
        return [Block(*whole, "positions", pairs)] if pairs else []
    blocks = [blk for q0, q1 in q_runs for k0, k1 in k_runs
              for blk in _causal_run_blocks(qp, q0, q1, kp, k0, k1)]
    return _fuse(blocks)


def plan_pairs(plan) -> int:
    """Visible (query, key) pairs of a :func:`block_plan`: the work it stands for."""
    return int(sum(blk.pairs for blk in plan))


def plan_mask(plan, q_positions, k_positions, causal: bool = True, doc_ids=None) -> np.ndarray:
    """Bool ``(len(q), len(k))``: the pairs a :func:`block_plan` computes and keeps (its
    unmasked blocks, the lower triangles of its causal ones, the visible pairs of the rest)."""
    qp, kp = np.asarray(q_positions).reshape(-1), np.asarray(k_positions).reshape(-1)
    mask = np.zeros((qp.size, kp.size), dtype=bool)
    for blk in plan:
        rows, cols = qp[blk.q], kp[blk.k]
        if blk.mask == "none":
            mask[blk.q, blk.k] = True
        elif blk.mask == "causal":
            mask[blk.q, blk.k] = np.tril(np.ones((rows.size, cols.size), dtype=bool))
        else:
            mask[blk.q, blk.k] = visible(rows, cols, causal, doc_ids)
    return mask


def _token_work(s: int, n: int, layout: str) -> np.ndarray:
    """Visible (query, key) pairs, key <= query, per (round, rank); int64 (n, n)."""
    pos = shard_positions(s, n, layout)
    work = np.zeros((n, n), dtype=np.int64)
    for k in range(n):
        for r in range(n):
            work[k, r] = plan_pairs(block_plan(pos[r], pos[ring_source(r, k, n)], True))
    return work


def causal_work(n: int, layout: str = "contiguous", s: int | None = None) -> np.ndarray:
    """Causal attention work per ring round and rank, an array of shape ``(n, n)``.

    ``work[k, r]`` is the work of rank ``r`` in round ``k``, when it holds the K/V of
    rank ``(r - k) mod n``.

    * With ``s`` given: the number of visible (query, key) pairs (``key <= query``),
      as int64. Summed over everything it is ``s(s+1)/2``.
    * With ``s=None``: the long-block limit, in units of one full ``c x c`` block
      (``c = s/n``): a fully visible block counts 1, a diagonal block 1/2 (float64).
      It is the limit of ``pairs / c**2`` as ``s`` grows, computed exactly: the
      pair count is a quadratic in the chunk length ``m``, and its leading
      coefficient is its second difference over ``m = 1, 2, 3`` halved.
    """
    n = count("n (number of ranks)", n)
    layout = layout_name(layout)
    if s is not None:
        return _token_work(s, n, layout)
    unit = layout_unit(n, layout)                      # smallest valid s
    w1, w2, w3 = (_token_work(unit * m, n, layout) for m in (1, 2, 3))
    lead = (w3 - 2 * w2 + w1)                          # = 2 * (coefficient of m**2)
    c_per_m = Fraction(unit, n)                        # c = (unit/n) * m
    scale = 2 * c_per_m * c_per_m                      # pairs/c**2 -> lead / (2 (unit/n)**2)
    return np.array([[float(Fraction(int(x)) / scale) for x in row] for row in lead])


def ring_time(work) -> float:
    """Time of the ring: the sum over rounds of the busiest rank, ``sum_k max_r work[k, r]``.

    ``work`` has shape ``(rounds, ranks)`` as returned by :func:`causal_work`. Returns
    an int for integer work, a float otherwise.
    """
    try:
        work = np.asarray(work)
    except ValueError:                          # ragged nested lists
        raise ValueError("work must be a 2-D array (rounds, ranks); got rows of different "
                         "lengths") from None
    if work.ndim != 2 or work.size == 0:
        raise ValueError(f"work must be a non-empty 2-D array (rounds, ranks), got shape {work.shape}")
    if work.dtype.kind not in "iuf" or np.any(~np.isfinite(work)) or np.any(work < 0):
        raise ValueError("work must hold finite, non-negative real numbers")
    t = work.max(axis=1).sum()
    return int(t) if np.issubdtype(work.dtype, np.integer) else float(t)


def efficiency(work) -> float:
    """Fraction of the ring time the ranks are busy on average: ``total / (ranks * ring_time)``.

    1.0 means no rank ever waits; contiguous causal blocks tend to about 1/2.
    """
    work = np.asarray(work)
    t = ring_time(work)
    return float(work.sum() / (work.shape[1] * t)) if t > 0 else 1.0
