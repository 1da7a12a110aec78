"""Notebook 03's plot of the ring time per layout (``figures.plot_layout_times``): zig-zag and
striped are both balanced for long blocks, so their lines coincide; each layout has its own
style and both lines stay visible in the pixels."""
from __future__ import annotations

import os

os.environ.setdefault("MPLBACKEND", "Agg")

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure

from lesson10 import figures, layouts

NS = np.arange(2, 17)
TIMES = {lay: [float(layouts.ring_time(layouts.causal_work(int(n), lay))) for n in NS]
         for lay in ("contiguous", "zigzag", "striped")}


def _plot(draw):
    fig = Figure(figsize=(10, 3.5), dpi=90)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    draw(axes)
    fig.canvas.draw()
    return fig, axes


def _pixels_of(fig, ax, line) -> int:
    """How many pixels inside ``ax`` have the colour ``line`` paints (over white, with its alpha)."""
    rgba = np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(float) / 255
    x0, y0, x1, y1 = (int(v) for v in ax.get_window_extent().extents)
    h = rgba.shape[0]
    inside = rgba[h - y1:h - y0, x0:x1]
    alpha = line.get_alpha() if line.get_alpha() is not None else 1.0
    want = alpha * np.asarray(to_rgb(line.get_color())) + (1 - alpha) * np.ones(3)
    return int((np.abs(inside - want).max(axis=-1) < 0.04).sum())


def _line(ax, label_start):
    return next(li for li in ax.get_lines() if li.get_label().startswith(label_start))


def test_zigzag_and_striped_coincide_and_both_are_visible():
    assert TIMES["zigzag"] == TIMES["striped"]                      # the reason they hid each other
    fig, (ax, _) = _plot(lambda axes: figures.plot_layout_times(axes, NS, TIMES))
    for label in ("contiguous", "zig-zag", "striped"):
        line = _line(ax, label)
        assert _pixels_of(fig, ax, line) > 200, label
    assert _pixels_of(fig, ax, _line(ax, "ideal")) > 50


def test_the_pixel_count_sees_a_line_hidden_under_another():
    """The notebook's former plot: both "o-", striped drawn after zig-zag, hides zig-zag."""
    def former(axes):
        for lay, ts in TIMES.items():
            axes[0].plot(NS, ts, "o-", label=lay)
    fig, (ax, _) = _plot(former)
    assert _pixels_of(fig, ax, _line(ax, "striped")) > 200
    assert _pixels_of(fig, ax, _line(ax, "zigzag")) == 0


def test_each_layout_has_its_own_style_and_the_data():
    fig, (ax, bx) = _plot(lambda axes: figures.plot_layout_times(axes, NS, TIMES))
    styles = {lay: (_line(ax, label).get_color(), _line(ax, label).get_linestyle(), _line(ax, label).get_marker())
              for lay, label in (("contiguous", "contiguous"), ("zigzag", "zig-zag"), ("striped", "striped"))}
    assert len(set(styles.values())) == 3
    assert len({s[1] for s in styles.values()}) >= 2 and styles["zigzag"][2] != styles["striped"][2]
    assert _line(ax, "zig-zag").get_zorder() > _line(ax, "striped").get_zorder()
    for lay, label in (("contiguous", "contiguous"), ("zigzag", "zig-zag"), ("striped", "striped")):
        np.testing.assert_array_equal(_line(ax, label).get_ydata(), TIMES[lay])
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(legend) == 4 and any("zig-zag" in t for t in legend) and any("striped" in t for t in legend)
    np.testing.assert_allclose(bx.get_lines()[0].get_ydata(), np.divide(TIMES["contiguous"], TIMES["zigzag"]))


def test_bad_times_are_refused_with_what_to_give():
    fig = Figure()
    axes = fig.subplots(1, 2)
    with pytest.raises(ValueError, match="contiguous and zigzag"):
        figures.plot_layout_times(axes, NS, {"contiguous": TIMES["contiguous"]})
    with pytest.raises(ValueError, match="one per N_c"):
        figures.plot_layout_times(axes, NS, {**TIMES, "zigzag": TIMES["zigzag"][:-1]})
    with pytest.raises(ValueError, match="layouts of"):
        figures.plot_layout_times(axes, NS, {**TIMES, "diagonal": TIMES["zigzag"]})
