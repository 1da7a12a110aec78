"""A simulated process group: every rank is one entry of a Python list.

``SimGroup(n, e)`` runs the collectives of lesson 7 on lists of NumPy arrays
(``xs[r]`` is what rank ``r`` holds) and keeps a byte ledger: ``bytes_sent[r]``
is what rank ``r`` has put on the wire so far, counted at the cost of the ring
algorithms and with ``e`` bytes per element (2 = bf16), whatever the dtype of the
simulated arrays (float64 here, so that results are exact to ~1e-16).

Bytes per rank for a tensor of ``M`` elements (the full, unsharded size):

==================  ====================================
all_reduce          ``2 (n-1)/n * M * e``
reduce_scatter      ``(n-1)/n * M * e``   (M = size of each input)
all_gather          ``(n-1)/n * M * e``   (M = size of the gathered output)
all_to_all          the blocks a rank sends to *other* ranks
ring_shift          the whole entry (one array or a tuple of them) a rank sends to its neighbour
==================  ====================================

The module also has :func:`shard_sequence` / :func:`gather_sequence`, which cut
one sequence ``(s, ...)`` into the per-rank shards of a layout and put it back.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, cast

import numpy as np

from ..layouts import check_permutation, shard_positions

__all__ = ["SimGroup", "CommRecord", "Stats", "shard_sequence", "gather_sequence", "check_shards"]


class Stats:
    """Base of every result record of the simulation (``RingStats``, ``AllGatherStats``,
    ``MoELayerStats``, ``MoEStats``): a dataclass read by attribute; ``as_dict()`` gives
    its fields as a dict (the form of the spmd run reports, which cross processes)."""

    def as_dict(self) -> dict:
        return asdict(cast(Any, self))       # every subclass is a dataclass


@dataclass(frozen=True)
class CommRecord:
    """One collective in the ledger: its name and the bytes each rank sent."""
    op: str
    bytes_sent: np.ndarray


class SimGroup:
    """``n`` simulated ranks with collectives and a per-rank byte ledger.

    Every collective takes a list with one entry per rank and returns a list with
    one (new) array per rank; inputs are never modified. ``bytes_sent`` is a float
    array of shape ``(n,)``; ``history`` lists one :class:`CommRecord` per call.
    """

    def __init__(self, n: int, e: float = 2):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"a SimGroup needs an integer number of ranks n >= 1, got {n!r}")
        if isinstance(e, bool) or not isinstance(e, (int, float, np.integer, np.floating)) \
                or not np.isfinite(e) or e <= 0:
            raise ValueError(f"e (bytes per element) must be a positive number, got {e!r}")
        self.n = int(n)
        self.e = e
        self._parent: tuple[SimGroup, list[int]] | None = None   # (parent group, its ranks)
        self.reset()

    def __repr__(self) -> str:
        return f"SimGroup(n={self.n}, e={self.e}, bytes_sent={self.bytes_sent.tolist()})"

    def reset(self) -> None:
        """Zero the byte ledger and forget the history."""
        self.bytes_sent = np.zeros(self.n)
        self.history: list[CommRecord] = []

    def subgroup(self, ranks) -> SimGroup:
        """A group of some of these ranks (``torch.distributed.new_group``): its rank ``i`` is
        rank ``ranks[i]`` here, and every byte it sends is also booked on that rank here."""
        ranks = [int(r) for r in np.asarray(ranks).reshape(-1)]
        if not ranks or len(set(ranks)) != len(ranks) or min(ranks) < 0 or max(ranks) >= self.n:
            raise ValueError(f"subgroup: ranks must be distinct ids in 0..{self.n - 1}, got {ranks}")
        sub = SimGroup(len(ranks), self.e)
        sub._parent = (self, ranks)
        return sub

    # ------------------------------------------------------------------ helpers
    def _record(self, op: str, sent) -> None:
        sent = np.asarray(sent, dtype=float)
        self.bytes_sent = self.bytes_sent + sent
        self.history.append(CommRecord(op, sent))
        if self._parent is not None:
            parent, ranks = self._parent
            full = np.zeros(parent.n)
            full[ranks] = sent
            parent._record(op, full)

    def _per_rank(self, xs, op: str) -> list[np.ndarray]:
        """Check ``xs`` has one array per rank and all of them have the same shape."""
        return check_shards(xs, op, self.n)

    def _axis(self, axis: int, ndim: int, op: str) -> int:
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
            raise ValueError(f"{op}: axis must be an integer, got {axis!r}")
        if ndim == 0:
            raise ValueError(f"{op}: needs arrays with at least one dimension, got scalars")
        if not -ndim <= axis < ndim:
            raise ValueError(f"{op}: axis {axis} is out of range for arrays with {ndim} dimensions")
        return axis % ndim

    @staticmethod
    def _sum(xs) -> np.ndarray:
        """Sum in rank order 0, 1, ..., n-1 (the same order for every collective, so
        all_reduce and reduce_scatter + all_gather give bit-identical numbers)."""
        acc = np.array(xs[0], dtype=np.result_type(*xs), copy=True)
        for x in xs[1:]:
            acc += x
        return acc

    # ------------------------------------------------------------------ collectives
    def all_reduce(self, xs) -> list[np.ndarray]:
        """Every rank gets ``sum_r xs[r]``. Sends ``2 (n-1)/n * M e`` bytes per rank."""
        xs = self._per_rank(xs, "all_reduce")
        total = self._sum(xs)
        n = self.n
        self._record("all_reduce", np.full(n, 2 * (n - 1) / n * total.size * self.e))
        return [total.copy() for _ in range(n)]

    def reduce_scatter(self, xs, axis: int = 0) -> list[np.ndarray]:
        """Rank ``r`` gets block ``r`` (of ``n`` equal blocks along ``axis``) of ``sum_r xs[r]``.

        Input ``(..., L, ...)`` per rank with ``L % n == 0``; output ``(..., L/n, ...)``.
        Sends ``(n-1)/n * M e`` bytes per rank (``M`` = size of one input).
        """
        xs = self._per_rank(xs, "reduce_scatter")
        axis = self._axis(axis, xs[0].ndim, "reduce_scatter")
        L = xs[0].shape[axis]
        if L % self.n:
            raise ValueError(f"reduce_scatter: axis {axis} has length {L}, which does not split "
                             f"into n = {self.n} equal blocks; pad it to a multiple of {self.n}")
        total = self._sum(xs)
        n = self.n
        self._record("reduce_scatter", np.full(n, (n - 1) / n * total.size * self.e))
        return [b.copy() for b in np.split(total, n, axis=axis)]

    def all_gather(self, xs, axis: int = 0) -> list[np.ndarray]:
        """Every rank gets the concatenation of ``xs[0], ..., xs[n-1]`` along ``axis``.

        Sends ``(n-1)/n * M e`` bytes per rank (``M`` = size of the gathered result),
        i.e. its own block to each of the ``n-1`` others along the ring.
        """
        xs = self._per_rank(xs, "all_gather")
        axis = self._axis(axis, xs[0].ndim, "all_gather")
        full = np.concatenate(xs, axis=axis)
        n = self.n
        self._record("all_gather", np.full(n, (n - 1) / n * full.size * self.e))
        return [full.copy() for _ in range(n)]

    def all_to_all(self, blocks) -> list[list[np.ndarray]]:
        """``blocks[i][j]`` goes from rank ``i`` to rank ``j``; returns ``out`` with
        ``out[j][i] = blocks[i][j]`` (rank ``j`` receives one block from every rank).

        Blocks may have different shapes (an MoE dispatch sends as many tokens as were
        routed). Rank ``i`` sends ``sum_{j != i} blocks[i][j].size * e`` bytes: the block
        it keeps costs nothing.
        """
        n = self.n
        if not isinstance(blocks, (list, tuple)) or len(blocks) != n or any(
                not isinstance(row, (list, tuple)) or len(row) != n for row in blocks):
            raise ValueError(f"all_to_all: pass an n x n nested list (n = {self.n}): blocks[i][j] "
                             "is the array rank i sends to rank j")
        arrs = [[_numeric(b, f"all_to_all: blocks[{i}][{j}]") for j, b in enumerate(row)]
                for i, row in enumerate(blocks)]
        sent = [sum(arrs[i][j].size for j in range(n) if j != i) * self.e for i in range(n)]
        self._record("all_to_all", sent)
        return [[arrs[i][j].copy() for i in range(n)] for j in range(n)]

    def ring_shift(self, xs) -> list:
        """Rank ``r`` sends its entry to rank ``r+1`` (mod n); returns what each rank
        receives: ``out[r] = xs[r-1]`` (a copy).

        An entry is an array, or a tuple (or a list of arrays) of several, such as
        ``(k, v, k_pos)``: they travel together and arrive in a tuple (list) of the same
        length. Every rank's entry must have the same shapes. Sends the elements of all
        arrays of its entry, times ``e`` bytes, per rank.
        """
        if not isinstance(xs, (list, tuple)) or len(xs) == 0:
            raise ValueError("ring_shift: pass a non-empty list with one entry per rank")
        if isinstance(xs[0], tuple) or (isinstance(xs[0], list) and xs[0]
                                        and all(isinstance(x, np.ndarray) for x in xs[0])):
            return self._ring_shift_many(xs)
        xs = self._per_rank(xs, "ring_shift")
        n = self.n
        sent = np.full(n, xs[0].size * self.e if n > 1 else 0)
        self._record("ring_shift", sent)
        return [xs[(r - 1) % n].copy() for r in range(n)]

    def _ring_shift_many(self, xs) -> list:
        """:meth:`ring_shift` of entries that hold several arrays each."""
        n = self.n
        if len(xs) != n:
            raise ValueError(f"ring_shift: got {len(xs)} entries for a group of n = {n} ranks; "
                             "pass exactly one entry per rank")
        box = type(xs[0])
        if any(not isinstance(x, (list, tuple)) or len(x) != len(xs[0]) for x in xs):
            raise ValueError(f"ring_shift: every rank's entry must be a tuple of {len(xs[0])} "
                             f"arrays, like rank 0's")
        parts = [check_shards([x[i] for x in xs], f"ring_shift: item {i} of the entries", n)
                 for i in range(len(xs[0]))]            # parts[i][r]: item i of rank r
        size = sum(p[0].size for p in parts)
        self._record("ring_shift", np.full(n, size * self.e if n > 1 else 0))
        return [box(p[(r - 1) % n].copy() for p in parts) for r in range(n)]


def shard_sequence(x, layout, group):
    """Split one sequence ``x`` of shape ``(s, ...)`` over the ranks of ``group``.

    The argument order of :func:`lesson10.spmd.shard_sequence` (``x, layout, group``);
    ``group`` is a :class:`SimGroup` or its number of ranks ``n``, ``layout`` a layout name.
    Returns ``(shards, positions)``: ``shards[r] = x[positions[r]]`` and
    ``positions = layouts.shard_positions(s, n, layout)`` (the global token ids of
    rank ``r``). Raises ``ValueError`` when ``s`` does not fit the layout (e.g. zig-zag
    needs ``s`` divisible by ``2 n``).
    """
    n = group.n if isinstance(group, SimGroup) else group
    x = np.asarray(x)
    if x.ndim == 0:
        raise ValueError("shard_sequence: x must have a token axis first, shape (s, ...)")
    positions = shard_positions(x.shape[0], n, layout)
    return [x[p] for p in positions], positions


def gather_sequence(shards, positions) -> np.ndarray:
    """Inverse of :func:`shard_sequence`: put the rows of ``shards[r]`` back at the
    global token ids ``positions[r]``; returns the full ``(s, ...)`` array."""
    if not isinstance(shards, (list, tuple)) or not isinstance(positions, (list, tuple)):
        raise ValueError("gather_sequence: pass the list of shards and the list of positions "
                         "that shard_sequence returned")
    if len(shards) != len(positions):
        raise ValueError(f"gather_sequence: {len(shards)} shards but {len(positions)} position arrays")
    pos = np.concatenate([np.asarray(p) for p in positions])
    check_permutation(pos, "gather_sequence")
    for r, (x, p) in enumerate(zip(shards, positions)):
        if np.shape(x)[:1] != (len(p),):
            raise ValueError(f"gather_sequence: rank {r} holds {np.shape(x)[:1]} tokens but "
                             f"{len(p)} positions")
    data = np.concatenate([np.asarray(x) for x in shards])
    out = np.empty_like(data)
    out[pos] = data
    return out


def check_shards(xs, name: str, n: int | None = None) -> list[np.ndarray]:
    """Check that ``xs`` is a list of one array per rank (``n`` of them if given), all of
    the same shape; return them as arrays. Raises a ``ValueError`` naming the ranks."""
    if not isinstance(xs, (list, tuple)) or len(xs) == 0:
        raise ValueError(f"{name}: pass a non-empty list with one array per rank")
    if n is not None and len(xs) != n:
        raise ValueError(f"{name}: got {len(xs)} shards for a group of n = {n} ranks; "
                         "pass exactly one array per rank")
    xs = [_numeric(x, f"{name}: rank {r}") for r, x in enumerate(xs)]
    for r, x in enumerate(xs):
        if x.shape != xs[0].shape:
            raise ValueError(f"{name}: shards of different shapes: rank 0 has {xs[0].shape}, "
                             f"rank {r} has {x.shape}; every rank must hold the same shape")
    return xs


def _numeric(x, where: str) -> np.ndarray:
    """``x`` as an array of real numbers (bool, int or float); anything else is a ValueError."""
    try:
        arr = np.asarray(x)
    except ValueError:                      # ragged nested lists
        arr = None
    if arr is None or arr.dtype.kind not in "biuf":
        what = "ragged nested lists" if arr is None else f"dtype {arr.dtype}"
        raise ValueError(f"{where} must be an array of real numbers, got {what}; pass a float "
                         f"NumPy array")
    return arr
