"""The five interactive figures of the lesson (matplotlib + ipywidgets).

Every figure comes in two parts:

* ``draw_<name>(fig=None, **params) -> matplotlib.figure.Figure``: a pure drawing
  function. It draws into ``fig`` (cleared first) or a new Figure, never touches
  pyplot's global state, and works headless (tests call it with ``MPLBACKEND=Agg``).
* ``<name>(**params) -> ipywidgets.VBox``: the interactive version. Its sliders and
  buttons call the draw function and show the result as a PNG image, so it
  renders the same in JupyterLab, Colab and VS Code, whatever the matplotlib backend.
  Every control offers only values the figure can draw. Its display also carries a PNG of
  the figure as first shown, what GitHub, nbviewer and a saved notebook show where widgets
  do not run (:func:`lesson10.figures.kit.static_bundle`).

A redraw updates the artists a control changes in the figure the widget keeps, and paints
them over a kept picture of the rest (:mod:`lesson10.figures.kit`); the builders are in
:mod:`lesson10.figures.grids` and :mod:`lesson10.figures.plots`.

Colours (:data:`COLORS`): blue = computed, faint blue = computed earlier, grey = masked,
violet = idle or replicated, magenta = split by tokens (SP) or dropped, aqua = communication.

Figures: :func:`ring_rounds`, :func:`sp_strip`, :func:`block_size`,
:func:`ulysses_grid`, :func:`moe_capacity`; and one static plot, :func:`plot_layout_times`
(notebook 03: the ring time of each layout, every line visible where they coincide).
"""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from .. import cost, layouts
from . import grids as _grids
from . import plots as _plots
from .data import moe_routing, ulysses_owner
from .kit import COLORS
from .kit import RELEASE as _RELEASE
from .kit import STYLE as _STYLE
from .kit import View as _View
from .kit import widgets as _widgets

__all__ = [
    "COLORS",
    "draw_ring_rounds", "ring_rounds",
    "draw_sp_strip", "sp_strip",
    "draw_block_size", "block_size",
    "draw_ulysses_grid", "ulysses_grid",
    "draw_moe_capacity", "moe_capacity", "moe_routing", "ulysses_owner",
    "plot_layout_times",
]

# =========================================================================== 1. ring rounds
def draw_ring_rounds(fig=None, *, n: int = 4, s: int = 16, layout: str = "contiguous",
                     round: int = 0, causal: bool = True) -> Figure:
    """Score matrix and per-rank work of ring attention in round ``round``.

    Left: the ``s x s`` score matrix (rows = queries, grouped by the rank that owns them).
    Blue: pairs computed in this round; faint blue: in earlier rounds; white: in a later
    round (that K/V block has not reached the rank yet); grey: masked (``key > query``); a
    legend under the matrix says so. Past 16 tokens the rows are labelled by rank band.
    Right: visible pairs per rank in this round (blue, equal to
    ``layouts.causal_work(n, layout, s)[round]``) and the idle time (violet) up to the
    busiest rank.
    """
    return _grids.ring(fig, n=n, s=s, layout=layout, round=round, causal=causal)


def valid_tokens(n: int, layout: str, smallest: int = 4, largest: int = 64) -> list[int]:
    """The sequence lengths ``s`` in ``smallest..largest`` that ``layout`` can split over ``n``
    ranks: multiples of ``n`` (contiguous, striped) or of ``2n`` (zig-zag)."""
    step = layouts.layout_unit(n, layout)
    return [s for s in range(step, largest + 1, step) if s >= smallest] or [step]


def ring_rounds(n: int = 4, s: int = 16, layout: str = "contiguous"):
    """Interactive ring attention: Next round rotates the K/V blocks; switch the layout. The
    tokens slider offers only the lengths the layout can split over N_c ranks."""
    w = _widgets()
    view = _View(draw_ring_rounds, dict(n=n, s=s, layout=layout, round=0), _grids.RING_SIZE,
                 structure=lambda n, s, layout, **_: (n, s, layout))
    lay = w.ToggleButtons(options=list(layouts.LAYOUTS), value=layouts.layout_name(layout),
                          description="layout")
    ranks = w.IntSlider(value=n, min=2, max=8, description="ranks N_c", style=_STYLE, **_RELEASE)
    options = valid_tokens(ranks.value, lay.value)       # the slider may have clamped n to 2..8
    tokens = w.SelectionSlider(options=options, value=s if s in options else options[0],
                               description="tokens s", style=_STYLE, **_RELEASE)
    nxt = w.Button(description="Next round", button_style="primary")
    busy: list[int] = []                    # re-entry guard while the options are replaced

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
    view.update(n=ranks.value, s=tokens.value, layout=lay.value)
    box = view.box(w.VBox([w.HBox([lay, nxt]), w.HBox([ranks, tokens])]))
    box.next_round, box.layout_toggle, box.ranks_slider, box.tokens_slider = on_next, lay, ranks, tokens
    return box


# =========================================================================== 2. SP strip
def draw_sp_strip(fig=None, *, t: int = 4, sp: bool = False, s: int = 8192, h: int = 4096,
                  a: int = 32, e: int = 2) -> Figure:
    """One transformer layer as a strip of ``s x h`` boxes: the part GPU 0 stores.

    Under TP the LayerNorm/dropout regions are full copies (violet) and attention/MLP
    are split by heads/columns (blue); under TP + SP the violet boxes become token
    shards (magenta, the top ``s/t`` rows). Aqua markers are the collectives: TP has an
    all-reduce (AR) after each row-parallel matmul, SP a reduce-scatter (RS) there and an
    all-gather (AG) before each column-parallel matmul. The readout shows that the
    bytes sent are the same, and the memory is not. At ``t = 1`` one GPU holds every tensor
    whole (blue): nothing is copied, split or sent. A legend names each colour drawn. ``t``
    must divide ``s``, ``h`` and ``a`` (:func:`lesson10.figures.plots.tp_degrees`).
    """
    return _plots.sp(fig, t=t, sp=sp, s=s, h=h, a=a, e=e)


def sp_strip(t: int = 4):
    """Interactive SP strip: switch TP / TP + SP and move the TP degree (only the degrees that
    split the layer's tokens, hidden size and heads evenly)."""
    w = _widgets()
    degrees = _plots.tp_degrees()
    if t not in degrees:
        raise ValueError(f"t = {t!r} does not split s = 8192 tokens and a = 32 heads evenly; use one of {degrees}")
    view = _View(draw_sp_strip, dict(t=t, sp=False), _plots.SP_SIZE, structure=lambda **_: None)
    mode = w.ToggleButtons(options=["TP", "TP + SP"], value="TP", description="mode")
    degree = w.SelectionSlider(options=degrees, value=t, description="TP degree t", style=_STYLE, **_RELEASE)

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
    return _plots.block(fig, h=h, link=link, g=g, causal=causal, gpu=gpu, c=c, e=e, F=F)


def block_size(h: int = 4096, link: str = "InfiniBand", g: int = 1, causal: bool = False):
    """Interactive minimum block size: move c, switch the link, GQA group and causal mask."""
    w = _widgets()
    view = _View(draw_block_size, dict(h=h, link=link, g=g, causal=causal, c=16_384), _plots.BLOCK_SIZE,
                 structure=_plots.block_structure)
    # block sizes span 512 .. 131072 tokens on a log axis: a log slider (base 2, quarter steps)
    c_slider = w.FloatLogSlider(value=16_384, base=2, min=9, max=17, step=0.25, description="block c",
                                readout_format=",.0f", style=_STYLE, **_RELEASE)
    h_slider = w.Dropdown(options=sorted({1024, 2048, 4096, 8192, 16384, h}), value=h, description="hidden h",
                          style=_STYLE)
    link_toggle = w.ToggleButtons(options=[k for k, v in cost.HARDWARE.items() if v["kind"] == "link"],
                                  value=link, description="link")
    g_slider = w.Dropdown(options=sorted({1, 2, 4, 8, g}), value=g, description="GQA g", style=_STYLE)
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
    box.c_slider, box.h_dropdown = c_slider, h_slider
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
    return _grids.ulysses(fig, n=n, s=s, heads=heads, kv_heads=kv_heads, state=state, rank=rank,
                          arrived=arrived)


def ulysses_grid(n: int = 4, s: int = 8, heads: int = 8, kv_heads: int = 8):
    """Interactive Ulysses: All-to-all toggles sequence <-> head sharding; pick a rank, K/V heads."""
    w = _widgets()
    view = _View(draw_ulysses_grid, dict(n=n, s=s, heads=heads, kv_heads=kv_heads, state="sequence",
                                         rank=0), _grids.ULYSSES_SIZE,
                 structure=lambda n, s, heads, kv_heads, **_: (n, s, heads, kv_heads))
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
    return _plots.moe(fig, E=E, Ne=Ne, k=k, T=T, skew=skew, capacity_factor=capacity_factor, seed=seed)


def moe_capacity(E: int = 8, Ne: int = 4, k: int = 2, T: int = 64, skew: float = 0.0,
                 capacity_factor: float | None = 1.25):
    """Interactive MoE capacity: move the router skew and the capacity factor ("none" = no limit)."""
    w = _widgets()
    view = _View(draw_moe_capacity, dict(E=E, Ne=Ne, k=k, T=T, skew=skew, capacity_factor=capacity_factor),
                 _plots.MOE_SIZE, structure=_plots.moe_structure)
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


# =========================================================================== notebook 03: ring time per layout
#: how each layout's line is drawn: where zig-zag and striped are both balanced their lines
#: coincide, so striped is a wide pale band under zig-zag's dashed line with hollow markers
LAYOUT_LINES = {
    "contiguous": dict(color=COLORS["split"], ls="-", lw=1.5, marker="o", ms=5, zorder=3),
    "striped": dict(color=COLORS["comm"], ls="-", lw=6, alpha=0.45, marker="s", ms=10, zorder=2),
    "zigzag": dict(color=COLORS["computed"], ls="--", lw=1.8, marker="o", ms=6, mfc="white", zorder=4),
}
LAYOUT_LABELS = {"contiguous": "contiguous", "zigzag": "zig-zag", "striped": "striped (the wide band)"}


def plot_layout_times(axes, Ns, times) -> None:
    """Draw notebook 03's comparison into two matplotlib axes ``(ax, bx)``: left, the ring time
    of each layout against ``N_c`` with the ideal ``N_c / 2`` (dotted); right, contiguous over
    zig-zag. ``times``: layout name -> ring times (block-times), one per value of ``Ns``. Each
    layout has its own colour, line style and marker (:data:`LAYOUT_LINES`), so lines that
    coincide (zig-zag, striped and the ideal) all stay visible."""
    ax, bx = axes
    Ns = np.asarray(Ns, dtype=float)
    unknown = sorted(set(times) - set(LAYOUT_LINES))
    if unknown or "contiguous" not in times or "zigzag" not in times:
        raise ValueError(f"times must map layouts of {sorted(LAYOUT_LINES)} (contiguous and zigzag among "
                         f"them) to ring times; got {sorted(times)}")
    series = {lay: np.asarray(ts, dtype=float) for lay, ts in times.items()}
    for lay, ts in series.items():
        if ts.shape != Ns.shape:
            raise ValueError(f"times[{lay!r}] has {ts.size} values for {Ns.size} values of Ns: give one per N_c")
    for lay in LAYOUT_LINES:
        if lay in series:
            ax.plot(Ns, series[lay], label=LAYOUT_LABELS[lay], **LAYOUT_LINES[lay])
    ax.plot(Ns, Ns / 2, color="black", ls=":", lw=1, zorder=5, label="ideal N_c/2")
    ax.set_xlabel("ranks N_c")
    ax.set_ylabel("ring time (block-times)")
    ax.set_title("causal ring attention, long blocks")
    ax.legend()
    bx.plot(Ns, series["contiguous"] / series["zigzag"], color=COLORS["computed"], marker="o")
    bx.axhline(2, color="grey", ls="--", lw=1)
    bx.set_xlabel("ranks N_c")
    bx.set_ylabel("contiguous / zigzag")
    bx.set_title("speed-up of zig-zag -> 2")
