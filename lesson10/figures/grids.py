"""How the two grid figures are built and redrawn: the ring's score matrix and per-rank work
(:func:`ring`), and the Ulysses (token x head) grid (:func:`ulysses`). Each builds its
figure once per structure and then only updates the artists a control changes
(:class:`lesson10.figures.kit.Parts`); :mod:`lesson10.figures` holds the public functions.
"""
from __future__ import annotations

import textwrap

import numpy as np
from matplotlib.collections import PatchCollection
from matplotlib.colors import ListedColormap
from matplotlib.patches import Rectangle

from .. import layouts
from . import kit
from .data import owners, ring_states, ulysses_owner

__all__ = ["ring", "ulysses"]

RING_SIZE, ULYSSES_SIZE = (9, 4.8), (8.5, 5)


# ----------------------------------------------------------------------------- ring rounds
def ring(fig, *, n: int, s: int, layout: str, round: int, causal: bool):
    """Draw (or update) the ring figure in ``fig`` for ``round``; returns the figure."""
    if not 0 <= round < n:
        raise ValueError(f"round must be in 0..{n - 1} for n = {n} ranks, got {round}")
    owner = owners(s, n, layout)                     # validates s against the layout
    parts = kit.reuse(fig, "ring_rounds", (n, s, layout, causal))
    if parts is None:
        fig = kit.new_figure(fig, RING_SIZE, "ring_rounds")
        parts = _ring_build(fig, n, s, layout, causal, owner)
    _ring_update(parts, round)
    return fig


def _ring_build(fig, n, s, layout, causal, owner):
    ax, bx = fig.subplots(1, 2, width_ratios=[1.15, 1])
    order = np.argsort(owner, kind="stable")         # rows by rank: each rank owns a band
    palette = [kit.COLORS[c] for c in ("masked", "empty", "earlier", "computed")]
    image = ax.imshow(np.zeros((s, s)), cmap=ListedColormap(palette), vmin=0, vmax=3,
                      interpolation="nearest")
    bands = [ax.axhline(r * s / n - 0.5, color=kit.COLORS["edge"], lw=1) for r in range(1, n)]
    if s <= 16:                  # few tokens: name every query row and key column
        ax.set_xticks(range(s))
        ax.set_yticks(range(s), [f"r{owner[i]}: q{i}" for i in order], fontsize=7)
    else:                        # many: one label per rank band, key ticks at band edges
        step = s // n
        ax.set_xticks(range(0, s, step), [str(x) for x in range(0, s, step)], fontsize=7)
        ax.set_yticks([r * step + (step - 1) / 2 for r in range(n)], [f"rank {r}" for r in range(n)], fontsize=7)
    ax.set_xlabel("key token")
    ax.set_ylabel("query token (by owning rank)", fontsize=8)
    kit.legend(ax, [("computed", "computed this round"), ("earlier", "computed in an earlier round"),
                    ("empty", "later round (K/V not here yet)"), ("masked", "masked (key > query)")],
               loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, fontsize=7)
    work = layouts.causal_work(n, layout, s=s) if causal else np.full((n, n), (s // n) ** 2)
    done = bx.bar(range(n), np.zeros(n), color=kit.COLORS["computed"], label="work this round")
    idle = bx.bar(range(n), np.zeros(n), color=kit.COLORS["idle"], label="idle (waits)")
    bx.set_xticks(range(n), [str(r) if n > 4 else f"rank {r}" for r in range(n)])
    bx.set_xlabel("rank" if n > 4 else "")
    bx.set_ylabel("visible (query, key) pairs")
    bx.set_ylim(0, max(work.max(), 1) * 1.15)
    titles = (ax.set_title(" ", fontsize=9, y=1.0, pad=4), bx.set_title(" ", fontsize=9, y=1.0, pad=4))
    parts = kit.Parts("ring_rounds", (n, s, layout, causal), axes=[ax, bx], image=image, order=order,
                      done=list(done), idle=list(idle), work=work, states={}, titles=titles,
                      n=n, s=s, layout=layout, causal=causal)
    parts.dynamic.update(image=image, bands=bands, bars=list(done) + list(idle), titles=list(titles),
                         legend=kit.fixed(bx.legend(loc="upper left", fontsize=8)))
    return kit.keep(fig, parts)


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
    """Draw (or update) the Ulysses grid in ``fig``; returns the figure."""
    if n < 1 or kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"heads = {heads} must be a multiple of kv_heads = {kv_heads}")
    if not 0 <= rank < n:
        raise ValueError(f"rank must be in 0..{n - 1}, got {rank}")
    owner = ulysses_owner(n, s, heads, state)        # validates s, heads and state
    parts = kit.reuse(fig, "ulysses_grid", (n, s, heads, kv_heads))
    if parts is None:
        fig = kit.new_figure(fig, ULYSSES_SIZE, "ulysses_grid")
        parts = _ulysses_build(fig, n, s, heads, kv_heads)
    _ulysses_update(parts, owner, state, rank, state == "heads" if arrived is None else arrived)
    fig.ulysses_warning = parts.warning
    return fig


def _ulysses_build(fig, n, s, heads, kv_heads):
    ax, kx = fig.subplots(2, 1, height_ratios=[s, 1.6])
    # the cells that change hands in an all-to-all are the same both ways
    moved = ulysses_owner(n, s, heads, "sequence") != ulysses_owner(n, s, heads, "heads")
    # one collection per layer (cells, aqua borders): one artist to add and paint, not s * heads
    cells = ax.add_collection(PatchCollection([Rectangle((j, i), 1, 1) for i in range(s) for j in range(heads)],
                                              facecolors=kit.COLORS["empty"], edgecolors=kit.COLORS["edge"],
                                              linewidths=0.5))
    borders = ax.add_collection(PatchCollection(
        [Rectangle((j + 0.06, i + 0.06), 0.88, 0.88) for i, j in zip(*np.nonzero(moved))],
        facecolors="none", edgecolors=kit.COLORS["comm"], linewidths=2))
    texts = {(i, j): ax.text(j + 0.5, i + 0.5, "", ha="center", va="center", fontsize=8)
             for i in range(s) for j in range(heads)}
    ax.set_xlim(0, heads)
    ax.set_ylim(s, 0)
    ax.set_xticks(np.arange(heads) + 0.5, range(heads))
    ax.set_yticks(np.arange(s) + 0.5, range(s))
    ax.set_aspect("equal")
    ax.set_xlabel("head")
    ax.set_ylabel("token")
    warning = _kv_strip(kx, n, heads, kv_heads)
    parts = kit.Parts("ulysses_grid", (n, s, heads, kv_heads), axes=[ax], ax=ax, cells=cells,
                      borders=borders, texts=texts, warning=warning, n=n, s=s, heads=heads,
                      title=ax.set_title(" ", fontsize=9, y=1.0, pad=4))
    parts.dynamic.update(cells=cells, borders=borders, texts=list(texts.values()), title=parts.title, legend=None)
    return kit.keep(fig, parts)


def _kv_strip(kx, n, heads, kv_heads) -> str:
    """The K/V heads strip: which ranks need each K/V head in head sharding; the warning."""
    g = heads // kv_heads               # query head j uses K/V head j // g
    needed_by = [sorted({j // (heads // n) for j in range(heads) if j // g == kv}) for kv in range(kv_heads)]
    for kv, ranks_ in enumerate(needed_by):
        shared = len(ranks_) > 1
        kx.add_patch(Rectangle((kv, 0), 1, 1, fc=kit.COLORS["replicated"] if shared else kit.COLORS["earlier"],
                               ec=kit.COLORS["edge"], lw=0.5))
        kx.text(kv + 0.5, 0.5, ",".join(map(str, ranks_)), ha="center", va="center", fontsize=8)
    kx.set_xlim(0, max(kv_heads, 1))
    kx.set_ylim(1, 0)
    kx.set_yticks([])
    kx.set_xticks(np.arange(kv_heads) + 0.5, range(kv_heads))
    kx.set_xlabel("K/V head (label: ranks that need it)")
    kit.legend(kx, [("earlier", "K/V head needed by one rank"),
                    ("replicated", "needed by several ranks: copied to each")],
               loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=7)
    if kv_heads >= n:
        return ""
    warning = (f"warning: {n} ranks but only {kv_heads} K/V heads. Each rank needs whole K/V heads, "
               f"so Ulysses alone scales to {kv_heads} rank{'s' if kv_heads > 1 else ''}; "
               f"copy K/V heads (more bytes) or combine with ring attention")
    kx.set_title(textwrap.fill(warning, 90), fontsize=8, color=kit.COLORS["split"], y=1.0, pad=4)
    return warning


def _ulysses_update(parts, owner, state, rank, arrived):
    mine = (owner == rank).ravel()                  # cells row by row, as in the collection
    parts.cells.set_facecolor([kit.COLORS["split"] if m else kit.COLORS["empty"] for m in mine])
    for (i, j), text in parts.texts.items():
        text.set_text(str(owner[i, j]))
        text.set_color("white" if owner[i, j] == rank else "black")
    parts.borders.set_visible(bool(arrived))
    n = parts.n
    kept = parts.s * parts.heads // n // n
    parts.title.set_text(f"{'sequence sharding' if state == 'sequence' else 'head sharding (after all-to-all)'}: "
                         f"each rank keeps {kept} cells, sends {(n - 1) * kept}")
    parts.dynamic["legend"] = kit.legend(
        parts.ax, [("split", f"held by rank {rank}"), ("empty", "held by another rank")]
        + ([("comm", "arrived in the last all-to-all (aqua border)")] if arrived else []),
        loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=7)
