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
"""
from __future__ import annotations

import numbers
from fractions import Fraction

import numpy as np

__all__ = [
    "LAYOUTS",
    "shard_positions",
    "ring_source",
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


def _check_int(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_divisible(s: int, n: int, layout: str) -> None:
    unit = 2 * n if layout == "zigzag" else n
    if s % unit:
        what = f"2*n = {unit} chunks" if layout == "zigzag" else f"n = {n} ranks"
        lo, hi = (s // unit) * unit, (s // unit + 1) * unit
        options = f"{lo} or {hi}" if lo > 0 else f"{hi}"
        raise ValueError(
            f"the {layout} layout splits the sequence into {what}, so s must be a multiple "
            f"of {unit}; got s = {s}. Pad the sequence to {options} tokens, or change n.")


def shard_positions(s: int, n: int, layout: str = "contiguous") -> list[np.ndarray]:
    """Global token ids held by each of ``n`` ranks, as a list of ``n`` sorted int arrays.

    Every rank gets ``s/n`` tokens and every token ``0..s-1`` appears on exactly one
    rank. ``s`` must be a multiple of ``n`` (of ``2n`` for ``"zigzag"``).
    """
    s = _check_int("s (sequence length)", s)
    n = _check_int("n (number of ranks)", n)
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


def ring_source(r: int, k: int, n: int) -> int:
    """Rank whose K/V block rank ``r`` holds in ring round ``k``: ``(r - k) mod n``."""
    n = _check_int("n (number of ranks)", n)
    return (r - k) % n


def _token_work(s: int, n: int, layout: str) -> np.ndarray:
    """Visible (query, key) pairs, key <= query, per (round, rank); int64 (n, n)."""
    pos = shard_positions(s, n, layout)
    work = np.zeros((n, n), dtype=np.int64)
    for k in range(n):
        for r in range(n):
            q, kv = pos[r], pos[ring_source(r, k, n)]   # kv is sorted
            # for each query: number of keys <= query
            work[k, r] = np.searchsorted(kv, q, side="right").sum()
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
    n = _check_int("n (number of ranks)", n)
    layout = layout_name(layout)
    if s is not None:
        return _token_work(s, n, layout)
    unit = 2 * n if layout == "zigzag" else n          # smallest valid s
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
