"""The five figures draw headless, show what the closed forms / layouts say, and their widgets work."""
import os

os.environ.setdefault("MPLBACKEND", "Agg")

import numpy as np
import pytest
from matplotlib.colors import to_rgba

from lesson10 import cost, figures, layouts
from lesson10.figures import COLORS, kit


def _patches_of(ax, color):
    want = to_rgba(COLORS[color])
    return [p for p in ax.patches if p.get_visible() and p.get_fill() and np.allclose(p.get_facecolor(), want)]


# ---------------------------------------------------------------- 1. ring rounds
@pytest.mark.parametrize("layout,n,s,rnd", [("contiguous", 4, 8, 1), ("zigzag", 4, 16, 2), ("striped", 3, 9, 0)])
def test_ring_rounds_bars_are_causal_work(layout, n, s, rnd):
    fig = figures.draw_ring_rounds(n=n, s=s, layout=layout, round=rnd)
    grid, bars = fig.axes
    work = layouts.causal_work(n, layout, s=s)
    heights = [p.get_height() for p in bars.containers[0]]
    idle = [p.get_height() for p in bars.containers[1]]
    np.testing.assert_array_equal(heights, work[rnd])
    np.testing.assert_array_equal(idle, work[rnd].max() - work[rnd])
    cells = np.asarray(grid.images[0].get_array())
    assert cells.shape == (s, s)
    assert (cells == 3).sum() == work[rnd].sum()            # blue: computed this round
    assert (cells == 2).sum() == work[:rnd].sum()           # faint blue: earlier rounds
    assert (cells == 0).sum() == s * (s - 1) // 2           # grey: masked, key > query


def test_ring_rounds_zigzag_has_no_idle_time():
    for rnd in range(4):
        fig = figures.draw_ring_rounds(n=4, s=8, layout="zigzag", round=rnd)
        assert all(p.get_height() == 0 for p in fig.axes[1].containers[1])
    fig = figures.draw_ring_rounds(n=4, s=8, layout="contiguous", round=1)
    assert sum(p.get_height() for p in fig.axes[1].containers[1]) > 0


def test_ring_rounds_rejects_bad_round_and_layout():
    with pytest.raises(ValueError):
        figures.draw_ring_rounds(n=4, s=8, round=4)
    with pytest.raises(ValueError, match="multiple of 8"):
        figures.draw_ring_rounds(n=4, s=12, layout="zigzag")


# ---------------------------------------------------------------- 2. SP strip
@pytest.mark.parametrize("t", [2, 4, 8])
def test_sp_strip_turns_violet_into_magenta_and_keeps_bytes(t):
    tp = figures.draw_sp_strip(t=t, sp=False)
    sp = figures.draw_sp_strip(t=t, sp=True)
    ax_tp, ax_sp = tp.axes[0], sp.axes[0]
    # 6 replicated regions (2 LN inputs, 2 LN outputs, 2 dropout masks)
    assert len(_patches_of(ax_tp, "replicated")) == 6 and len(_patches_of(ax_tp, "split")) == 0
    assert len(_patches_of(ax_sp, "replicated")) == 0 and len(_patches_of(ax_sp, "split")) == 6
    # each magenta shard is 1/t of the tokens
    assert all(p.get_height() == pytest.approx(1 / t) for p in _patches_of(ax_sp, "split"))
    labels_tp = [x.get_text() for x in ax_tp.texts]
    labels_sp = [x.get_text() for x in ax_sp.texts]
    assert labels_tp.count("AR") == 2 and "RS" not in labels_tp
    assert labels_sp.count("RS") == 2 and labels_sp.count("AG") == 2 and "AR" not in labels_sp
    expected = cost.comm_bytes("sp", 8192, 4096, t)
    assert tp.sp_strip_bytes == pytest.approx(expected)
    assert sp.sp_strip_bytes == pytest.approx(expected)


# ---------------------------------------------------------------- 3. block size
@pytest.mark.parametrize("link,g,causal", [("InfiniBand", 1, False), ("NVLink", 4, True)])
def test_block_size_lines_cross_at_c_star(link, g, causal):
    fig = figures.draw_block_size(h=4096, link=link, g=g, causal=causal)
    c_star = cost.min_block_size("H100", link, causal=causal, g=g)
    assert fig.c_star == pytest.approx(c_star)
    ax = fig.axes[0]
    compute, transfer = ax.lines[0], ax.lines[1]
    c = compute.get_xdata()
    F, W = cost.HARDWARE["H100"]["flops"], cost.HARDWARE[link]["bandwidth"]
    np.testing.assert_allclose(compute.get_ydata(), (2 if causal else 4) * c**2 * 4096 / F * 1e3)
    np.testing.assert_allclose(transfer.get_ydata(), 4 * c * 4096 / (g * W) * 1e3)
    diff = compute.get_ydata() - transfer.get_ydata()
    cross = np.nonzero(np.diff(np.sign(diff)))[0]
    assert len(cross) == 1 and c[cross[0]] <= c_star <= c[cross[0] + 1]
    vline = ax.lines[2]
    assert vline.get_xdata()[0] == pytest.approx(c_star)


def test_block_size_c_star_does_not_move_with_h():
    assert figures.draw_block_size(h=1024).c_star == figures.draw_block_size(h=16384).c_star
    title = figures.draw_block_size(c=16_384).axes[0].get_title()
    assert "exposed" in title                  # 16,384 < 19,780 over InfiniBand
    assert "hidden" in figures.draw_block_size(c=16_384, g=4).axes[0].get_title()


# ---------------------------------------------------------------- 4. Ulysses grid
def _cell_labels(ax, s, heads):
    labels = np.full((s, heads), -1)
    (cells,) = [a for a in ax.artists if isinstance(a, kit.Labels)]     # one artist for all cells
    for (x, y), text in cells.items():
        labels[int(y), int(x)] = int(text)
    return labels


def _kv_colours(ax):
    """The facecolour of each K/V head's box in the strip (one collection)."""
    (boxes,) = ax.collections
    return [to_rgba(c) for c in boxes.get_facecolor()]


@pytest.mark.parametrize("n,s,heads", [(4, 8, 8), (2, 4, 6)])
def test_ulysses_grid_owners_before_and_after(n, s, heads):
    seq = figures.draw_ulysses_grid(n=n, s=s, heads=heads, kv_heads=heads, state="sequence")
    hd = figures.draw_ulysses_grid(n=n, s=s, heads=heads, kv_heads=heads, state="heads", rank=1)
    tok, head = np.meshgrid(np.arange(s), np.arange(heads), indexing="ij")
    np.testing.assert_array_equal(_cell_labels(seq.axes[0], s, heads), tok // (s // n))
    np.testing.assert_array_equal(_cell_labels(hd.axes[0], s, heads), head // (heads // n))
    # each rank keeps 1 of n blocks: (n-1)/n of the cells arrived over the network
    cells, arrived = hd.axes[0].collections
    assert arrived.get_visible() and len(arrived.get_paths()) == s * heads * (n - 1) // n
    assert not seq.axes[0].collections[1].get_visible()                 # nothing arrived yet
    split = np.all(np.isclose(cells.get_facecolor(), to_rgba(COLORS["split"])), axis=1)
    assert split.sum() == s * heads // n                                # rank 1's cells
    np.testing.assert_array_equal(split.reshape(s, heads), head // (heads // n) == 1)
    assert seq.ulysses_warning == "" and hd.ulysses_warning == ""


def test_ulysses_grid_warns_when_kv_heads_below_ranks():
    fig = figures.draw_ulysses_grid(n=4, s=8, heads=8, kv_heads=2)
    assert "2 K/V heads" in fig.ulysses_warning and "ring attention" in fig.ulysses_warning
    assert _kv_colours(fig.axes[1]) == [to_rgba(COLORS["replicated"])] * 2   # both K/V heads are copied
    with pytest.raises(ValueError):
        figures.draw_ulysses_grid(n=3, s=6, heads=8, kv_heads=8)


# ---------------------------------------------------------------- 5. MoE capacity
def _fcfs_keep(experts, E, capacity):
    """Independent first-come-first-served count, one copy at a time."""
    seen = np.zeros(E, dtype=int)
    keep = np.zeros(experts.shape, dtype=bool)
    for t in range(experts.shape[0]):
        for j in range(experts.shape[1]):
            e = experts[t, j]
            keep[t, j] = capacity is None or seen[e] < capacity
            seen[e] += 1
    return keep


@pytest.mark.parametrize("skew,cf", [(0.0, 1.25), (3.0, 1.0), (3.0, None)])
def test_moe_capacity_drops_and_loads(skew, cf):
    E, Ne, k, T = 8, 4, 2, 32
    fig = figures.draw_moe_capacity(E=E, Ne=Ne, k=k, T=T, skew=skew, capacity_factor=cf)
    r = fig.moe_routing
    N = Ne * T
    capacity = None if cf is None else int(np.ceil(cf * k * N / E))
    assert r["capacity"] == capacity
    assert r["experts"].shape == (N, k)
    assert all(len(set(row)) == k for row in r["experts"].tolist())     # k distinct experts
    keep = _fcfs_keep(r["experts"], E, capacity)
    np.testing.assert_array_equal(r["kept"], keep)
    ax, bars = fig.axes
    computed, dropped = ax.collections[0], ax.collections[1]
    assert len(computed.get_offsets()) == keep.sum()
    assert len(dropped.get_offsets()) == (~keep).sum()
    load_gpu = np.bincount(r["experts"][keep] // (E // Ne), minlength=Ne)
    np.testing.assert_array_equal([p.get_height() for p in bars.containers[0]], load_gpu)
    np.testing.assert_array_equal([p.get_height() for p in bars.containers[1]], load_gpu.max() - load_gpu)
    if cf is None:
        assert (~keep).sum() == 0
    if capacity is not None:
        assert r["load_per_expert"].max() <= capacity


def test_moe_skew_model_matches_simulator():
    from lesson10.sim import simulate_moe

    r = figures.moe_routing(E=8, Ne=4, k=2, T=16, skew=2.0, seed=5)
    stats = simulate_moe(64, 8, 2, 4, skew=2.0, seed=5)
    np.testing.assert_array_equal(r["popularity"], stats.popularity)
    # one skew model (sim.skewed_routing): the same seed is the same sample, drops included
    for seed, cf, skew in ((5, None, 2.0), (1, 1.0, 1.5), (2, 0.75, 0.0)):
        r = figures.moe_routing(E=8, Ne=4, k=2, T=16, skew=skew, capacity_factor=cf, seed=seed)
        stats = simulate_moe(64, 8, 2, 4, capacity_factor=cf, skew=skew, seed=seed)
        np.testing.assert_array_equal(r["load_per_expert"], stats.load_per_expert)
        np.testing.assert_array_equal(r["load_per_gpu"], stats.load_per_gpu)
        assert r["drop_rate"] == stats.drop_rate
    # a strong skew concentrates copies on the most popular experts
    r = figures.moe_routing(E=8, Ne=4, k=1, T=256, skew=6.0, capacity_factor=None)
    top = int(np.argmax(r["popularity"]))
    assert r["received_per_expert"][top] == r["received_per_expert"].max()


def test_moe_capacity_bad_input():
    with pytest.raises(ValueError):
        figures.draw_moe_capacity(E=8, Ne=3)
    with pytest.raises(ValueError):
        figures.draw_moe_capacity(k=9)
    with pytest.raises(ValueError):
        figures.draw_moe_capacity(capacity_factor=0)


# ---------------------------------------------------------------- widgets
def test_ring_rounds_widget_next_round_and_layout():
    box = figures.ring_rounds(n=4, s=8, layout="contiguous")
    view = box.view
    first = view.image.value
    assert first[:4] == b"\x89PNG"
    box.next_round()
    assert view.state["round"] == 1 and view.image.value != first
    box.layout_toggle.value = "zigzag"
    assert view.state["layout"] == "zigzag" and view.state["round"] == 0
    bars = view.fig.axes[1].containers[0]
    np.testing.assert_array_equal([p.get_height() for p in bars], layouts.causal_work(4, "zigzag", s=8)[0])
    for _ in range(4):
        box.next_round()
    assert view.state["round"] == 0                       # wraps around after N_c rounds


def test_widgets_report_bad_combinations_instead_of_raising():
    box = figures.ring_rounds(n=4, s=8, layout="zigzag")
    assert not box.view.update(n=3)                       # 8 tokens do not split into 6 chunks
    assert "multiple of 6" in box.view.message.value


def test_other_widgets_construct_and_respond():
    sp = figures.sp_strip(t=4)
    before = sp.view.image.value
    sp.mode_toggle.value = "TP + SP"
    assert sp.view.state["sp"] is True and sp.view.image.value != before

    bs = figures.block_size()
    assert bs.view.fig.c_star == pytest.approx(cost.min_block_size("H100", "InfiniBand"))

    ul = figures.ulysses_grid()
    ul.all_to_all()
    assert ul.view.state["state"] == "heads"
    ul.kv_dropdown.value = 2
    assert ul.view.fig.ulysses_warning

    moe = figures.moe_capacity(T=16)
    moe.cf_dropdown.value = "none"
    assert moe.view.fig.moe_routing["drop_rate"] == 0


# ---------------------------------------------------------------- review fixes (issue 9)
def _legend_labels(ax):
    legend = ax.get_legend()
    assert legend is not None, f"no legend on {ax.get_title()!r}"
    return [t.get_text() for t in legend.get_texts()]


def _overlapping(labels, renderer):
    boxes = [lab.get_window_extent(renderer) for lab in labels if lab.get_visible() and lab.get_text()]
    return [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a.overlaps(b)]


@pytest.mark.parametrize("n,s", [(4, 16), (8, 64), (8, 32), (2, 64)])
def test_ring_rounds_tick_labels_never_overlap(n, s):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    fig = figures.draw_ring_rounds(n=n, s=s, layout="zigzag", round=1)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    for ax in fig.axes:
        for labels in (ax.get_xticklabels(), ax.get_yticklabels()):
            assert _overlapping(labels, renderer) == [], (n, s, [lab.get_text() for lab in labels])
            assert all(lab.get_fontsize() >= 6.5 for lab in labels)          # readable


def test_ring_rounds_score_matrix_has_a_colour_legend():
    fig = figures.draw_ring_rounds(n=4, s=16, round=1)
    labels = _legend_labels(fig.axes[0])
    assert len(labels) == 4
    assert any("later round" in lab for lab in labels) and any("masked" in lab for lab in labels)
    colours = [to_rgba(h.get_facecolor()) for h in fig.axes[0].get_legend().legend_handles]
    assert colours == [to_rgba(COLORS[c]) for c in ("computed", "earlier", "empty", "masked")]


def test_sp_strip_at_one_gpu_has_no_copies_and_no_collectives():
    fig = figures.draw_sp_strip(t=1)
    ax = fig.axes[0]
    assert _patches_of(ax, "replicated") == [] and _patches_of(ax, "comm") == []
    assert len(_patches_of(ax, "computed")) == 8                   # every region, whole
    assert not {"AR", "RS", "AG"} & {x.get_text() for x in ax.texts}
    assert fig.sp_strip_bytes == 0 and "one GPU" in ax.get_title()
    assert "one GPU" in _legend_labels(ax)[0]


@pytest.mark.parametrize("sp,colour,word", [(False, "replicated", "replicated"), (True, "split", "tokens")])
def test_sp_strip_legend_names_each_colour_drawn(sp, colour, word):
    ax = figures.draw_sp_strip(t=4, sp=sp).axes[0]
    legend = ax.get_legend()
    labels = _legend_labels(ax)
    colours = [to_rgba(h.get_facecolor()) for h in legend.legend_handles]
    assert to_rgba(COLORS[colour]) in colours and word in labels[colours.index(to_rgba(COLORS[colour]))]
    assert {to_rgba(COLORS[c]) for c in ("computed", "comm")} <= set(colours)


def test_block_size_title_keeps_the_setting_when_c_is_set():
    title = figures.draw_block_size(c=16_384, link="NVLink", g=4, causal=True, F=500e12).axes[0].get_title()
    for part in ("NVLink", "g = 4", "causal", "F = 500 TFLOP/s", "c = 16,384"):
        assert part in title, (part, title)
    assert "no mask" in figures.draw_block_size(c=4096).axes[0].get_title()


def test_block_size_achieved_F_control_gives_the_quick_check_answer():
    # the lesson's quick check: causal, zig-zag, g = 4, InfiniBand 50 GB/s, F = 500 TFLOP/s
    # -> c >= F/W * 2 / g = 1e4 * 2 / 4 = 5,000 tokens
    fig = figures.draw_block_size(link="InfiniBand", g=4, causal=True, F=500e12)
    assert fig.c_star == pytest.approx(5000)
    assert "c* = 5,000" in [t.get_text().strip() for t in fig.axes[0].texts]
    box = figures.block_size()
    box.g_dropdown.value = 4
    box.causal_box.value = True
    before = box.view.image.value
    box.f_slider.value = 500
    assert box.view.fig.c_star == pytest.approx(5000) and box.view.image.value != before
    for bad in (-1.0, 0, float("nan")):
        with pytest.raises(ValueError, match="flops"):
            figures.draw_block_size(F=bad)


def test_ulysses_grid_explains_its_colours():
    fig = figures.draw_ulysses_grid(n=4, s=8, heads=8, kv_heads=2, state="heads", rank=1)
    grid, kv = fig.axes
    assert any("rank 1" in lab for lab in _legend_labels(grid))
    assert any("arrived" in lab for lab in _legend_labels(grid))
    kv_legend = kv.get_legend()
    pairs = dict(zip([to_rgba(h.get_facecolor()) for h in kv_legend.legend_handles], _legend_labels(kv)))
    assert "several ranks" in pairs[to_rgba(COLORS["replicated"])]
    assert "one rank" in pairs[to_rgba(COLORS["earlier"])]
    seq = figures.draw_ulysses_grid(n=4, s=8, heads=8, kv_heads=8)           # nothing arrived yet
    assert not any("arrived" in lab for lab in _legend_labels(seq.axes[0]))


@pytest.mark.parametrize("cf,skew", [(1.1, 1.0), (1.25, 2.0), (1.0, 3.0), (1.5, 0.0)])
def test_moe_capacity_line_separates_kept_from_dropped(cf, skew):
    fig = figures.draw_moe_capacity(T=64, capacity_factor=cf, skew=skew)
    C = fig.moe_routing["capacity"]
    assert int(np.ceil(cf * 2 * 256 / 8)) == C                     # CF = 1.1: C = 71, not a multiple of 4
    ax = fig.axes[0]
    line = [ln for ln in ax.lines if ln.get_linestyle() == "--"][0]
    y_line = line.get_ydata()[0]
    assert y_line == C - 0.5
    kept_y = ax.collections[0].get_offsets()[:, 1]
    dropped_y = ax.collections[1].get_offsets()[:, 1]
    assert kept_y.max() < y_line
    if len(dropped_y):
        assert dropped_y.min() > y_line
    assert len(kept_y) + len(dropped_y) == 2 * 256


def test_moe_capacity_axes_are_labelled_with_integer_ticks():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    fig = figures.draw_moe_capacity(T=64, capacity_factor=1.1, skew=1.0)
    FigureCanvasAgg(fig).draw()
    top, bottom = fig.axes
    assert "(/" not in top.get_ylabel() and top.get_ylabel()
    assert bottom.get_ylabel()
    for ax in (top, bottom):
        ticks = ax.get_yticks()
        assert np.all(ticks == np.round(ticks)), ticks
        for label in ax.get_yticklabels():
            if label.get_text():
                int(label.get_text().replace("\u2212", "-"))        # "71", never "17.5"


def test_moe_capacity_dropdown_none_shows_its_label():
    box = figures.moe_capacity(T=16)
    cf = box.cf_dropdown
    cf.value = "none"
    assert cf.label == "none" and cf.index == 0
    assert box.view.state["capacity_factor"] is None and box.view.fig.moe_routing["capacity"] is None
    cf.value = "1.1"
    assert box.view.fig.moe_routing["capacity"] == int(np.ceil(1.1 * 2 * 64 / 8))
    none_box = figures.moe_capacity(T=16, capacity_factor=None)
    assert none_box.cf_dropdown.label == "none" and none_box.view.fig.moe_routing["capacity"] is None
    odd = figures.moe_capacity(T=16, capacity_factor=1.75)
    assert odd.cf_dropdown.value == "1.75" and odd.view.fig.moe_routing["capacity"] == int(np.ceil(1.75 * 16))


def test_figures_use_only_widgets_and_arguments_of_ipywidgets_7():
    """Colab renders ipywidgets 7.7.1 only: every widget class and keyword the figures use exists there."""
    import inspect
    import re as _re

    from lesson10.figures import kit as figure_kit
    source = inspect.getsource(figures) + inspect.getsource(figure_kit)
    used = set(_re.findall(r"\bw\.([A-Z][A-Za-z]+)\(", source))
    ipywidgets_7_7_core = {"VBox", "HBox", "Image", "HTML", "Button", "ToggleButtons", "IntSlider",
                           "FloatSlider", "Dropdown", "Checkbox", "FloatLogSlider", "SelectionSlider"}
    assert used and used <= ipywidgets_7_7_core, used - ipywidgets_7_7_core
    kwargs = set(_re.findall(r"\bw\.[A-Z][A-Za-z]+\((?:[^()]|\([^()]*\))*?\b([a-z_]+)=", source))
    assert kwargs <= {"value", "min", "max", "step", "description", "options", "format", "button_style",
                      "style", "base", "readout_format"}, kwargs
    assert "continuous_update" in source                 # sliders redraw on release


# ---------------------------------------------------------------- issue 16: figures that follow the hand
def test_sliders_redraw_on_release_and_c_is_logarithmic():
    bs = figures.block_size()
    c = next(ch for ch in bs.children[0].children[0].children if getattr(ch, "description", "") == "block c")
    assert type(c).__name__ == "FloatLogSlider" and c.continuous_update is False
    assert 2 ** c.min == 512 and 2 ** c.max == 131_072
    c.value = 2 ** 15
    assert bs.view.state["c"] == 32_768
    for box in (figures.ring_rounds(), figures.sp_strip(), figures.moe_capacity(T=16), figures.ulysses_grid()):
        sliders = [w for w in _walk(box) if "Slider" in type(w).__name__]
        assert sliders and all(w.continuous_update is False for w in sliders), type(box)


def _walk(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from _walk(child)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
def test_ring_rounds_offers_only_valid_token_counts(layout):
    box = figures.ring_rounds(n=4, s=16, layout=layout)
    for n in (3, 5, 8, 2):
        box.ranks_slider.value = n
        step = 2 * n if layout == "zigzag" else n
        assert all(s % step == 0 for s in box.tokens_slider.options), (n, box.tokens_slider.options)
        assert box.view.state["s"] == box.tokens_slider.value and box.view.state["n"] == n
        assert box.view.message.value == ""                 # every offered pair draws
    box.layout_toggle.value = "zigzag" if layout != "zigzag" else "contiguous"
    assert box.view.message.value == ""


def test_a_bad_combination_blanks_the_picture():
    box = figures.ring_rounds(n=4, s=8, layout="zigzag")
    assert not box.view.update(n=3)
    assert len(box.view.image.value) < 100                 # no picture whose title says otherwise


def test_ulysses_warning_says_one_rank():
    fig = figures.draw_ulysses_grid(n=4, s=8, heads=8, kv_heads=1)
    assert "scales to 1 rank;" in fig.ulysses_warning


# ---------------------------------------------------------------- issue 25: valid values, quick redraws
def _options(control):
    """Every value a control offers: its options, or every step of a slider."""
    if hasattr(control, "options"):
        return [o[1] if isinstance(o, tuple) else o for o in control.options]
    if type(control).__name__ == "Checkbox":
        return [False, True]
    if type(control).__name__ == "FloatLogSlider":
        steps = int(round((control.max - control.min) / control.step))
        return [control.base ** (control.min + i * control.step) for i in range(steps + 1)]
    steps = int(round((control.max - control.min) / control.step))
    return [control.min + i * control.step for i in range(steps + 1)]


def _controls(box):
    return [w for w in _walk(box) if hasattr(w, "value") and type(w).__name__ not in ("Image", "HTML")]


def _sweep(box):
    """Move each control of ``box`` through every value it offers (the others as they are; a
    slider of many steps: 40 of them, evenly spread, and both ends): each one must draw (no
    message, a real PNG)."""
    moved = 0
    for control in _controls(box):
        start = control.value
        values = _options(control)
        for value in values[::max(1, len(values) // 40)] + values[-1:]:
            control.value = value
            assert box.view.message.value == "", (control.description, value, box.view.message.value)
            assert len(box.view.image.value) > 1000, (control.description, value)
            moved += 1
        control.value = start
    return moved


def test_sp_strip_offers_only_degrees_that_split_the_layer():
    box = figures.sp_strip()
    degrees = list(box.degree_slider.options)
    assert degrees == [t for t in range(1, 33) if 8192 % t == 0 and 32 % t == 0 and 4096 % t == 0]
    assert 13 not in degrees and 3 not in degrees and 16 in degrees
    for mode in ("TP", "TP + SP"):
        box.mode_toggle.value = mode
        for t in degrees:
            box.degree_slider.value = t
            assert box.view.message.value == "" and box.view.state["t"] == t
            assert box.view.fig.sp_strip_bytes == pytest.approx(cost.comm_bytes("sp", 8192, 4096, t))
    with pytest.raises(ValueError, match="does not split"):
        figures.draw_sp_strip(t=13)
    with pytest.raises(ValueError, match=r"\[1, 2, 4, 8, 16, 32\]"):
        figures.sp_strip(t=3)


@pytest.mark.parametrize("make", [figures.sp_strip, figures.block_size, figures.moe_capacity, figures.ulysses_grid,
                                  lambda: figures.ulysses_grid(n=2, s=4, heads=6, kv_heads=6)])
def test_every_value_of_every_control_draws(make):
    box = make()
    assert _sweep(box) >= 4


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
def test_ring_rounds_every_offered_pair_is_a_valid_layout(layout):
    from lesson10.figures.data import owners
    box = figures.ring_rounds(n=4, s=16, layout=layout)
    for n in _options(box.ranks_slider):
        box.ranks_slider.value = n
        offered = list(box.tokens_slider.options)
        for s in offered:                                   # each shards every token exactly once
            assert sorted(np.bincount(owners(s, n, layout), minlength=n)) == [s // n] * n
        if n not in (2, 5, 8):
            continue
        for s in (offered[0], offered[-1]):                 # the extremes draw, every round
            box.tokens_slider.value = s
            for _ in range(n):
                box.next_round()
                assert box.view.message.value == "", (n, s, box.view.message.value)


def _counts(fig):
    return [(len(ax.patches), len(ax.texts), len(ax.lines), len(ax.images), len(ax.collections)) for ax in fig.axes]


@pytest.mark.parametrize("make,first,then", [
    (lambda: figures.ring_rounds(n=4, s=16), lambda b: b.next_round(), lambda b: b.next_round()),
    (figures.sp_strip, lambda b: setattr(b.degree_slider, "value", 8),
     lambda b: setattr(b.mode_toggle, "value", "TP + SP")),
    (figures.block_size, lambda b: setattr(b.c_slider, "value", 2 ** 12),
     lambda b: setattr(b.c_slider, "value", 2 ** 15.5)),
    (figures.ulysses_grid, lambda b: b.all_to_all(), lambda b: b.all_to_all()),
    (figures.moe_capacity, lambda b: setattr(b.cf_dropdown, "value", "1.0"),
     lambda b: setattr(b.cf_dropdown, "value", "1.1")),
])
def test_a_redraw_updates_the_kept_figure_instead_of_rebuilding(make, first, then, monkeypatch):
    box = make()
    view = box.view
    first(box)
    fig, axes, counts, before = view.fig, list(view.fig.axes), _counts(view.fig), view.image.value
    key, background = view.structure(**view.state), fig.lesson10_parts.background
    full_draws = []
    monkeypatch.setattr(fig.canvas, "draw", lambda *a, **k: full_draws.append(1))
    then(box)
    assert view.structure(**view.state) == key                   # the move leaves the structure alone
    assert view.fig is fig and list(fig.axes) == axes           # same Figure, same Axes
    assert _counts(fig) == counts                               # no artist added or left behind
    assert fig.lesson10_parts.background is background and full_draws == []   # only the changes painted
    assert view.image.value != before and view.message.value == ""


def test_the_quick_redraw_shows_what_a_full_draw_shows():
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from PIL import Image

    def pixels(png):
        return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=int)

    def skew_up(box):
        box.skew_slider.value += 1.5

    moves = [(figures.ring_rounds(n=4, s=16), lambda box: box.next_round()),
             (figures.ulysses_grid(), lambda box: box.all_to_all()), (figures.moe_capacity(T=16), skew_up)]
    for box, move in moves:
        move(box)
        move(box)
        quick = pixels(box.view.image.value)
        canvas = FigureCanvasAgg(box.view.fig)                   # the same figure drawn whole
        canvas.draw()
        whole = np.asarray(canvas.buffer_rgba())[..., :3].astype(int)
        assert quick.shape == whole.shape
        assert np.abs(quick - whole).max() <= 8, type(box.view.draw)


def test_moe_moves_its_axes_to_a_new_y_range_and_keeps_the_old_picture(monkeypatch):
    box = figures.moe_capacity()
    view = box.view
    fig, axes, key = view.fig, list(view.fig.axes), view.structure(**view.state)
    top = fig.axes[0].get_ylim()[1]
    box.skew_slider.value = 6.0                                 # another structure: a taller queue axis
    assert view.structure(**view.state) != key
    assert view.fig is fig and list(fig.axes) == axes and fig.axes[0].get_ylim()[1] > top
    draws = []
    real = type(fig.canvas).draw
    monkeypatch.setattr(type(fig.canvas), "draw", lambda self, *a, **k: (draws.append(1), real(self, *a, **k)))
    box.skew_slider.value = 0.0
    assert fig.axes[0].get_ylim()[1] == top and draws == []    # the kept picture: no full draw
    assert view.message.value == ""
    # other sizes (E, Ne, k, T) are new axes
    again = figures.draw_moe_capacity(fig, E=4, Ne=2, T=16)
    assert again is fig and [t.get_text() for t in fig.axes[1].get_xticklabels()] == ["GPU 0", "GPU 1"]


def test_ring_and_ulysses_move_their_axes_to_a_new_structure(monkeypatch):
    # one figure: another (n, s, layout) moves the axes, and a structure seen before comes
    # back with its kept picture (no full draw)
    box = figures.ring_rounds(n=4, s=16, layout="contiguous")
    view = box.view
    fig, axes = view.fig, list(view.fig.axes)
    box.layout_toggle.value = "zigzag"
    assert view.fig is fig and list(fig.axes) == axes and fig.lesson10_parts.key[:3] == (4, 16, "zigzag")
    draws = []
    real = type(fig.canvas).draw
    monkeypatch.setattr(type(fig.canvas), "draw", lambda self, *a, **k: (draws.append(1), real(self, *a, **k)))
    box.layout_toggle.value = "contiguous"
    assert draws == [] and view.message.value == ""
    # a draw function given a figure of another structure moves it there, bars and all
    fig = figures.draw_ring_rounds(n=4, s=16, layout="zigzag", round=1)
    again = figures.draw_ring_rounds(fig, n=8, s=32, layout="zigzag", round=2)
    assert again is fig and len(fig.axes) == 2
    work = layouts.causal_work(8, "zigzag", s=32)
    np.testing.assert_array_equal([p.get_height() for p in fig.axes[1].containers[0]], work[2])
    assert len(fig.axes[1].patches) == 2 * 8
    back = figures.draw_ring_rounds(fig, n=2, s=8, layout="contiguous", round=1)   # fewer ranks: bars hidden
    shown = [p.get_height() for p in back.axes[1].containers[0] if p.get_visible()]
    np.testing.assert_array_equal(shown, layouts.causal_work(2, "contiguous", s=8)[1])
    assert [t.get_text() for t in back.axes[1].get_xticklabels()] == ["rank 0", "rank 1"]
    # the Ulysses grid: other K/V heads keep the grid's axes
    grid = figures.draw_ulysses_grid(n=4, s=8, heads=8, kv_heads=8)
    moved = figures.draw_ulysses_grid(grid, n=2, s=4, heads=6, kv_heads=3, state="heads", rank=1)
    assert moved is grid and _cell_labels(grid.axes[0], 4, 6).tolist() == [[0, 0, 0, 1, 1, 1]] * 4
    assert len(grid.axes[0].collections[0].get_paths()) == 4 * 6


def test_the_text_cache_draws_what_agg_draws_and_draws_each_text_once(monkeypatch):
    from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg
    from matplotlib.figure import Figure

    def figure():
        fig = Figure(figsize=(4, 3), dpi=90)
        ax = fig.add_subplot()
        for i in range(6):                                  # fractional positions, colours, sizes
            ax.text(0.1 + 0.137 * i, 0.2 + 0.11 * i, f"q{i} r{i % 3}", color=["k", "C1", "C2"][i % 3],
                    fontsize=6 + i, rotation=[0, 90, 30][i % 3])
        ax.set_ylabel("query token")
        ax.set_title("a title", fontsize=9)
        return fig

    plain = FigureCanvasAgg(figure())
    plain.draw()
    want = np.asarray(plain.buffer_rgba()).astype(int)
    kit.TextCacheRenderer.cache.clear()
    real, calls = RendererAgg.draw_text, []

    def counted(self, *a, **k):
        calls.append(a[3])
        return real(self, *a, **k)
    for attempt in range(2):                                # cold cache, then every text a hit
        calls.clear()
        monkeypatch.setattr(RendererAgg, "draw_text", counted)
        canvas = kit.Canvas(figure())
        canvas.draw()
        monkeypatch.undo()
        got = np.asarray(canvas.buffer_rgba()).astype(int)
        assert got.shape == want.shape and np.abs(got - want).max() <= 2, attempt
        if attempt == 0:
            assert "q3 r0" in calls and "query token" in calls
        else:
            assert calls == [], calls                       # pasted from the cache


def test_the_text_cache_cuts_no_pixel_off():
    """The text cache sizes its scratch canvas from the font's bounds (a true bound, which a
    rotated text needs: cut off, it need not reach the edge); an unrotated text reaching the
    edge is measured and drawn again. What is kept equals the text drawn with its measured
    extent, for any text, angle or font."""
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.font_manager import FontProperties

    from lesson10.figures import text as text_module
    renderer = kit.TextCacheRenderer(200, 200, 100)
    gc = renderer.new_gc()
    gc.set_foreground("k")
    for prop in (FontProperties(size=11), FontProperties(size=7, family="serif", weight="bold")):
        for s, angle in (("WWWW mmmm", 0), ("query token", 90), ("gjpqy ÅÉ", 30), ("i j", 0)):
            w, h, d = RendererAgg.get_text_width_height_descent(renderer, s, prop, False)
            exact = renderer._raster_in(gc, 0.3, 0.6, s, prop, angle, (w, h, d, 0.0), whole=False)
            assert text_module.font_extent(s, prop, 100)[0] >= w
            if angle == 0:                 # a rotated text is cut off without reaching the edge
                assert renderer._raster_in(gc, 0.3, 0.6, s, prop, 0, (2.0, 2.0, 0.5, 0.0)) is None
            got = renderer._raster(gc, 0.3, 0.6, s, prop, angle)
            assert got[:2] == exact[:2] and np.array_equal(got[2], exact[2]), (s, angle)
    assert text_module.font_extent("日本", FontProperties(size=9), 100) is None  # another font
    gc.restore()
