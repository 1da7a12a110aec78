"""How the two grid figures are built and redrawn: the ring's score matrix and per-rank work
(:func:`ring`), and the Ulysses (token x head) grid (:func:`ulysses`). Each builds its axes
once (a *skeleton*), moves them to another structure in place when a control changes the
number of ranks, tokens or heads (set_data, new ticks on the existing ones, bars shown or
hidden), and otherwise only updates the artists a control changes
(:class:`lesson10.figures.kit.Parts`); :mod:`lesson10.figures` holds the public functions.
"""
from __future__ import annotations

import textwrap

import numpy as np
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from .. import layouts
from . import kit
from .data import owners, ring_states, ulysses_owner

__all__ = ["ring", "ulysses"]

RING_SIZE, ULYSSES_SIZE = (9, 4.8), (8.5, 5)


# ----------------------------------------------------------------------------- ring rounds
def ring(fig, *, n: int, s: int, layout: str, round: int, causal: bool):
    """Draw (or update) the ring figure in ``fig`` for ``round``; returns the figure. Another
    ``(n, s, layout, causal)`` moves the axes of a ring figure to it (:func:`_ring_restructure`)."""
    if not 0 <= round < n:
        raise ValueError(f"round must be in 0..{n - 1} for n = {n} ranks, got {round}")
    owner = owners(s, n, layout)                     # validates s against the layout
    fig, parts = kit.structured(fig, "ring_rounds", (n, s, layout, causal), RING_SIZE, _ring_skeleton,
                                lambda parts: _ring_restructure(parts, n, s, layout, causal, owner))
    _ring_update(parts, round)
    return kit.finish(fig)


def _ring_skeleton(fig):
    """The axes and artists every ring figure has, whatever its structure."""
    ax, bx = fig.subplots(1, 2, width_ratios=[1.15, 1])
    palette = [kit.COLORS[c] for c in ("masked", "empty", "earlier", "computed")]
    image = ax.imshow(np.zeros((1, 1)), cmap=ListedColormap(palette), vmin=0, vmax=3,
                      interpolation="nearest")
    bands = ax.add_collection(LineCollection([], colors=kit.COLORS["edge"], linewidths=1))
    ax.set_xlabel("key token")
    ax.set_ylabel("query token (by owning rank)", fontsize=8)
    kit.legend(ax, [("computed", "computed this round"), ("earlier", "computed in an earlier round"),
                    ("empty", "later round (K/V not here yet)"), ("masked", "masked (key > query)")],
               loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, fontsize=7)
    bx.set_ylabel("visible (query, key) pairs")
    legend = bx.legend(handles=[Patch(color=kit.COLORS["computed"], label="work this round"),
                                Patch(color=kit.COLORS["idle"], label="idle (waits)")],
                       loc="upper left", fontsize=8)
    titles = (ax.set_title(" ", fontsize=9, y=1.0, pad=4), bx.set_title(" ", fontsize=9, y=1.0, pad=4))
    parts = kit.Parts("ring_rounds", None, axes=[ax, bx], ax=ax, bx=bx, image=image, bands=bands,
                      done=[], idle=[], titles=titles, per_key={})
    parts.dynamic.update(image=image, bands=bands, bars=[], titles=list(titles),
                         legend=kit.fixed(legend))
    return kit.keep(fig, parts)


def _ring_restructure(parts, n, s, layout, causal, owner):
    """Move the ring figure to ``n`` ranks, ``s`` tokens and ``layout``: the matrix's size, its
    rank bands and ticks, the bars shown and their scale. What a structure needs is kept
    (``per_key``), so coming back to it costs no recomputation."""
    key = (n, s, layout, causal)
    if key not in parts.per_key:
        order = np.argsort(owner, kind="stable")     # rows by rank: each rank owns a band
        work = layouts.causal_work(n, layout, s=s) if causal else np.full((n, n), (s // n) ** 2)
        parts.per_key[key] = dict(order=order, work=work, states={})
        while len(parts.per_key) > kit.Parts.KEEP:
            parts.per_key.pop(next(iter(parts.per_key)))
    cached = parts.per_key[key]
    ax, bx, order, work = parts.ax, parts.bx, cached["order"], cached["work"]
    parts.image.set_data(np.zeros((s, s)))
    parts.image.set_extent((-0.5, s - 0.5, s - 0.5, -0.5))
    ax.set_xlim(-0.5, s - 0.5)
    ax.set_ylim(s - 0.5, -0.5)
    parts.bands.set_segments([[(-0.5, r * s / n - 0.5), (s - 0.5, r * s / n - 0.5)] for r in range(1, n)])
    if s <= 16:                  # few tokens: name every query row and key column
        kit.ticks(ax.xaxis, range(s), range(s), fontsize=10)
        kit.ticks(ax.yaxis, range(s), [f"r{owner[i]}: q{i}" for i in order], fontsize=7)
    else:                        # many: one label per rank band, key ticks at band edges
        step = s // n
        kit.ticks(ax.xaxis, range(0, s, step), range(0, s, step), fontsize=7)
        kit.ticks(ax.yaxis, [r * step + (step - 1) / 2 for r in range(n)], [f"rank {r}" for r in range(n)], fontsize=7)
    if len(parts.done) < n:      # bars for the most ranks seen so far (two containers), shown or hidden
        for container in list(bx.containers):
            container.remove()
        parts.done = list(bx.bar(range(n), np.zeros(n), color=kit.COLORS["computed"]))
        parts.idle = list(bx.bar(range(n), np.zeros(n), color=kit.COLORS["idle"]))
    for r, (done, idle) in enumerate(zip(parts.done, parts.idle)):
        done.set_visible(r < n)
        idle.set_visible(r < n)
    parts.dynamic["bars"] = parts.done[:n] + parts.idle[:n]
    kit.ticks(bx.xaxis, range(n), [str(r) if n > 4 else f"rank {r}" for r in range(n)])
    margin = 0.05 * (n - 0.2)                        # what autoscaling gives n bars of width 0.8
    bx.set_xlim(-0.4 - margin, n - 0.6 + margin)
    bx.set_xlabel("rank" if n > 4 else "")
    bx.set_ylim(0, max(work.max(), 1) * 1.15)
    parts.order, parts.work, parts.states = order, work, cached["states"]
    parts.n, parts.s, parts.layout, parts.causal = n, s, layout, causal
    parts.restructured(key)


def _ring_update(parts, round):
    if round not in parts.states:
        parts.states[round] = ring_states(parts.s, parts.n, parts.layout, parts.causal, round)[parts.order]
    parts.image.set_data(parts.states[round])
    work, n = parts.work, parts.n
    this = work[round]
    for done, idle, w in zip(parts.done, parts.idle, this):
        done.set_height(w)
        idle.set_y(w)
        idle.set_height(this.max() - w)
    parts.titles[0].set_text(f"{parts.layout}, round {round}: rank r holds K/V of rank (r-{round}) mod {n}")
    parts.titles[1].set_text(f"ring time so far {layouts.ring_time(work[: round + 1])} "
                             f"(total {layouts.ring_time(work)}, ideal {work.sum() / n:g})")


# ----------------------------------------------------------------------------- Ulysses grid
def ulysses(fig, *, n: int, s: int, heads: int, kv_heads: int, state: str, rank: int, arrived):
    """Draw (or update) the Ulysses grid in ``fig``; returns the figure. Another structure
    moves the axes of a Ulysses figure to it (:func:`_ulysses_restructure`)."""
    if n < 1 or kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"heads = {heads} must be a multiple of kv_heads = {kv_heads}")
    if not 0 <= rank < n:
        raise ValueError(f"rank must be in 0..{n - 1}, got {rank}")
    owner = ulysses_owner(n, s, heads, state)        # validates s, heads and state
    fig, parts = kit.structured(fig, "ulysses_grid", (n, s, heads, kv_heads), ULYSSES_SIZE, _ulysses_skeleton,
                                lambda parts: _ulysses_restructure(parts, n, s, heads, kv_heads))
    _ulysses_update(parts, owner, state, rank, state == "heads" if arrived is None else arrived)
    fig.ulysses_warning = parts.warning
    return kit.finish(fig)


def _squares(cells, inset: float = 0.0) -> np.ndarray:
    """(len(cells), 4, 2) corners of the unit squares at (row i, column j), ``inset`` inside."""
    i, j = (np.asarray(c, dtype=float).reshape(-1) for c in cells)
    lo, hi = inset, 1 - inset
    xs = np.stack([j + lo, j + hi, j + hi, j + lo], axis=1)
    ys = np.stack([i + lo, i + lo, i + hi, i + hi], axis=1)
    return np.stack([xs, ys], axis=2)


def _ulysses_skeleton(fig):
    """The axes and artists every Ulysses figure has, whatever its structure."""
    ax, kx = fig.subplots(2, 1, height_ratios=[8, 1.6])
    # one collection per layer (cells, aqua borders, labels): one artist each, not s * heads
    cells = ax.add_collection(PolyCollection([], facecolors=kit.COLORS["empty"], edgecolors=kit.COLORS["edge"],
                                             linewidths=0.5))
    borders = ax.add_collection(PolyCollection([], facecolors="none", edgecolors=kit.COLORS["comm"],
                                               linewidths=2))
    labels = ax.add_artist(kit.Labels(fontsize=8))
    ax.set_aspect("equal")
    ax.set_xlabel("head")
    ax.set_ylabel("token")
    kv_cells = kx.add_collection(PolyCollection([], edgecolors=kit.COLORS["edge"], linewidths=0.5))
    kv_labels = kx.add_artist(kit.Labels(fontsize=8))
    kx.set_ylim(1, 0)
    kx.set_yticks([])
    kx.set_xlabel("K/V head (label: ranks that need it)")
    kit.legend(kx, [("earlier", "K/V head needed by one rank"),
                    ("replicated", "needed by several ranks: copied to each")],
               loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=7)
    parts = kit.Parts("ulysses_grid", None, axes=[ax], ax=ax, kx=kx, cells=cells, borders=borders,
                      labels=labels, kv_cells=kv_cells, kv_labels=kv_labels, warning="",
                      title=ax.set_title(" ", fontsize=9, y=1.0, pad=4),
                      kv_title=kx.set_title("", fontsize=8, color=kit.COLORS["split"], y=1.0, pad=4))
    parts.dynamic.update(cells=cells, borders=borders, labels=labels, title=parts.title, legend=None)
    return kit.keep(fig, parts)


def _ulysses_restructure(parts, n, s, heads, kv_heads):
    """Move the Ulysses figure to ``n`` ranks, an ``s x heads`` grid and ``kv_heads`` K/V heads."""
    fig, ax, kx = parts.ax.figure, parts.ax, parts.kx
    grid = ax.get_subplotspec().get_gridspec()
    grid.set_height_ratios([s, 1.6])
    for a in (ax, kx):
        a.set_position(a.get_subplotspec().get_position(fig))
    rows, cols = np.divmod(np.arange(s * heads), heads)      # cells row by row
    parts.cells.set_verts(_squares((rows, cols)))
    # the cells that change hands in an all-to-all are the same both ways
    moved = ulysses_owner(n, s, heads, "sequence") != ulysses_owner(n, s, heads, "heads")
    parts.borders.set_verts(_squares(np.nonzero(moved), inset=0.06))
    parts.labels.set_labels(xy=np.stack([cols + 0.5, rows + 0.5], axis=1))
    ax.set_xlim(0, heads)
    ax.set_ylim(s, 0)
    kit.ticks(ax.xaxis, np.arange(heads) + 0.5, range(heads))
    kit.ticks(ax.yaxis, np.arange(s) + 0.5, range(s))
    parts.warning = _kv_strip(parts, n, heads, kv_heads)
    parts.n, parts.s, parts.heads = n, s, heads
    parts.restructured((n, s, heads, kv_heads))


def _kv_strip(parts, n, heads, kv_heads) -> str:
    """The K/V heads strip: which ranks need each K/V head in head sharding; the warning."""
    kx = parts.kx
    g = heads // kv_heads               # query head j uses K/V head j // g
    needed_by = [sorted({j // (heads // n) for j in range(heads) if j // g == kv}) for kv in range(kv_heads)]
    parts.kv_cells.set_verts(_squares((np.zeros(kv_heads), np.arange(kv_heads))))
    parts.kv_cells.set_facecolor([kit.COLORS["replicated"] if len(r) > 1 else kit.COLORS["earlier"]
                                  for r in needed_by])
    parts.kv_labels.set_labels(xy=[(kv + 0.5, 0.5) for kv in range(kv_heads)],
                               texts=[",".join(map(str, r)) for r in needed_by], colors=["black"] * kv_heads)
    kx.set_xlim(0, max(kv_heads, 1))
    kit.ticks(kx.xaxis, np.arange(kv_heads) + 0.5, range(kv_heads))
    warning = "" if kv_heads >= n else (
        f"warning: {n} ranks but only {kv_heads} K/V heads. Each rank needs whole K/V heads, "
        f"so Ulysses alone scales to {kv_heads} rank{'s' if kv_heads > 1 else ''}; "
        f"copy K/V heads (more bytes) or combine with ring attention")
    parts.kv_title.set_text(textwrap.fill(warning, 90))
    return warning


def _ulysses_update(parts, owner, state, rank, arrived):
    mine = (owner == rank).ravel()                  # cells row by row, as in the collection
    parts.cells.set_facecolor([kit.COLORS["split"] if m else kit.COLORS["empty"] for m in mine])
    parts.labels.set_labels(texts=[str(o) for o in owner.ravel()],
                            colors=["white" if m else "black" for m in mine])
    parts.borders.set_visible(bool(arrived))
    n = parts.n
    kept = parts.s * parts.heads // n // n
    parts.title.set_text(f"{'sequence sharding' if state == 'sequence' else 'head sharding (after all-to-all)'}: "
                         f"each rank keeps {kept} cells, sends {(n - 1) * kept}")
    parts.dynamic["legend"] = kit.legend(
        parts.ax, [("split", f"held by rank {rank}"), ("empty", "held by another rank")]
        + ([("comm", "arrived in the last all-to-all (aqua border)")] if arrived else []),
        loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=7)
