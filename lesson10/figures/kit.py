"""What the interactive figures share: colours, fixed margins, the PNG view of a figure and
its controls (:class:`View`), and the redraw machinery that keeps it quick (:class:`Parts`,
:func:`render`). The figures themselves are in :mod:`lesson10.figures`.

A redraw draws less than the whole figure. Each figure's axes are built once (a skeleton); a
control that changes its *structure* (the parameters that move axes, ticks or the number of
boxes, e.g. ``(n, s, layout)`` of the ring figure) moves those axes and artists to the new
structure in place, and a control that leaves the structure alone only updates the artists
it changes (an image's data, bar heights, colours, a title). :func:`render` keeps the picture
of the rest (the background: axes, ticks, labels, fixed legends) for the last few structures
and paints the changed artists on a copy of it before encoding the PNG, so going back to a
structure seen before costs no full draw either. Texts are drawn through
:mod:`lesson10.figures.text`, which makes each text's pixels once. A new figure from a draw
function (``fig=None``) is painted from a background kept for every fresh figure of its
structure (:mod:`lesson10.figures.fresh`), with the pixels of a full draw.
"""
from __future__ import annotations

import io
from collections import OrderedDict
from typing import Any

from matplotlib.figure import Figure

from . import fresh
from .text import Canvas, Labels, TextCacheRenderer  # figures use them through kit

__all__ = ["COLORS", "MARGINS", "BLANK", "RELEASE", "STYLE", "DPI", "new_figure", "legend", "png",
           "widgets", "ticks", "fixed", "Parts", "reuse", "skeleton", "structured", "keep", "finish", "render",
           "View", "figure_box", "static_bundle", "WIDGET_VIEW", "Canvas", "TextCacheRenderer", "Labels"]

COLORS = {
    "computed": "#2f6fdb",    # blue
    "earlier": "#b9d0f5",     # faint blue
    "masked": "#c8c8c8",      # grey
    "idle": "#8e5cd9",        # violet (idle time, replicated copies)
    "split": "#d63fb4",       # magenta (split by tokens, dropped copies)
    "comm": "#1fb5c4",        # aqua (collectives, bytes in flight)
    "empty": "#ffffff",
    "edge": "#444444",
}
COLORS["replicated"] = COLORS["idle"]
COLORS["dropped"] = COLORS["split"]

#: dots per inch of the PNG a view shows
DPI = 90

#: fixed margins of each figure (fractions of the figure): a layout engine ("constrained")
#: re-solves the layout at every redraw and costs more than the drawing itself
MARGINS = {
    "ring_rounds": dict(left=0.11, right=0.98, bottom=0.24, top=0.92, wspace=0.22),
    "sp_strip": dict(left=0.01, right=0.99, bottom=0.22, top=0.84),
    "block_size": dict(left=0.11, right=0.97, bottom=0.12, top=0.87),
    "ulysses_grid": dict(left=0.07, right=0.64, bottom=0.1, top=0.93, hspace=0.45),
    "moe_capacity": dict(left=0.1, right=0.97, bottom=0.07, top=0.94, hspace=0.38),
}


def new_figure(fig, size, name: str):
    """``fig`` cleared (or a new Figure of ``size`` on a :class:`~lesson10.figures.fresh.FreshCanvas`)
    with the fixed margins of figure ``name``."""
    if fig is None:
        fig = Figure(figsize=size)
        fresh.FreshCanvas(fig)
    else:
        fig.clear()
    fig.lesson10_parts = None               # whatever was kept for the old picture is gone
    fig.subplots_adjust(**MARGINS[name])
    return fig


def legend(ax, entries, **kw):
    """A legend of coloured boxes: ``entries`` = [(COLORS key or colour, label), ...]."""
    from matplotlib.patches import Patch
    handles = [Patch(fc=COLORS.get(c, c), ec=COLORS["edge"], lw=0.5, label=label) for c, label in entries]
    box = ax.legend(handles=handles, **{"fontsize": 8, **kw})
    box.lesson10_key = (id(ax), tuple(entries), repr(sorted(kw.items())))   # its pixels depend on these
    return box


def ticks(axis, locs, labels, fontsize=None) -> None:
    """``axis.set_ticks(locs, labels, fontsize=fontsize)``, except that the Tick artists are
    made when first drawn or asked for: a fresh figure painted from a kept background
    (:mod:`lesson10.figures.fresh`) never makes them, and making them is most of a build."""
    from matplotlib.ticker import FixedFormatter, FixedLocator
    axis.set_major_locator(FixedLocator(list(locs)))
    axis.set_major_formatter(FixedFormatter([str(label) for label in labels]))
    if fontsize is not None:
        axis.set_tick_params(which="major", labelsize=fontsize)


def fixed(artist, *content):
    """``artist`` marked as drawn the same whenever ``content`` is: :func:`render` stamps it."""
    artist.lesson10_key = (id(artist.axes), type(artist).__name__, content or id(artist))
    return artist


class Parts:
    """What a built figure keeps between redraws.

    ``name``, ``key``: the figure and its structure (a redraw with another key rebuilds).
    ``dynamic``: name -> artist or list of artists that a redraw may change, painted in this
    order over the background; ``axes``: whose spines are painted again on top (bars and
    images reach the frame). Other keyword arguments are kept as attributes for the update
    step (artists, cached numbers)."""

    #: how many structures' backgrounds a figure that is rebuilt in place keeps
    KEEP = 8

    def __init__(self, name: str, key, axes=(), **named):
        self.name, self.key, self.axes = name, key, list(axes)
        self.fresh, self.rc = False, None   # a figure just built by a draw function (see fresh)
        self.dynamic: dict = {}
        self.backgrounds: OrderedDict = OrderedDict()  # key -> (width, height, BufferRegion)
        self.stamps: dict = {}              # the pixels of legends and fixed artists (see _stamp)
        self.__dict__.update(named)

    def __getattr__(self, name: str) -> Any:       # the named parts (typed loosely for mypy)
        raise AttributeError(f"{type(self).__name__} has no part {name!r}")

    @property
    def background(self):
        """The kept picture of the current structure without its dynamic artists, or None."""
        return self.backgrounds.get(self.key)

    @background.setter
    def background(self, value) -> None:
        self.backgrounds[self.key] = value
        self.backgrounds.move_to_end(self.key)
        while len(self.backgrounds) > self.KEEP:
            self.backgrounds.popitem(last=False)

    def restructured(self, key) -> None:
        """Say that the builder moved this figure's axes and artists to structure ``key``."""
        self.key = key
        if key in self.backgrounds:
            self.backgrounds.move_to_end(key)

    def artists(self) -> list:
        out: list = []
        for item in self.dynamic.values():
            out.extend(item if isinstance(item, (list, tuple)) else [item])
        for ax in self.axes:
            out.extend(ax.spines.values())
        return [a for a in out if a is not None]


def reuse(fig, name: str, key) -> Parts | None:
    """The kept parts of ``fig`` if it shows figure ``name`` with structure ``key``, else None."""
    parts = getattr(fig, "lesson10_parts", None)
    if parts is not None and parts.name == name and parts.key == key:
        return parts
    return None


def skeleton(fig, name: str) -> Parts | None:
    """The kept parts of ``fig`` if it shows figure ``name`` with any structure: a builder that
    can move its axes and artists to another structure does so instead of starting again."""
    parts = getattr(fig, "lesson10_parts", None)
    return parts if parts is not None and parts.name == name else None


def structured(fig, name: str, key, size, build, restructure, fits=None):
    """``(fig, parts)`` showing figure ``name`` at structure ``key``: the kept parts when ``fig``
    already shows it, else ``restructure(parts)`` moves a figure of that kind there, and a
    figure of no kind (or whose axes ``fits(parts)`` says cannot move there) first gets its
    axes from ``build(fig)`` (on ``fig`` cleared, or a new Figure of ``size``)."""
    parts = reuse(fig, name, key)
    if parts is not None:
        parts.fresh = parts.fresh and fresh.untouched(fig)
    else:
        parts = skeleton(fig, name)
        if parts is None or (fits is not None and not fits(parts)):
            new = fig is None
            fig = new_figure(fig, size, name)
            parts = build(fig)
            parts.fresh = new
        else:
            parts.fresh = False
        restructure(parts)
    return fig, parts


def finish(fig):
    """``fig``, marked fresh if a draw function built it new (:func:`lesson10.figures.fresh.finish`)."""
    return fresh.finish(fig)


def keep(fig, parts: Parts) -> Parts:
    """Attach ``parts`` to ``fig`` (after building it): later redraws may reuse them."""
    fig.lesson10_parts = parts
    return parts


def _encode(canvas) -> bytes:
    from PIL import Image
    width, height = canvas.get_width_height(physical=True)
    image = Image.frombuffer("RGBA", (width, height), canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="png", compress_level=1)
    return buf.getvalue()


def _stamp_key(artist, renderer):
    """What the pixels of ``artist`` depend on (see :func:`fixed`), or None: then it is drawn
    (a text is drawn from the renderer's text cache)."""
    key = getattr(artist, "lesson10_key", None)
    return None if key is None else ("artist", key, renderer.dpi)


def _stamp(artist, renderer, parts: Parts) -> None:
    """Draw ``artist`` from its cached pixels (a stamp): text layout and glyph rendering cost
    far more than copying the few hundred pixels they make. A stamp is made by drawing the
    artist alone on a transparent scratch canvas of the figure's size and cutting out its box."""
    key = _stamp_key(artist, renderer)
    if key is None:
        artist.draw(renderer)
        return
    stamp = parts.stamps.get(key)
    if stamp is None:
        stamp = parts.stamps[key] = _make_stamp(artist, renderer, parts)
    x, y, crop = stamp
    if crop is not None:
        gc = renderer.new_gc()
        renderer.draw_image(gc, x, y, crop)
        gc.restore()


#: (width, height, dpi) -> the transparent canvas stamps are cut from
_SCRATCH: dict = {}


def _make_stamp(artist, renderer, parts: Parts):
    """``(x, y, pixels)``: the artist's pixels (rows bottom-up, as ``draw_image`` takes them)
    and their lower-left corner on the canvas; pixels None when it draws nothing."""
    import numpy as np
    from matplotlib.backends.backend_agg import RendererAgg
    width, height = int(renderer.width), int(renderer.height)
    scratch = _SCRATCH.get((width, height, renderer.dpi))
    if scratch is None:
        _SCRATCH.clear()                                # one figure size at a time is enough
        scratch = _SCRATCH[width, height, renderer.dpi] = RendererAgg(width, height, renderer.dpi)
    scratch.clear()
    artist.draw(scratch)
    box = artist.get_window_extent(scratch)
    x0, x1 = max(int(box.x0) - 2, 0), min(int(np.ceil(box.x1)) + 2, width)
    y0, y1 = max(int(box.y0) - 2, 0), min(int(np.ceil(box.y1)) + 2, height)
    if x1 <= x0 or y1 <= y0:
        return (0, 0, None)
    pixels = np.asarray(scratch.buffer_rgba())          # rows top-down
    crop = pixels[height - y1:height - y0, x0:x1][::-1].copy()
    if len(parts.stamps) > 2000:                        # a long session: start again
        parts.stamps.clear()
    return (x0, y0, crop)


def render(fig) -> bytes:
    """The figure as PNG bytes at its own dpi. A figure with :class:`Parts` paints only its
    dynamic artists over its kept background (drawn once, with them hidden); texts and legends
    are painted from stamps (:func:`_stamp`). A fresh figure is painted by
    :func:`lesson10.figures.fresh.paint` (exactly a full draw's pixels)."""
    canvas = fig.canvas if isinstance(fig.canvas, Canvas) else Canvas(fig)
    if fresh.paint(fig, canvas):
        return _encode(canvas)
    parts = getattr(fig, "lesson10_parts", None)
    if parts is None:
        canvas.draw()
        return _encode(canvas)
    artists = parts.artists()
    size = canvas.get_width_height(physical=True)
    if parts.background is None or parts.background[:2] != size:
        parts.background = (*size, fresh.draw_without(fig, canvas, artists))
    else:
        canvas.restore_region(parts.background[2])
    renderer = canvas.get_renderer()
    for a in artists:
        if a.get_visible():
            _stamp(a, renderer, parts)
    return _encode(canvas)


def png(fig) -> bytes:
    """The figure as PNG bytes (90 dpi), drawn whole, or painted from a kept background if it
    is fresh (:mod:`lesson10.figures.fresh`: the same pixels). Light compression: at the
    default level encoding costs more than painting, for a PNG shown once."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, pil_kwargs={"compress_level": 1})
    return buf.getvalue()


#: a 1 x 1 white PNG: what a figure shows while its controls make no sense together
BLANK = (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00\x00"
          b"\x90wS\xde\x00\x00\x00\x0cIDATx\x9cc\xf8\xff\xff?\x00\x05\xfe\x02\xfe\r\xefF\xb8\x00\x00"
          b"\x00\x00IEND\xaeB`\x82")

#: sliders redraw when released, not at every step of a drag (a redraw is a new PNG)
RELEASE = {"continuous_update": False}

#: controls show their whole description (ipywidgets 7 and 8 cut it at ~80 px otherwise)
STYLE = {"description_width": "initial"}


def widgets():
    """The ipywidgets module (a clear ImportError without it)."""
    try:
        import ipywidgets
    except ImportError as exc:  # pragma: no cover - ipywidgets is a dependency
        raise ImportError("the interactive figures need ipywidgets: pip install ipywidgets") from exc
    return ipywidgets


class View:
    """Glue for one interactive figure: an Image showing ``draw(fig, **state)`` and a message line.

    ``structure(**state)``: the key of the figure's structure. The view keeps one Figure per
    key for the last ``keep`` keys (``fig``: the one shown); with the default ``keep=1`` it
    keeps one Figure, whose builder moves the axes to each new structure and keeps the
    pictures of the last few (:attr:`Parts.KEEP`), so a redraw updates a built figure."""

    def __init__(self, draw, state, size, structure=None, keep: int = 1):
        w = widgets()
        self.draw, self.state, self.size = draw, dict(state), size
        self.structure, self.keep = structure, keep
        self.figs: OrderedDict = OrderedDict()
        self.fig = self._figure()
        self.image = w.Image(format="png")
        self.message = w.HTML()

    def _figure(self) -> Figure:
        """The kept Figure of the current structure (the oldest one recycled when full)."""
        key = self.structure(**self.state) if self.structure else None
        fig = self.figs.pop(key, None)
        if fig is None:
            if len(self.figs) >= self.keep:
                fig = self.figs.popitem(last=False)[1]
            else:
                fig = Figure(figsize=self.size, dpi=DPI)
                Canvas(fig)
        self.figs[key] = fig
        return fig

    def forget(self) -> None:
        """Forget every structure drawn so far: the next redraw is what a first visit to a
        structure costs (the kept axes moved there, or built again where a figure cannot move
        them, as for the MoE figure with other sizes)."""
        for fig in self.figs.values():
            parts = getattr(fig, "lesson10_parts", None)
            if parts is not None:
                parts.key = None
                parts.backgrounds.clear()
                parts.__dict__.get("per_key", {}).clear()
        skeletons = [f for f in self.figs.values() if getattr(f, "lesson10_parts", None) is not None]
        self.figs.clear()
        if skeletons:
            self.figs[None] = skeletons[-1]

    def update(self, **changes):
        self.state.update(changes)
        try:
            self.fig = self._figure()
            self.draw(self.fig, **self.state)
        except ValueError as exc:          # bad combination of controls: say why, show no stale picture
            self.message.value = f"<span style='color:{COLORS['split']}'>{exc}</span>"
            self.image.value = BLANK
            return False
        self.message.value = ""
        self.image.value = render(self.fig)
        return True

    def watch(self, controls, on_change) -> None:
        """Call ``on_change`` whenever one of ``controls`` changes value, then draw once."""
        for control in controls:
            control.observe(on_change, names="value")
        self.update()

    def box(self, controls):
        """The figure's widget (a :func:`figure_box`): ``controls``, the message line, the image."""
        w = widgets()
        box = figure_box()([w.HBox(controls) if isinstance(controls, list) else controls, self.message, self.image])
        box.view = self                    # tests and curious users can reach the state and figure
        return box


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def static_bundle(box, data: dict) -> dict:
    """``data`` (a widget's mime bundle) with the picture the figure shows now as ``image/png``
    and a ``text/plain`` that says what it is: where widgets do not run (GitHub, nbviewer, a
    saved notebook) a frontend shows the richest type it knows, this picture, not
    ``VBox(children=...)``. Frontends that run widgets prefer the widget view."""
    import base64
    view = getattr(box, "view", None)
    if view is None or not view.image.value or WIDGET_VIEW not in data:
        return data
    name = view.draw.__name__.removeprefix("draw_")
    return {**data, "image/png": base64.b64encode(bytes(view.image.value)).decode("ascii"),
            "text/plain": f"<{name}: an interactive figure; run the cell to move its controls>"}


#: the class of :func:`figure_box`, made once ipywidgets is imported
_FIGURE_BOX: list = []


def figure_box():
    """The VBox class of the figures: displayed, it also carries a PNG of its figure as shown at
    that moment (:func:`static_bundle`), with ipywidgets 8 (a mime bundle) and 7.7 (Colab:
    ``_ipython_display_`` displays the bundle itself)."""
    if _FIGURE_BOX:
        return _FIGURE_BOX[0]
    vbox: Any = widgets().VBox

    class FigureBox(vbox):
        """A figure's VBox whose display holds a static PNG of the figure beside the widget view."""

        if hasattr(vbox, "_repr_mimebundle_"):           # ipywidgets 8
            def _repr_mimebundle_(self, **kwargs):
                data = super()._repr_mimebundle_(**kwargs)
                return static_bundle(self, data) if isinstance(data, dict) else data
        else:                                            # ipywidgets 7: it displays itself
            def _ipython_display_(self, **kwargs):
                from IPython.display import display
                data = {"text/plain": repr(self)[:110],
                        WIDGET_VIEW: {"version_major": 2, "version_minor": 0, "model_id": self._model_id}}
                display(static_bundle(self, data), raw=True)
                self._handle_displayed(**kwargs)

    _FIGURE_BOX.append(FigureBox)
    return FigureBox
