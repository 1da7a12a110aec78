"""The five interactive figures of the lesson (matplotlib + ipywidgets).

Every figure comes in two parts:

* ``draw_<name>(fig=None, **params) -> matplotlib.figure.Figure``: a pure drawing
  function. It draws into ``fig`` (cleared first) or a new Figure, never touches
  pyplot's global state, and works headless (tests call it with ``MPLBACKEND=Agg``).
* ``<name>(**params) -> ipywidgets.VBox``: the interactive version. Its sliders and
  buttons call the draw function and show the result as a PNG image, so it
  renders the same in JupyterLab, Colab and VS Code, whatever the matplotlib backend.

Colours (:data:`COLORS`): blue = computed, faint blue = computed earlier, grey = masked,
violet = idle or replicated, magenta = split by tokens (SP) or dropped, aqua = communication.

Figures: :func:`ring_rounds`, :func:`sp_strip`, :func:`block_size`,
:func:`ulysses_grid`, :func:`moe_capacity`.
"""
from __future__ import annotations

import textwrap

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from .. import cost, layouts
from .data import moe_routing, ulysses_owner
from .data import owners as _owners
from .data import ring_states as _ring_states
from .kit import COLORS
from .kit import RELEASE as _RELEASE
from .kit import STYLE as _STYLE
from .kit import View as _View
from .kit import legend as _legend
from .kit import new_figure as _figure
from .kit import widgets as _widgets

__all__ = [
    "COLORS",
    "draw_ring_rounds", "ring_rounds",
    "draw_sp_strip", "sp_strip",
    "draw_block_size", "block_size",
    "draw_ulysses_grid", "ulysses_grid",
    "draw_moe_capacity", "moe_capacity", "moe_routing", "ulysses_owner",
]

# =========================================================================== 1. ring rounds
def draw_ring_rounds(fig=None, *, n: int = 4, s: int = 16, layout: str = "contiguous",
                     round: int = 0, causal: bool = True) -> Figure:
    """Score matrix and per-rank work of ring attention in round ``round``.

    Left: the ``s x s`` score matrix (rows = queries, grouped by the rank that owns them).
    Blue: pairs computed in this round; faint blue: in earlier rounds; white: in a later
    round (that K/V block has not reached the rank yet); grey: masked (``key > query``); a
    legend under the matrix says so. Past 16 tokens the rows are labelled by rank band. Right: visible pairs per rank in this round (blue, equal to
    ``layouts.causal_work(n, layout, s)[round]``) and the idle time (violet) up to the
    busiest rank.
    """
    if not 0 <= round < n:
        raise ValueError(f"round must be in 0..{n - 1} for n = {n} ranks, got {round}")
    owner = _owners(s, n, layout)
    fig = _figure(fig, (9, 4.8), "ring_rounds")
    ax, bx = fig.subplots(1, 2, width_ratios=[1.15, 1])

    state = _ring_states(s, n, layout, causal, round)
    palette = [COLORS["masked"], COLORS["empty"], COLORS["earlier"], COLORS["computed"]]
    from matplotlib.colors import ListedColormap
    # rows ordered by rank, so each rank owns a horizontal band
    order = np.argsort(owner, kind="stable")
    ax.imshow(state[order], cmap=ListedColormap(palette), vmin=0, vmax=3, interpolation="nearest")
    for r in range(1, n):
        ax.axhline(r * s / n - 0.5, color=COLORS["edge"], lw=1)
    if s <= 16:                  # few tokens: name every query row and key column
        ax.set_xticks(range(s))
        ax.set_yticks(range(s), [f"r{owner[i]}: q{i}" for i in order], fontsize=7)
    else:                        # many: one label per rank band, key ticks at band edges
        step = s // n
        ax.set_xticks(range(0, s, step), [str(x) for x in range(0, s, step)], fontsize=7)
        ax.set_yticks([r * step + (step - 1) / 2 for r in range(n)], [f"rank {r}" for r in range(n)], fontsize=7)
    ax.set_xlabel("key token")
    ax.set_ylabel("query token (by owning rank)", fontsize=8)
    ax.set_title(f"{layout}, round {round}: rank r holds K/V of rank (r-{round}) mod {n}", fontsize=9, y=1.0, pad=4)
    _legend(ax, [("computed", "computed this round"), ("earlier", "computed in an earlier round"),
                 ("empty", "later round (K/V not here yet)"), ("masked", "masked (key > query)")],
            loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, fontsize=7)

    work = layouts.causal_work(n, layout, s=s) if causal else np.full((n, n), (s // n) ** 2)
    this = work[round]
    busiest = this.max()
    bx.bar(range(n), this, color=COLORS["computed"], label="work this round")
    bx.bar(range(n), busiest - this, bottom=this, color=COLORS["idle"], label="idle (waits)")
    bx.set_xticks(range(n), [str(r) if n > 4 else f"rank {r}" for r in range(n)])
    bx.set_xlabel("rank" if n > 4 else "")
    bx.set_ylabel("visible (query, key) pairs")
    bx.set_ylim(0, max(work.max(), 1) * 1.15)
    so_far = layouts.ring_time(work[: round + 1])
    bx.set_title(f"ring time so far {so_far} (total {layouts.ring_time(work)}, "
                 f"ideal {work.sum() / n:g})", fontsize=9, y=1.0, pad=4)
    bx.legend(loc="upper left", fontsize=8)
    return fig


def valid_tokens(n: int, layout: str, smallest: int = 4, largest: int = 64) -> list[int]:
    """The sequence lengths ``s`` in ``smallest..largest`` that ``layout`` can split over ``n``
    ranks: multiples of ``n`` (contiguous, striped) or of ``2n`` (zig-zag)."""
    step = layouts.layout_unit(n, layout)
    return [s for s in range(step, largest + 1, step) if s >= smallest] or [step]


def ring_rounds(n: int = 4, s: int = 16, layout: str = "contiguous"):
    """Interactive ring attention: Next round rotates the K/V blocks; switch the layout. The
    tokens slider offers only the lengths the layout can split over N_c ranks."""
    w = _widgets()
    view = _View(draw_ring_rounds, dict(n=n, s=s, layout=layout, round=0), (9, 4.8))
    lay = w.ToggleButtons(options=list(layouts.LAYOUTS), value=layouts.layout_name(layout),
                          description="layout")
    ranks = w.IntSlider(value=n, min=2, max=8, description="ranks N_c", style=_STYLE, **_RELEASE)
    options = valid_tokens(n, layout)
    tokens = w.SelectionSlider(options=options, value=s if s in options else options[0],
                               description="tokens s", style=_STYLE, **_RELEASE)
    nxt = w.Button(description="Next round", button_style="primary")
    busy = []                               # re-entry guard while the options are replaced

    def on_change(_=None):
        if busy:
            return
        busy.append(1)
        try:
            options = valid_tokens(ranks.value, lay.value)
            if list(tokens.options) != options:
                keep = tokens.value
                tokens.options = options
                tokens.value = min(options, key=lambda x: (abs(x - keep), x))
        finally:
            busy.clear()
        view.update(n=ranks.value, s=tokens.value, layout=lay.value, round=0)

    def on_next(_=None):
        view.update(round=(view.state["round"] + 1) % view.state["n"])

    for control in (lay, ranks, tokens):
        control.observe(on_change, names="value")
    nxt.on_click(on_next)
    view.update(s=tokens.value)
    box = view.box(w.VBox([w.HBox([lay, nxt]), w.HBox([ranks, tokens])]))
    box.next_round, box.layout_toggle, box.ranks_slider, box.tokens_slider = on_next, lay, ranks, tokens
    return box


# =========================================================================== 2. SP strip
_STRIP = [  # (label, kind) in forward order; kind: "rep" replicated under TP, "tp" split by TP
    ("LN1 input", "rep"), ("LN1 output", "rep"), ("g", "col"), ("attention\n(heads)", "tp"), ("g_bar", "row"),
    ("dropout 1\nmask", "rep"), ("LN2 input", "rep"), ("LN2 output", "rep"), ("g", "col"),
    ("MLP\n(columns)", "tp"), ("g_bar", "row"), ("dropout 2\nmask", "rep"),
]


def draw_sp_strip(fig=None, *, t: int = 4, sp: bool = False, s: int = 8192, h: int = 4096,
                  a: int = 32, e: int = 2) -> Figure:
    """One transformer layer as a strip of ``s x h`` boxes: the part GPU 0 stores.

    Under TP the LayerNorm/dropout regions are full copies (violet) and attention/MLP
    are split by heads/columns (blue); under TP + SP the violet boxes become token
    shards (magenta, the top ``s/t`` rows). Aqua markers are the collectives: TP has an
    all-reduce (AR) after each row-parallel matmul, SP a reduce-scatter (RS) there and an
    all-gather (AG) before each column-parallel matmul. The readout shows that the
    bytes sent are the same, and the memory is not. At ``t = 1`` one GPU holds every tensor
    whole (blue): nothing is copied, split or sent. A legend names each colour drawn.
    """
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 1:
        raise ValueError(f"t (TP degree) must be an integer >= 1, got {t!r}")
    fig = _figure(fig, (11, 3.0), "sp_strip")
    ax = fig.subplots()
    x = 0.0
    for label, kind in _STRIP:
        if kind in ("col", "row"):
            text = ("AG" if kind == "col" else "RS") if sp else ("" if kind == "col" else "AR")
            if text and t > 1:    # one GPU: no partner, no collective
                ax.add_patch(Rectangle((x + 0.05, 0.35), 0.5, 0.3, color=COLORS["comm"]))
                ax.text(x + 0.3, 0.5, text, ha="center", va="center", fontsize=9, weight="bold")
            else:
                ax.text(x + 0.3, 0.5, "→", ha="center", va="center", fontsize=10)
            x += 0.6
            continue
        ax.add_patch(Rectangle((x, 0), 1, 1, fill=False, ec=COLORS["edge"], lw=1))
        if kind == "tp":          # split by heads / columns: the left 1/t of the h axis
            ax.add_patch(Rectangle((x, 0), 1 / t, 1, color=COLORS["computed"]))
        elif t == 1:              # one GPU holds the whole tensor: nothing is copied
            ax.add_patch(Rectangle((x, 0), 1, 1, color=COLORS["computed"]))
        elif sp:                  # split by tokens: the top s/t rows
            ax.add_patch(Rectangle((x, 1 - 1 / t), 1, 1 / t, color=COLORS["split"]))
        else:                     # a full copy on every GPU
            ax.add_patch(Rectangle((x, 0), 1, 1, color=COLORS["replicated"]))
        ax.text(x + 0.5, -0.12, label, ha="center", va="top", fontsize=8)
        x += 1.2
    ax.set_xlim(-0.1, x)
    ax.set_ylim(-0.55, 1.25)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.text(-0.05, 1.05, "tokens s ↓, hidden h →", fontsize=8, va="bottom")
    if t == 1:
        entries = [("computed", "the whole tensor (t = 1: one GPU, nothing split, copied or sent)")]
    else:
        entries = [("computed", "GPU 0's share, split by heads / columns (TP)"),
                   ("split" if sp else "replicated",
                    f"GPU 0's share, split by tokens: s/{t} rows (SP)" if sp
                    else f"a full copy, replicated on all {t} GPUs"),
                   ("comm", "collective: " + ("AG all-gather, RS reduce-scatter" if sp else "AR all-reduce"))]
    _legend(ax, entries, loc="lower center", bbox_to_anchor=(0.5, -0.42), ncol=len(entries), frameon=False)

    nbytes = s * h * e
    if sp:
        sent = 2 * cost.reduce_scatter_bytes(nbytes, t) + 2 * cost.all_gather_bytes(nbytes, t)
        recipe = "2 RS + 2 AG"
    else:
        sent = 2 * cost.all_reduce_bytes(nbytes, t)
        recipe = "2 AR"
    if t == 1:
        recipe = "nothing (one GPU)"
    memory = cost.activation_bytes(s, 1, h, a, t=t, sp=sp)
    ax.set_title(f"{'TP + SP' if sp else 'TP'}, t = {t}: sent per GPU per layer (forward) = {recipe} = "
                 f"{sent / 1e6:.1f} MB;  activations stored = {memory / 1e6:.0f} MB "
                 f"(s = {s}, h = {h}, FlashAttention)", fontsize=9, y=1.0, pad=4)
    fig.sp_strip_bytes = sent
    return fig


def sp_strip(t: int = 4):
    """Interactive SP strip: switch TP / TP + SP and move the TP degree."""
    w = _widgets()
    view = _View(draw_sp_strip, dict(t=t, sp=False), (11, 3.0))
    mode = w.ToggleButtons(options=["TP", "TP + SP"], value="TP", description="mode")
    degree = w.IntSlider(value=t, min=1, max=16, description="TP degree t", style=_STYLE, **_RELEASE)

    def on_change(_=None):
        view.update(t=degree.value, sp=mode.value == "TP + SP")

    view.watch((mode, degree), on_change)
    box = view.box([mode, degree])
    box.mode_toggle, box.degree_slider = mode, degree
    return box


# =========================================================================== 3. block size
def draw_block_size(fig=None, *, h: int = 4096, link="InfiniBand", g: int = 1, causal: bool = False,
                    gpu="H100", c: float | None = None, e: int = 2, F: float | None = None) -> Figure:
    """Compute time per ring round (blue, ``4c^2h/F``, half with a causal mask) against the K/V
    transfer time (aqua, ``4ch/(gW)``) over the block size ``c``, on log axes. The dashed line
    is ``c* = cost.min_block_size``: left of it the transfer is exposed (shaded), right of it
    hidden. ``c*`` does not depend on ``h``. ``F``: the FLOP/s attention achieves (default: the
    ``gpu``'s peak); the lesson's quick check uses 500 TFLOP/s, which halves ``c*``."""
    F = cost.peak_flops(gpu if F is None else F)              # validates: a finite number > 0
    W = cost.link_bandwidth(link)
    c_star = cost.min_block_size(F, W, causal=causal, g=g, e=e)
    fig = _figure(fig, (7, 4.2), "block_size")
    ax = fig.subplots()
    cs = np.geomspace(128, 262_144, 200)
    # compute grows as c^2 and the transfer as c: scale the closed forms at one block size
    tc0, tt0 = cost.ring_round_times(cs[0], h, F, W, causal=causal, g=g, e=e)
    compute, transfer = tc0 * (cs / cs[0]) ** 2, tt0 * (cs / cs[0])
    ax.loglog(cs, compute * 1e3, color=COLORS["computed"], lw=2, label="compute per round")
    ax.loglog(cs, transfer * 1e3, color=COLORS["comm"], lw=2, label="K/V transfer per round")
    ax.axvline(c_star, color=COLORS["edge"], ls="--", lw=1)
    ax.axvspan(cs[0], min(c_star, cs[-1]), color=COLORS["split"], alpha=0.08, label="transfer exposed")
    ax.text(c_star, ax.get_ylim()[1], f" c* = {c_star:,.0f}", va="top", fontsize=9)
    if c is not None:
        tc, tt = cost.ring_round_times(c, h, F, W, causal=causal, g=g, e=e)
        ax.plot([c, c], [tc * 1e3, tt * 1e3], "o", color=COLORS["edge"])
    setting = (f"F = {F / 1e12:,.0f} TFLOP/s ({gpu} peak {cost.peak_flops(gpu) / 1e12:,.0f}) over {link} "
               f"({W / 1e9:g} GB/s), h = {h}, g = {g}, {'causal' if causal else 'no mask'}")
    if c is not None:
        verdict = "hidden" if tc >= tt else "exposed"
        setting += f"\nc = {c:,.0f}: compute {tc * 1e3:.3g} ms, transfer {tt * 1e3:.3g} ms ({verdict})"
    ax.set_title(setting, fontsize=9, y=1.0, pad=4)   # a fixed place: no search for tick labels
    ax.minorticks_off()                                # log axes' minor ticks cost most of a redraw
    ax.set_xlabel("block size c (tokens per rank)")
    ax.set_ylabel("time per round (ms)")
    ax.legend(loc="lower right", fontsize=8)
    fig.c_star = c_star
    return fig


def block_size(h: int = 4096, link: str = "InfiniBand", g: int = 1, causal: bool = False):
    """Interactive minimum block size: move c, switch the link, GQA group and causal mask."""
    w = _widgets()
    view = _View(draw_block_size, dict(h=h, link=link, g=g, causal=causal, c=16_384), (7, 4.2))
    # block sizes span 512 .. 131072 tokens on a log axis: a log slider (base 2, quarter steps)
    c_slider = w.FloatLogSlider(value=16_384, base=2, min=9, max=17, step=0.25, description="block c",
                                readout_format=",.0f", style=_STYLE, **_RELEASE)
    h_slider = w.Dropdown(options=[1024, 2048, 4096, 8192, 16384], value=h, description="hidden h", style=_STYLE)
    link_toggle = w.ToggleButtons(options=[k for k, v in cost.HARDWARE.items() if v["kind"] == "link"],
                                  value=link, description="link")
    g_slider = w.Dropdown(options=[1, 2, 4, 8], value=g, description="GQA g", style=_STYLE)
    causal_box = w.Checkbox(value=causal, description="causal mask")
    peak = round(cost.peak_flops("H100") / 1e12)
    f_slider = w.IntSlider(value=peak, min=50, max=peak, step=1, description="F (TFLOP/s)", style=_STYLE,
                           **_RELEASE)

    def on_change(_=None):
        view.update(c=round(c_slider.value), h=h_slider.value, link=link_toggle.value, g=g_slider.value,
                    causal=causal_box.value, F=f_slider.value * 1e12)

    view.watch((c_slider, h_slider, link_toggle, g_slider, causal_box, f_slider), on_change)
    box = view.box(w.VBox([w.HBox([c_slider, h_slider]), link_toggle, w.HBox([g_slider, causal_box]), f_slider]))
    box.f_slider, box.causal_box, box.g_dropdown, box.link_toggle = f_slider, causal_box, g_slider, link_toggle
    return box


# =========================================================================== 4. Ulysses grid
def draw_ulysses_grid(fig=None, *, n: int = 4, s: int = 8, heads: int = 8, kv_heads: int = 8,
                      state: str = "sequence", rank: int = 0, arrived: bool | None = None) -> Figure:
    """One tensor as a (token x head) grid; each cell shows the rank that holds it.

    ``state="sequence"``: rank r holds token block r (a row band); ``"heads"``: after the
    all-to-all it holds head group r for all tokens (a column band). Cells of ``rank`` are
    magenta; cells that arrived over the network in the last all-to-all have an aqua border
    (``arrived``: default True in the ``"heads"`` state, i.e. after the first all-to-all).
    The K/V strip shows which ranks need each K/V head (faint blue: one rank; violet: several,
    so the head is copied to each): with ``kv_heads < n`` whole K/V heads must be copied and a
    warning names the limit. Legends beside both panels say what the colours mean.
    """
    if n < 1 or heads % kv_heads:
        raise ValueError(f"heads = {heads} must be a multiple of kv_heads = {kv_heads}")
    if not 0 <= rank < n:
        raise ValueError(f"rank must be in 0..{n - 1}, got {rank}")
    if arrived is None:
        arrived = state == "heads"
    owner = ulysses_owner(n, s, heads, state)
    before = ulysses_owner(n, s, heads, "heads" if state == "sequence" else "sequence")
    fig = _figure(fig, (8.5, 5), "ulysses_grid")
    ax, kx = fig.subplots(2, 1, height_ratios=[s, 1.6])
    for i in range(s):
        for j in range(heads):
            mine = owner[i, j] == rank
            ax.add_patch(Rectangle((j, i), 1, 1, fc=COLORS["split"] if mine else COLORS["empty"],
                                   ec=COLORS["edge"], lw=0.5))
            if arrived and owner[i, j] != before[i, j]:
                ax.add_patch(Rectangle((j + 0.06, i + 0.06), 0.88, 0.88, fill=False,
                                       ec=COLORS["comm"], lw=2))
            ax.text(j + 0.5, i + 0.5, str(owner[i, j]), ha="center", va="center", fontsize=8,
                    color="white" if mine else "black")
    ax.set_xlim(0, heads)
    ax.set_ylim(s, 0)
    ax.set_xticks(np.arange(heads) + 0.5, range(heads))
    ax.set_yticks(np.arange(s) + 0.5, range(s))
    ax.set_aspect("equal")
    ax.set_xlabel("head")
    ax.set_ylabel("token")
    kept = s * heads // n // n
    ax.set_title(f"{'sequence sharding' if state == 'sequence' else 'head sharding (after all-to-all)'}: "
                 f"each rank keeps {kept} cells, sends {(n - 1) * kept}", fontsize=9, y=1.0, pad=4)

    # K/V heads: which ranks need each one in head sharding (query head j uses K/V head j // g)
    g = heads // kv_heads
    needed_by = [sorted({j // (heads // n) for j in range(heads) if j // g == kv}) for kv in range(kv_heads)]
    for kv, ranks_ in enumerate(needed_by):
        shared = len(ranks_) > 1
        kx.add_patch(Rectangle((kv, 0), 1, 1, fc=COLORS["replicated"] if shared else COLORS["earlier"],
                               ec=COLORS["edge"], lw=0.5))
        kx.text(kv + 0.5, 0.5, ",".join(map(str, ranks_)), ha="center", va="center", fontsize=8)
    kx.set_xlim(0, max(kv_heads, 1))
    kx.set_ylim(1, 0)
    kx.set_yticks([])
    kx.set_xticks(np.arange(kv_heads) + 0.5, range(kv_heads))
    kx.set_xlabel("K/V head (label: ranks that need it)")
    _legend(ax, [("split", f"held by rank {rank}"), ("empty", "held by another rank")]
            + ([("comm", "arrived in the last all-to-all (aqua border)")] if arrived else []),
            loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=7)
    _legend(kx, [("earlier", "K/V head needed by one rank"),
                 ("replicated", "needed by several ranks: copied to each")],
            loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=7)
    warning = ""
    if kv_heads < n:
        warning = (f"warning: {n} ranks but only {kv_heads} K/V heads. Each rank needs whole K/V heads, "
                   f"so Ulysses alone scales to {kv_heads} rank{'s' if kv_heads > 1 else ''}; "
                   f"copy K/V heads (more bytes) "
                   f"or combine with ring attention")
        kx.set_title(textwrap.fill(warning, 90), fontsize=8, color=COLORS["split"], y=1.0, pad=4)
    fig.ulysses_warning = warning
    return fig


def ulysses_grid(n: int = 4, s: int = 8, heads: int = 8, kv_heads: int = 8):
    """Interactive Ulysses: All-to-all toggles sequence <-> head sharding; pick a rank, K/V heads."""
    w = _widgets()
    view = _View(draw_ulysses_grid, dict(n=n, s=s, heads=heads, kv_heads=kv_heads, state="sequence",
                                         rank=0), (8.5, 5))
    a2a = w.Button(description="All-to-all", button_style="primary")
    rank = w.IntSlider(value=0, min=0, max=n - 1, description="rank", **_RELEASE)
    kv = w.Dropdown(options=[d for d in range(1, heads + 1) if heads % d == 0], value=kv_heads,
                    description="K/V heads", style=_STYLE)

    def on_a2a(_=None):
        view.update(state="heads" if view.state["state"] == "sequence" else "sequence", arrived=True)

    def on_change(_=None):
        view.update(rank=rank.value, kv_heads=kv.value)

    a2a.on_click(on_a2a)
    view.watch((rank, kv), on_change)
    box = view.box([a2a, rank, kv])
    box.all_to_all = on_a2a
    box.kv_dropdown = kv
    return box


# =========================================================================== 5. MoE capacity
def draw_moe_capacity(fig=None, *, E: int = 8, Ne: int = 4, k: int = 2, T: int = 64, skew: float = 0.0,
                      capacity_factor: float | None = 1.25, seed: int = 0) -> Figure:
    """Top: every (token, expert) copy as a dot on its expert at its place in the expert's queue
    (arrival order, 0-based); the copies above the dashed capacity line ``y = C - 0.5`` (magenta)
    are dropped, those below (blue) are computed. Bottom: the computed load of each GPU (blue)
    and the time the others wait for the busiest (violet)."""
    from matplotlib.ticker import MaxNLocator

    r = moe_routing(E=E, Ne=Ne, k=k, T=T, skew=skew, capacity_factor=capacity_factor, seed=seed)
    fig = _figure(fig, (8, 5.5), "moe_capacity")
    ax, bx = fig.subplots(2, 1, height_ratios=[2.2, 1])
    flat, arrival, kept = r["experts"].ravel(), r["arrival"].ravel(), r["kept"].ravel()
    x, y = flat.astype(float), arrival                     # copy number y of its expert
    ax.scatter(x[kept], y[kept], s=5, marker="s", color=COLORS["computed"], label="computed")
    ax.scatter(x[~kept], y[~kept], s=5, marker="s", color=COLORS["dropped"], label="dropped")
    if r["capacity"] is not None:                          # copies 0..C-1 are kept: the line sits between
        ax.axhline(r["capacity"] - 0.5, color=COLORS["edge"], ls="--", lw=1,
                   label=f"capacity C = {r['capacity']}")
    ax.set_xticks(range(E), [f"e{i}" for i in range(E)])
    ax.set_xlim(-0.6, E - 0.4)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("place in the expert's queue")
    for gpu in range(1, Ne):
        ax.axvline(gpu * E // Ne - 0.5, color=COLORS["masked"], lw=1)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(f"N = {Ne * T} tokens, top-{k}, skew {skew:g}: dropped {100 * r['drop_rate']:.1f}% "
                 f"of copies", fontsize=9, y=1.0, pad=4)
    load = r["load_per_gpu"]
    busiest = load.max()
    bx.bar(range(Ne), load, color=COLORS["computed"], label="copies computed")
    bx.bar(range(Ne), busiest - load, bottom=load, color=COLORS["idle"], label="waiting")
    bx.set_xticks(range(Ne), [f"GPU {i}" for i in range(Ne)])
    bx.set_ylabel("copies per GPU")
    bx.yaxis.set_major_locator(MaxNLocator(integer=True))
    bx.set_ylim(0, max(busiest, 1) * 1.4)
    mean = load.mean()
    bx.set_title(f"max/mean load = {busiest / mean:.2f}" if mean > 0 else "no load", fontsize=9, y=1.0, pad=4)
    bx.legend(loc="upper right", fontsize=8)
    fig.moe_routing = r
    return fig


def moe_capacity(E: int = 8, Ne: int = 4, k: int = 2, T: int = 64, skew: float = 0.0,
                 capacity_factor: float | None = 1.25):
    """Interactive MoE capacity: move the router skew and the capacity factor ("none" = no limit)."""
    w = _widgets()
    view = _View(draw_moe_capacity, dict(E=E, Ne=Ne, k=k, T=T, skew=skew, capacity_factor=capacity_factor),
                 (8, 5.5))
    skew_slider = w.FloatSlider(value=skew, min=0.0, max=6.0, step=0.25, description="router skew",
                                style=_STYLE, **_RELEASE)
    # labels as values: a Dropdown whose value is None shows an empty selection
    options = ["none", "1.0", "1.1", "1.25", "1.5", "2.0"]
    label = "none" if capacity_factor is None else f"{float(capacity_factor):g}"
    label = {"1": "1.0", "2": "2.0"}.get(label, label)
    if label not in options:
        options.append(label)
    cf = w.Dropdown(options=options, value=label, description="capacity factor", style=_STYLE)

    def on_change(_=None):
        view.update(skew=skew_slider.value, capacity_factor=None if cf.value == "none" else float(cf.value))

    view.watch((skew_slider, cf), on_change)
    box = view.box([skew_slider, cf])
    box.skew_slider, box.cf_dropdown = skew_slider, cf
    return box
