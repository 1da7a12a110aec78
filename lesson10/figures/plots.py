"""How the three plot figures are built and redrawn: the SP strip (:func:`sp`), the minimum
block size (:func:`block`) and the MoE capacity (:func:`moe`). Each builds its axes once,
moves them to another structure in place (a y range that steps up or down), and otherwise
only updates the artists a control changes (:class:`lesson10.figures.kit.Parts`);
:mod:`lesson10.figures` holds the public functions.
"""
from __future__ import annotations

import functools
import math

import numpy as np
from matplotlib.patches import Rectangle

from .. import cost
from . import kit
from .data import moe_routing

__all__ = ["sp", "block", "moe", "tp_degrees", "nice_ceiling", "block_structure", "moe_structure"]

SP_SIZE, BLOCK_SIZE, MOE_SIZE = (11, 3.0), (7, 4.2), (8, 5.5)

#: one transformer layer in forward order: (label, kind); kind "rep" replicated under TP,
#: "tp" split by TP, "col" / "row" the collective before / after a TP region
STRIP = [
    ("LN1 input", "rep"), ("LN1 output", "rep"), ("g", "col"), ("attention\n(heads)", "tp"), ("g_bar", "row"),
    ("dropout 1\nmask", "rep"), ("LN2 input", "rep"), ("LN2 output", "rep"), ("g", "col"),
    ("MLP\n(columns)", "tp"), ("g_bar", "row"), ("dropout 2\nmask", "rep"),
]


def tp_degrees(s: int = 8192, h: int = 4096, a: int = 32, largest: int = 32) -> list[int]:
    """The TP degrees ``t <= largest`` that split ``s`` tokens, ``h`` hidden and ``a`` heads evenly."""
    return [t for t in range(1, largest + 1) if s % t == 0 and h % t == 0 and a % t == 0]


def nice_ceiling(x: float) -> float:
    """The smallest of 1, 1.5, 2, 3, 4, 5, 6, 8 times a power of ten that is >= ``x`` (> 0)."""
    power = 10.0 ** math.floor(math.log10(x))
    return next(m * power for m in (1, 1.5, 2, 3, 4, 5, 6, 8, 10) if m * power >= x * (1 - 1e-12))


# ----------------------------------------------------------------------------- SP strip
def sp(fig, *, t: int, sp: bool, s: int, h: int, a: int, e: int):
    """Draw (or update) the SP strip in ``fig``; returns the figure."""
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 1:
        raise ValueError(f"t (TP degree) must be an integer >= 1, got {t!r}")
    for name, value in (("s (tokens)", s), ("h (hidden)", h), ("a (heads)", a)):
        if value % t:
            raise ValueError(f"{name} = {value} does not split over t = {t} GPUs; "
                             f"use a TP degree that divides it: {tp_degrees(s, h, a)}")
    key = (s, h, a, e)                                # the boxes do not depend on the sizes
    fig, parts = kit.structured(fig, "sp_strip", key, SP_SIZE, lambda fig: _sp_build(fig, key),
                                lambda parts: parts.restructured(key))
    _sp_update(parts, int(t), bool(sp))
    fig.sp_strip_bytes = parts.sent
    return kit.finish(fig)


def _sp_build(fig, key):
    ax = fig.subplots()
    x, fills, comms = 0.0, [], []
    for label, kind in STRIP:
        if kind in ("col", "row"):
            box = ax.add_patch(Rectangle((x + 0.05, 0.35), 0.5, 0.3, color=kit.COLORS["comm"]))
            comms.append((kind, box, ax.text(x + 0.3, 0.5, "", ha="center", va="center", fontsize=9)))
            x += 0.6
            continue
        ax.add_patch(Rectangle((x, 0), 1, 1, fill=False, ec=kit.COLORS["edge"], lw=1))
        fills.append((kind, x, ax.add_patch(Rectangle((x, 0), 1, 1, color=kit.COLORS["computed"]))))
        ax.text(x + 0.5, -0.12, label, ha="center", va="top", fontsize=8)
        x += 1.2
    ax.set_xlim(-0.1, x)
    ax.set_ylim(-0.55, 1.25)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.text(-0.05, 1.05, "tokens s ↓, hidden h →", fontsize=8, va="bottom")
    parts = kit.Parts("sp_strip", key, ax=ax, fills=fills, comms=comms, sent=0.0,
                      title=ax.set_title(" ", fontsize=9, y=1.0, pad=4))
    parts.dynamic.update(fills=[f[2] for f in fills], comms=[p for c in comms for p in c[1:]],
                         title=parts.title, legend=None)
    return kit.keep(fig, parts)


def _sp_update(parts, t, sp):
    for kind, x, box in parts.fills:
        if kind == "tp":          # split by heads / columns: the left 1/t of the h axis
            box.set_bounds(x, 0, 1 / t, 1)
            box.set_color(kit.COLORS["computed"])
        elif t == 1:              # one GPU holds the whole tensor: nothing is copied
            box.set_bounds(x, 0, 1, 1)
            box.set_color(kit.COLORS["computed"])
        elif sp:                  # split by tokens: the top s/t rows
            box.set_bounds(x, 1 - 1 / t, 1, 1 / t)
            box.set_color(kit.COLORS["split"])
        else:                     # a full copy on every GPU
            box.set_bounds(x, 0, 1, 1)
            box.set_color(kit.COLORS["replicated"])
    for kind, box, text in parts.comms:
        name = ("AG" if kind == "col" else "RS") if sp else ("" if kind == "col" else "AR")
        box.set_visible(bool(name) and t > 1)       # one GPU: no partner, no collective
        text.set_text(name if box.get_visible() else "→")
        text.set_fontsize(9 if box.get_visible() else 10)
        text.set_fontweight("bold" if box.get_visible() else "normal")
    if t == 1:
        entries = [("computed", "the whole tensor (t = 1: one GPU, nothing split, copied or sent)")]
    else:
        entries = [("computed", "GPU 0's share, split by heads / columns (TP)"),
                   ("split" if sp else "replicated",
                    f"GPU 0's share, split by tokens: s/{t} rows (SP)" if sp
                    else f"a full copy, replicated on all {t} GPUs"),
                   ("comm", "collective: " + ("AG all-gather, RS reduce-scatter" if sp else "AR all-reduce"))]
    parts.dynamic["legend"] = kit.legend(parts.ax, entries, loc="lower center", bbox_to_anchor=(0.5, -0.42),
                                         ncol=len(entries), frameon=False)
    s, h, a, e = parts.key
    nbytes = s * h * e
    if sp:
        parts.sent = 2 * cost.reduce_scatter_bytes(nbytes, t) + 2 * cost.all_gather_bytes(nbytes, t)
        recipe = "2 RS + 2 AG"
    else:
        parts.sent = 2 * cost.all_reduce_bytes(nbytes, t)
        recipe = "2 AR"
    if t == 1:
        recipe = "nothing (one GPU)"
    memory = cost.activation_bytes(s, 1, h, a, t=t, sp=sp)
    parts.title.set_text(f"{'TP + SP' if sp else 'TP'}, t = {t}: sent per GPU per layer (forward) = {recipe} = "
                         f"{parts.sent / 1e6:.1f} MB;  activations stored = {memory / 1e6:.0f} MB "
                         f"(s = {s}, h = {h}, FlashAttention)")


# ----------------------------------------------------------------------------- block size
def _block_curves(h, link, g, causal, gpu, e, F):
    """F, W, c*, the block sizes and both times (ms) over them, and the decades they span."""
    F = cost.peak_flops(gpu if F is None else F)              # validates: a finite number > 0
    W = cost.link_bandwidth(link)
    c_star = cost.min_block_size(F, W, causal=causal, g=g, e=e)
    cs = np.geomspace(128, 262_144, 200)
    # compute grows as c^2 and the transfer as c: scale the closed forms at one block size
    tc0, tt0 = cost.ring_round_times(cs[0], h, F, W, causal=causal, g=g, e=e)
    compute, transfer = tc0 * (cs / cs[0]) ** 2 * 1e3, tt0 * (cs / cs[0]) * 1e3
    both = np.concatenate([compute, transfer])
    # one y range for every setting the controls offer (the curves move, the axes stay): wider
    # only for settings beyond the controls
    decades = (min(-5, math.floor(math.log10(both.min()))), max(5, math.ceil(math.log10(both.max()))))
    return F, W, c_star, cs, compute, transfer, decades


def block_structure(h=4096, link="InfiniBand", g=1, causal=False, gpu="H100", e=2, F=None, **_):
    """The structure of the block-size figure: the decades its y axis spans (1e-5 .. 1e5 ms for
    every setting the widget offers)."""
    return _block_curves(h, link, g, causal, gpu, e, F)[-1]


def block(fig, *, h: int, link, g: int, causal: bool, gpu, c, e: int, F):
    """Draw (or update) the block-size figure in ``fig``; returns the figure."""
    F, W, c_star, cs, compute, transfer, decades = _block_curves(h, link, g, causal, gpu, e, F)
    fig, parts = kit.structured(fig, "block_size", decades, BLOCK_SIZE, lambda fig: _block_build(fig, cs, decades),
                                lambda parts: _block_restructure(parts, decades))
    parts.compute.set_ydata(compute)
    parts.transfer.set_ydata(transfer)
    parts.star.set_xdata([c_star, c_star])
    parts.span.set_width(min(c_star, cs[-1]) - cs[0])
    parts.label.set_x(c_star)
    parts.label.set_text(f" c* = {c_star:,.0f}")
    setting = (f"F = {F / 1e12:,.0f} TFLOP/s ({gpu} peak {cost.peak_flops(gpu) / 1e12:,.0f}) over {link} "
               f"({W / 1e9:g} GB/s), h = {h}, g = {g}, {'causal' if causal else 'no mask'}")
    parts.point.set_visible(c is not None)
    if c is not None:
        tc, tt = cost.ring_round_times(c, h, F, W, causal=causal, g=g, e=e)
        parts.point.set_data([c, c], [tc * 1e3, tt * 1e3])
        setting += (f"\nc = {c:,.0f}: compute {tc * 1e3:.3g} ms, transfer {tt * 1e3:.3g} ms "
                    f"({'hidden' if tc >= tt else 'exposed'})")
    parts.title.set_text(setting)
    fig.c_star = c_star
    return kit.finish(fig)


def _block_restructure(parts, decades):
    """Another y range: the same axes."""
    parts.ax.set_ylim(10.0 ** decades[0], 10.0 ** decades[1])
    parts.label.set_y(10.0 ** decades[1])
    parts.restructured(decades)


def _block_build(fig, cs, decades):
    ax = fig.subplots()
    ax.set_xscale("log")
    ax.set_yscale("log")
    compute, = ax.plot(cs, cs, color=kit.COLORS["computed"], lw=2, label="compute per round")
    transfer, = ax.plot(cs, cs, color=kit.COLORS["comm"], lw=2, label="K/V transfer per round")
    star = ax.axvline(cs[0], color=kit.COLORS["edge"], ls="--", lw=1)
    span = ax.axvspan(cs[0], cs[1], color=kit.COLORS["split"], alpha=0.08, label="transfer exposed")
    point, = ax.plot([cs[0]] * 2, [cs[0]] * 2, "o", color=kit.COLORS["edge"])
    ax.set_xlim(cs[0], cs[-1])
    ax.set_ylim(10.0 ** decades[0], 10.0 ** decades[1])
    label = ax.text(cs[0], 10.0 ** decades[1], "", va="top", fontsize=9)
    ax.minorticks_off()                                # log axes' minor ticks cost most of a redraw
    ax.set_xlabel("block size c (tokens per rank)")
    ax.set_ylabel("time per round (ms)")
    parts = kit.Parts("block_size", decades, axes=[ax], ax=ax, compute=compute, transfer=transfer, star=star,
                      span=span, point=point, label=label, title=ax.set_title(" ", fontsize=9, y=1.0, pad=4))
    parts.dynamic.update(span=span, lines=[compute, transfer, star, point], label=label, title=parts.title,
                         legend=kit.fixed(ax.legend(loc="lower right", fontsize=8)))
    return kit.keep(fig, parts)


# ----------------------------------------------------------------------------- MoE capacity
@functools.lru_cache(maxsize=16)
def _routing(E, Ne, k, T, skew, capacity_factor, seed):
    return moe_routing(E=E, Ne=Ne, k=k, T=T, skew=skew, capacity_factor=capacity_factor, seed=seed)


def _moe_routing(E, Ne, k, T, skew, capacity_factor, seed):
    """:func:`moe_routing` and the y ranges of both panels (they move in steps, so most moves
    keep the axes); the last few routings are kept, so the view's key costs no second routing."""
    try:
        r = dict(_routing(E, Ne, k, T, skew, capacity_factor, seed))
    except TypeError:                                       # unhashable arguments: no cache
        r = moe_routing(E=E, Ne=Ne, k=k, T=T, skew=skew, capacity_factor=capacity_factor, seed=seed)
    tops = (nice_ceiling(max(r["received_per_expert"].max(), r["capacity"] or 0, 1) * 1.05),
            nice_ceiling(max(r["load_per_gpu"].max(), 1) * 1.4))
    return r, (E, Ne, k, T, tops)


def moe_structure(E=8, Ne=4, k=2, T=64, skew=0.0, capacity_factor=1.25, seed=0, **_):
    """The structure of the MoE figure: its sizes and the y ranges of both panels."""
    return _moe_routing(E, Ne, k, T, skew, capacity_factor, seed)[1]


def moe(fig, *, E: int, Ne: int, k: int, T: int, skew: float, capacity_factor, seed: int):
    """Draw (or update) the MoE capacity figure in ``fig``; returns the figure."""
    r, key = _moe_routing(E, Ne, k, T, skew, capacity_factor, seed)
    load, capacity = r["load_per_gpu"], r["capacity"]
    busiest = load.max()
    fig, parts = kit.structured(fig, "moe_capacity", key, MOE_SIZE, lambda fig: _moe_build(fig, E, Ne, key[-1], key),
                                lambda parts: _moe_restructure(parts, key),
                                fits=lambda parts: parts.sizes == key[:-1])   # other E, Ne, k or T: new axes
    flat, arrival, kept = r["experts"].ravel(), r["arrival"].ravel(), r["kept"].ravel()
    xy = np.column_stack([flat.astype(float), arrival])     # copy number y of its expert
    parts.computed.set_offsets(xy[kept])
    parts.dropped.set_offsets(xy[~kept])
    line = parts.capacity
    line.set_visible(capacity is not None)                  # copies 0..C-1 are kept: the line sits between
    line.set_ydata([(capacity or 0) - 0.5] * 2)
    line.set_label(f"capacity C = {capacity}" if capacity is not None else "_nolegend_")
    parts.dynamic["legend"] = kit.fixed(parts.ax.legend(loc="upper right", fontsize=8), capacity)
    parts.titles[0].set_text(f"N = {Ne * T} tokens, top-{k}, skew {skew:g}: dropped {100 * r['drop_rate']:.1f}% "
                             f"of copies")
    for done, wait, w in zip(parts.done, parts.wait, load):
        done.set_height(w)
        wait.set_y(w)
        wait.set_height(busiest - w)
    mean = load.mean()
    parts.titles[1].set_text(f"max/mean load = {busiest / mean:.2f}" if mean > 0 else "no load")
    fig.moe_routing = r
    return kit.finish(fig)


def _moe_restructure(parts, key):
    """Another y range: the same axes."""
    tops = key[-1]
    parts.ax.set_ylim(-0.03 * tops[0], tops[0])
    parts.bx.set_ylim(0, tops[1])
    parts.restructured(key)


def _moe_build(fig, E, Ne, tops, key):
    from matplotlib.ticker import MaxNLocator
    ax, bx = fig.subplots(2, 1, height_ratios=[2.2, 1])
    none = np.empty((0, 2))
    computed = ax.scatter(none[:, 0], none[:, 1], s=5, marker="s", color=kit.COLORS["computed"], label="computed")
    dropped = ax.scatter(none[:, 0], none[:, 1], s=5, marker="s", color=kit.COLORS["dropped"], label="dropped")
    capacity = ax.axhline(0, color=kit.COLORS["edge"], ls="--", lw=1)
    kit.ticks(ax.xaxis, range(E), [f"e{i}" for i in range(E)])
    ax.set_xlim(-0.6, E - 0.4)
    ax.set_ylim(-0.03 * tops[0], tops[0])
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("place in the expert's queue")
    for gpu in range(1, Ne):                                # behind the dots: part of the background
        ax.axvline(gpu * E // Ne - 0.5, color=kit.COLORS["masked"], lw=1, zorder=0.5)
    done = bx.bar(range(Ne), np.zeros(Ne), color=kit.COLORS["computed"], label="copies computed")
    wait = bx.bar(range(Ne), np.zeros(Ne), color=kit.COLORS["idle"], label="waiting")
    kit.ticks(bx.xaxis, range(Ne), [f"GPU {i}" for i in range(Ne)])
    bx.set_ylabel("copies per GPU")
    bx.yaxis.set_major_locator(MaxNLocator(integer=True))
    bx.set_ylim(0, tops[1])
    titles = (ax.set_title(" ", fontsize=9, y=1.0, pad=4), bx.set_title(" ", fontsize=9, y=1.0, pad=4))
    parts = kit.Parts("moe_capacity", key, axes=[ax, bx], ax=ax, bx=bx, sizes=key[:-1], computed=computed,
                      dropped=dropped, capacity=capacity, done=list(done), wait=list(wait), titles=titles)
    parts.dynamic.update(dots=[computed, dropped, capacity], bars=list(done) + list(wait), titles=list(titles),
                         legend=None, bar_legend=kit.fixed(bx.legend(loc="upper right", fontsize=8)))
    return kit.keep(fig, parts)
