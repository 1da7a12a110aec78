"""Fresh figures, drawn fast: what a new figure from ``draw_*(fig=None)`` costs to show.

A fresh figure of a structure looks like every other fresh figure of that structure except
for its dynamic artists (:class:`lesson10.figures.kit.Parts`). The first one's picture
without them (the background: axes, ticks, labels, fixed legends) is kept here, keyed by
(figure, structure, pixel size, dpi, rcParams); a later fresh figure pastes it and draws only
its dynamic artists, in the order a full draw draws them. The first fresh figure of a key is
drawn whole and painted as well, and the background is kept only if both give the same pixels
(else that key is always drawn whole): a painted figure's pixels are a full draw's.
Its canvas (:class:`FreshCanvas`) does so for ``savefig`` to PNG too, so ``kit.png`` and a
plain ``fig.savefig(buf, format="png")`` are quick.

Never stale: a figure counts as fresh from the moment its draw function returns it (then
``fig.stale`` is False) until anything changes it: matplotlib marks the figure stale, and the
few artists that do not tell it (an Axis' label, offset text and ticks) are checked one by
one. A savefig that asks for another picture (``bbox_inches``, a face or edge colour,
``transparent=True``, another backend) draws the figure whole, as does any figure changed
after its draw function returned it.
"""
from __future__ import annotations

from collections import OrderedDict

import matplotlib as mpl

from .text import Canvas

__all__ = ["ENABLED", "LIMIT", "BACKGROUNDS", "FreshCanvas", "finish", "untouched", "paint", "draw_without"]

#: False: every fresh figure is drawn whole (the benchmark's "before" column)
ENABLED = True

#: how many backgrounds are kept; each is ``4 * width * height`` bytes (1.7 MB for 9 x 4.8
#: inches at 100 dpi), so at most ~30 MB
LIMIT = 16

#: (figure, structure, width, height, dpi, rcParams) -> the background (an Agg BufferRegion),
#: or None where painting over it would not give the pixels of a full draw
BACKGROUNDS: OrderedDict = OrderedDict()


def _rc() -> str:
    """rcParams as one string: a background is only used under the rcParams it was made with."""
    return repr(list(dict.items(mpl.rcParams)))


def _quiet(fig) -> list:
    """The artists of ``fig`` that do not mark the figure stale when they change: an Axis'
    label, offset text and the parts of the ticks it made so far (an Axis makes its ticks when
    first asked for them: ticks made later are new, hence stale, without being checked)."""
    out: list = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            out += [axis.label, axis.offsetText]
            made = vars(axis)
            for tick in [*made.get("majorTicks", ()), *made.get("minorTicks", ())]:
                out += tick.get_children()
    return out


def _settle(fig) -> None:
    """Mark ``fig`` as unchanged from now on (anything changed later marks it stale)."""
    for artist in _quiet(fig):
        artist.stale = False
    fig.stale = False


def untouched(fig) -> bool:
    """Whether ``fig`` is unchanged since its draw function (or a fresh paint) left it."""
    parts = getattr(fig, "lesson10_parts", None)
    return (parts is not None and parts.fresh and not fig.stale and parts.rc == _rc()
            and not any(a.stale for a in _quiet(fig)))


def finish(fig):
    """Called by a draw function before it returns ``fig``: a fresh figure is marked so."""
    parts = fig.lesson10_parts
    if parts.fresh:
        parts.rc = _rc()
        _settle(fig)
    return fig


def _in_draw_order(fig, artists: list) -> list:
    """``artists`` in the order a full draw draws them: by Axes, then zorder, then as the Axes
    lists its children (matplotlib sorts them stably by zorder)."""
    rank = {id(ax): i for i, ax in enumerate(fig.axes)}
    place = {id(c): j for ax in fig.axes for j, c in enumerate(ax.get_children())}
    return sorted(artists, key=lambda a: (rank.get(id(a.axes), len(rank)), a.get_zorder(),
                                          place.get(id(a), len(place))))


def _draw_over(fig, canvas, artists: list) -> None:
    """Draw ``artists`` (in draw order) over what ``canvas`` holds."""
    renderer = canvas.get_renderer()
    for ax in fig.axes:                  # what Axes.draw does before drawing its artists
        ax.apply_aspect()
    for a in artists:
        if a.get_visible():
            a.draw(renderer)


def draw_without(fig, canvas, artists: list):
    """The picture of ``fig`` drawn whole on ``canvas`` with ``artists`` hidden (a BufferRegion)."""
    shown = [a.get_visible() for a in artists]
    for a in artists:
        a.set_visible(False)
    try:
        canvas.draw()
    finally:
        for a, was in zip(artists, shown):
            a.set_visible(was)
    return canvas.copy_from_bbox(fig.bbox)


def _background(fig, canvas, artists: list):
    """The picture of ``fig`` without ``artists``, if drawing them over it gives exactly the
    figure drawn whole, else None (a static artist drawn after one of them overlaps it with
    partly covered pixels, e.g. a tick over a spine at a low dpi). Leaves ``canvas`` showing
    the figure drawn whole."""
    import numpy as np
    canvas.draw()
    whole = np.array(canvas.buffer_rgba())
    region = draw_without(fig, canvas, artists)
    _draw_over(fig, canvas, artists)
    if np.array_equal(np.asarray(canvas.buffer_rgba()), whole):
        return region
    canvas.draw()
    return None


def paint(fig, canvas, checked: bool = False) -> bool:
    """Paint fresh ``fig`` on ``canvas``: its kept background, then its dynamic artists drawn
    over it (the first fresh figure of a structure is drawn whole, and its background kept
    if painting gives the same pixels). False, painting nothing, when ``fig`` is not fresh or
    its structure cannot be painted exactly. ``checked``: the caller saw it untouched (a
    savefig changes the dpi on the way here)."""
    if not (ENABLED and (checked or untouched(fig))):
        return False
    parts = fig.lesson10_parts
    artists = _in_draw_order(fig, parts.artists())
    width, height = canvas.get_width_height(physical=True)
    key = (parts.name, parts.key, width, height, fig.dpi, parts.rc)
    if key not in BACKGROUNDS:
        BACKGROUNDS[key] = _background(fig, canvas, artists)
        while len(BACKGROUNDS) > LIMIT:
            BACKGROUNDS.popitem(last=False)
    else:
        BACKGROUNDS.move_to_end(key)
        if BACKGROUNDS[key] is None:
            return False
        canvas.restore_region(BACKGROUNDS[key])
        _draw_over(fig, canvas, artists)
    _settle(fig)
    return True


def _plain(facecolor, edgecolor, bbox_inches, backend) -> bool:
    """Whether a savefig asks for the figure as it is drawn (only its dpi may differ)."""
    colors = (mpl.rcParams["savefig.facecolor"] if facecolor is None else facecolor,
              mpl.rcParams["savefig.edgecolor"] if edgecolor is None else edgecolor)
    box = mpl.rcParams["savefig.bbox"] if bbox_inches is None else bbox_inches
    return backend is None and not box and all(isinstance(c, str) and c == "auto" for c in colors)


class FreshCanvas(Canvas):
    """The canvas of a fresh figure: a plain savefig to PNG paints it (:func:`paint`). Its texts
    come from the text cache (:mod:`lesson10.figures.text`), as a view's do."""

    lesson10_plain = False

    def print_figure(self, filename, dpi=None, facecolor=None, edgecolor=None, orientation="portrait",
                     format=None, *, bbox_inches=None, backend=None, **kwargs):
        plain = ENABLED and _plain(facecolor, edgecolor, bbox_inches, backend) and untouched(self.figure)
        self.lesson10_plain = plain
        try:
            out = super().print_figure(filename, dpi=dpi, facecolor=facecolor, edgecolor=edgecolor,
                                       orientation=orientation, format=format, bbox_inches=bbox_inches,
                                       backend=backend, **kwargs)
        finally:
            self.lesson10_plain = False
        if plain:                        # drawn as it is: only the dpi changed, and is back
            _settle(self.figure)
        return out

    def print_png(self, filename_or_obj, *, metadata=None, pil_kwargs=None, bbox_inches_restore=None,
                  **_):
        if self.lesson10_plain and bbox_inches_restore is None and paint(self.figure, self, checked=True):
            from matplotlib.image import imsave
            imsave(filename_or_obj, self.buffer_rgba(), format="png", origin="upper", dpi=self.figure.dpi,
                   metadata=metadata, pil_kwargs=pil_kwargs)
            return None
        return super().print_png(filename_or_obj, metadata=metadata, pil_kwargs=pil_kwargs)
