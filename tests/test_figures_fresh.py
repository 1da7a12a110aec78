"""A fresh figure (``draw_*(fig=None)``) painted from a kept background has the pixels of the
same figure drawn whole, never a stale picture (lesson10.figures.fresh)."""
import io
import os

os.environ.setdefault("MPLBACKEND", "Agg")

import matplotlib as mpl
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from PIL import Image

from lesson10 import figures
from lesson10.figures import fresh, kit

#: figure -> parameter sets: the first two share a structure, the last has another background
SETTINGS = {
    "ring_rounds": [dict(round=1), dict(round=3, causal=True), dict(n=2, s=8, layout="zigzag", round=1)],
    "sp_strip": [dict(t=8, sp=True), dict(t=1), dict(t=2, s=4096)],
    "block_size": [dict(c=4096), dict(c=100_000, g=4, causal=True), dict(F=1e12, link="NVLink")],
    "ulysses_grid": [dict(), dict(state="heads", rank=2), dict(n=2, s=4, heads=4, kv_heads=1)],
    "moe_capacity": [dict(skew=3.0), dict(skew=3.0, capacity_factor=1.0), dict(E=4, Ne=2, T=16)],
}


def pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGBA"), dtype=int)


def whole(fig, **savefig) -> np.ndarray:
    """``fig`` saved with the kept backgrounds off: drawn whole."""
    fresh.ENABLED = False
    try:
        buf = io.BytesIO()
        fig.savefig(buf, **{"format": "png", "dpi": kit.DPI, **savefig})
        return pixels(buf.getvalue())
    finally:
        fresh.ENABLED = True


@pytest.fixture
def draws(monkeypatch):
    """The full draws of fresh canvases from here on (a painted fresh figure makes none)."""
    monkeypatch.setattr(fresh, "BACKGROUNDS", type(fresh.BACKGROUNDS)())
    count: list = []
    real = FigureCanvasAgg.draw                      # savefig calls it by its class
    monkeypatch.setattr(FigureCanvasAgg, "draw", lambda self, *a, **k: (count.append(1), real(self, *a, **k))[1])
    return count


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_a_painted_fresh_figure_is_the_figure_drawn_whole(name, draws):
    draw = getattr(figures, f"draw_{name}")
    seen = {}
    for params in SETTINGS[name]:
        kit.png(draw(**params))                                 # keeps the background of its structure
        before = len(draws)
        fig = draw(**params)
        painted = pixels(kit.png(fig))
        assert len(draws) == before, params                     # pasted, not drawn
        assert np.array_equal(painted, whole(draw(**params))), params   # exactly a full draw's pixels
        if not seen:
            # matplotlib's own canvas differs only where a text is pasted from the text cache
            # (one more rounding of its anti-aliased edge: at most 2 of 255, on a few pixels)
            plain = FigureCanvasAgg(draw(**params))
            plain.figure.set_dpi(kit.DPI)
            plain.draw()
            diff = np.abs(painted - np.asarray(plain.buffer_rgba(), dtype=int))
            assert diff.max() <= 2 and (diff > 0).any(axis=-1).mean() < 0.001, params
        seen[repr(params)] = painted
    first, same_structure, other = seen.values()
    assert not np.array_equal(first, same_structure)        # a dynamic change shows
    assert first.shape != other.shape or not np.array_equal(first, other)   # so does another background
    assert len(fresh.BACKGROUNDS) == 2                      # one per structure


def test_fresh_figures_are_new_objects_and_kit_render_paints_them_too(draws):
    a, b = figures.draw_ring_rounds(round=1), figures.draw_ring_rounds(round=1)
    assert a is not b and not set(map(id, a.axes)) & set(map(id, b.axes))
    c = figures.draw_ring_rounds(round=2)
    assert c is not a and c.axes[0].images[0] is not a.axes[0].images[0]
    kit.render(a)                                           # fig.dpi (100), the view's encoder
    count = len(draws)
    assert np.array_equal(pixels(kit.render(b)), pixels(kit.render(a)))
    assert len(draws) == count


def _tick(f):
    f.axes[0].xaxis.get_major_ticks()[3].tick1line.set_markersize(20)   # nor do its ticks


@pytest.mark.parametrize("change,made_background", [
    (lambda f: f.suptitle("mine"), False),
    (lambda f: f.axes[0].set_xlim(0, 3), False),
    (lambda f: f.axes[0].xaxis.label.set_color("red"), False),   # an Axis' label does not tell the figure
    (lambda f: f.axes[0].xaxis.label.set_color("red"), True),
    (_tick, False),                                               # ticks made after: new, so stale
    (_tick, True),                                                # every tick made by the full draw
    (lambda f: f.axes[1].get_legend().get_texts()[0].set_text("mine"), False),
    (lambda f: f.set_facecolor("yellow"), True),
])
def test_a_changed_fresh_figure_is_drawn_whole(change, made_background, draws):
    if not made_background:
        kit.png(figures.draw_ring_rounds(round=1))
    fig = figures.draw_ring_rounds(round=1)
    untouched = pixels(kit.png(fig))                 # made the background (every tick made) or pasted it
    change(fig)
    count = len(draws)
    got = pixels(kit.png(fig))
    assert len(draws) > count and np.array_equal(got, whole(fig))
    assert not np.array_equal(got, untouched)


@pytest.mark.parametrize("savefig", [dict(bbox_inches="tight"), dict(transparent=True), dict(facecolor="yellow"),
                                     dict(dpi=50)])   # at 50 dpi painting is not exact: drawn whole
def test_a_savefig_asking_for_another_picture_gets_it(savefig, draws):
    kit.png(figures.draw_block_size(c=4096))
    buf = io.BytesIO()
    fig = figures.draw_block_size(c=4096)
    fig.savefig(buf, format="png", **{"dpi": kit.DPI, **savefig})
    assert np.array_equal(pixels(buf.getvalue()), whole(figures.draw_block_size(c=4096), **savefig))


def test_other_rcparams_or_a_figure_moved_elsewhere_get_no_kept_background(draws):
    kit.png(figures.draw_sp_strip(t=4))
    with mpl.rc_context({"font.size": 14, "axes.edgecolor": "red"}):    # built and saved under other rcParams
        fig = figures.draw_sp_strip(t=4)
        count = len(draws)
        assert np.array_equal(pixels(kit.png(fig)), whole(figures.draw_sp_strip(t=4)))
        assert len(draws) > count
    with mpl.rc_context({"font.size": 14}):                            # built under others, saved under ours
        fig = figures.draw_sp_strip(t=4)
    assert np.array_equal(pixels(kit.png(fig)), whole(fig))
    # a fresh figure given back to its draw function with another structure is no longer fresh
    fig = figures.draw_ring_rounds(round=1)
    moved = figures.draw_ring_rounds(fig, n=8, s=32, round=2)
    assert moved is fig and not fresh.untouched(fig)
    assert np.array_equal(pixels(kit.png(fig)), whole(figures.draw_ring_rounds(n=8, s=32, round=2)))


def test_the_kept_backgrounds_are_bounded(draws, monkeypatch):
    monkeypatch.setattr(fresh, "LIMIT", 2)
    for c in (None, 1e-3):                                  # two y ranges: two structures
        kit.png(figures.draw_block_size(c=4096, F=c and c * 1e12))
    kit.png(figures.draw_sp_strip())
    assert len(fresh.BACKGROUNDS) == 2 and {k[0] for k in fresh.BACKGROUNDS} == {"block_size", "sp_strip"}
