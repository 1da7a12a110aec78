"""Drawing the top-``k`` experts of many tokens without their score matrix (for
:func:`lesson10.sim.moe.simulate_moe`): ``T`` Plackett-Luce draws, which have the law of
the top-``k`` of ``log-weights + Gumbel noise``, by alias-table rejection and an exact
inverse-CDF fallback. Vectorised over tokens.
"""
from __future__ import annotations

import numpy as np

__all__ = ["sample_topk"]


def _draw_excluding(cdf: np.ndarray, p: np.ndarray, prev: np.ndarray, u: np.ndarray) -> np.ndarray:
    """One exact draw per row from the weights ``p`` with the experts ``prev[row]`` removed.

    Inverse-CDF sampling on the per-row CDF ``F(i) = cdf[i] - sum_{c in prev, c <= i} p[c]``
    by a vectorised binary search over the ``E`` experts (``log2 E`` steps). Rows whose
    remaining weight is below ``1e-9`` of the total return ``prev[:, 0]`` (a repeat)."""
    E = cdf.size
    pc = p[prev]                                               # (m, j) removed weights

    def F(i):
        return cdf[i] - (pc * (prev <= i[:, None])).sum(axis=1)

    remaining = F(np.full(u.size, E - 1))
    target = u * remaining
    lo, hi = np.zeros(u.size, dtype=np.int64), np.full(u.size, E - 1, dtype=np.int64)
    while np.any(lo < hi):
        mid = (lo + hi) // 2
        right = F(mid) <= target
        lo = np.where(right, mid + 1, lo)
        hi = np.where(right, hi, mid)
    # where the remaining weight is lost in rounding, answer "repeat" (an expert already
    # chosen) so that the caller falls back to the Gumbel top-k on the log-weights
    lost = remaining <= 1e-9 * cdf[-1]
    return np.where(lost, prev[:, 0], lo)


def _alias_table(p: np.ndarray):
    """Walker's alias table for O(1) draws from the weights ``p`` (``E`` entries).

    A draw is: pick a column ``i`` uniformly, keep ``i`` with probability ``prob[i]``,
    else take ``alias[i]``. Built in ``O(E)``."""
    E = p.size
    scaled = p * (E / p.sum())
    prob, alias = np.ones(E), np.arange(E)
    small = [i for i in range(E) if scaled[i] < 1.0]
    large = [i for i in range(E) if scaled[i] >= 1.0]
    while small and large:
        lo, hi = small.pop(), large.pop()
        prob[lo], alias[lo] = scaled[lo], hi
        scaled[hi] -= 1.0 - scaled[lo]
        (small if scaled[hi] < 1.0 else large).append(hi)
    return prob, alias                                   # leftovers keep prob 1 (rounding)


def _alias_draw(table, size: int, rng) -> np.ndarray:
    prob, alias = table
    E = prob.size
    u = rng.random(size) * E
    col = np.minimum(u.astype(np.int64), E - 1)
    return np.where(u - col < prob[col], col, alias[col])


def sample_topk(logw: np.ndarray, T: int, k: int, rng, max_rounds: int = 3) -> np.ndarray:
    """``T`` draws of ``k`` distinct experts from Plackett-Luce with log-weights ``logw``:
    the same law as the top-``k`` of ``logw + Gumbel noise`` per token, without building
    the ``(T, E)`` score matrix. Slot by slot, every token draws from the weights of the
    experts it has not chosen yet: first by cheap rejection (redraw on a repeat), then,
    for the tokens still repeating, by an exact inverse-CDF draw that excludes their
    chosen experts. (Tokens whose remaining weights all underflow to 0 finish with the
    Gumbel top-k itself.) No Python loop over tokens."""
    E = logw.size
    dtype = np.int16 if np.iinfo(np.int16).max >= E else np.int32
    with np.errstate(over="ignore"):                   # a gap beyond 1e308 is weight 0
        p = np.exp(logw - logw.max())
    cdf = np.cumsum(p)
    table = _alias_table(p)
    choices = np.empty((T, k), dtype=dtype)
    done = np.zeros(T, dtype=bool)                  # finished by the Gumbel fallback
    for j in range(k):
        pending = np.arange(T) if not done.any() else np.nonzero(~done)[0]
        for attempt in range(max_rounds + 3):
            if j == 0:
                choices[pending, 0] = _alias_draw(table, pending.size, rng)
                pending = pending[:0]
                break
            prev = choices[:, :j] if pending.size == T else choices[pending, :j]
            if attempt < max_rounds:                               # rejection: draw from all
                draw = _alias_draw(table, pending.size, rng).astype(dtype)
            else:                                                  # exact: exclude the chosen
                u = rng.random(pending.size)
                draw = _draw_excluding(cdf, p, prev.astype(np.int64), u).astype(dtype)
            ok = ~(prev == draw[:, None]).any(axis=1)
            choices[pending[ok], j] = draw[ok]
            pending = pending[~ok]
            if pending.size == 0:
                break
        for start in range(0, pending.size, 1 << 15):             # last resort, chunked
            rows = pending[start:start + (1 << 15)]
            scores = logw[None, :] + rng.gumbel(size=(rows.size, E))
            np.put_along_axis(scores, choices[rows, :j].astype(np.int64), -np.inf, axis=1)
            choices[rows, j:] = np.argsort(-scores, axis=1, kind="stable")[:, :k - j]
            done[rows] = True
    return choices
