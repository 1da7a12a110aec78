"""Text, drawn fast: a figure's costliest part (layout, then every glyph through FreeType).

A new structure of a figure draws mostly the same texts again (axis labels, tick labels,
legends), so the canvas a view draws on (:class:`Canvas`) shares one renderer among the
figures of one size, and that renderer (:class:`TextCacheRenderer`) keeps the pixels of each
text it drew, keyed by what they depend on, the fraction of a pixel of its position
included: the same text at another whole-pixel position is the same pixels, moved. Agg would
draw the same (within one level of 255: the paste rounds once more). :class:`Labels` draws
many short texts (a grid's cell labels) as one artist.
"""
from __future__ import annotations

from collections import OrderedDict

from matplotlib.artist import Artist
from matplotlib.backends.backend_agg import FigureCanvasAgg, RendererAgg

__all__ = ["Labels", "TextCacheRenderer", "Canvas"]


class Labels(Artist):
    """Short texts centred on points of an Axes, drawn as one artist: many Text artists cost
    more to make than to draw. ``set_labels(xy, texts, colors)``: data coordinates (N, 2), N
    strings and N colours; ``items()`` gives them back as ((x, y), text) pairs."""

    def __init__(self, fontsize: float = 8):
        super().__init__()
        self.set_zorder(3)                  # above patches and collections, as a Text is
        from matplotlib.font_manager import FontProperties
        self.prop = FontProperties(size=fontsize)
        self.xy: list = []
        self.texts: list = []
        self.colors: list = []
        self._sizes: dict = {}

    def set_labels(self, xy=None, texts=None, colors=None) -> None:
        if xy is not None:
            self.xy = [tuple(p) for p in xy]
        if texts is not None:
            self.texts = list(texts)
        if colors is not None:
            self.colors = list(colors)
        self.stale = True

    def items(self):
        return list(zip(self.xy, self.texts))

    def draw(self, renderer) -> None:
        if not self.get_visible() or not self.xy or self.axes is None:
            return
        from matplotlib.colors import to_rgba
        points = self.axes.transData.transform(self.xy)
        height = renderer.get_canvas_width_height()[1]
        gc = renderer.new_gc()
        for (x, y), text, color in zip(points, self.texts, self.colors):
            if not text:
                continue
            size = self._sizes.get((text, renderer.dpi))
            if size is None:
                size = self._sizes[text, renderer.dpi] = renderer.get_text_width_height_descent(
                    text, self.prop, False)
            w, h, d = size
            gc.set_foreground(to_rgba(color), isRGBA=True)
            renderer.draw_text(gc, x - w / 2, height - y + h / 2 - d, text, self.prop, 0)
        gc.restore()
        self.stale = False


class TextCacheRenderer(RendererAgg):
    """An Agg renderer that draws each text once and then copies its pixels.

    ``draw_text(gc, x, y, s, prop, angle)`` renders ``s`` on a small scratch canvas at the
    same fraction of a pixel as ``(x, y)`` and pastes it at the whole-pixel part, so the
    result is what Agg would draw there. The pixels are kept under the text, its font, colour,
    angle and that fraction: later draws of it are one paste. Clipped texts, math and texts
    with font features are drawn as usual."""

    #: (text, font, colour, ..., x mod 1, y mod 1) -> (dx, dy, pixels bottom-up, height)
    cache: OrderedDict = OrderedDict()
    LIMIT = 4000

    def draw_text(self, gc, x, y, s, prop, angle, ismath=False, mtext=None):
        if (ismath or gc.get_clip_rectangle() is not None or gc.get_clip_path()[0] is not None
                or (mtext is not None and (getattr(mtext, "get_fontfeatures", lambda: None)()
                                           or getattr(mtext, "get_language", lambda: None)()))):
            return super().draw_text(gc, x, y, s, prop, angle, ismath=ismath, mtext=mtext)
        fx, fy = x % 1.0, y % 1.0
        key = (s, tuple(prop.get_family()), prop.get_style(), prop.get_variant(), prop.get_weight(),
               prop.get_stretch(), prop.get_size_in_points(), prop.get_file(), tuple(gc.get_rgb()),
               gc.get_alpha(), gc.get_forced_alpha(), gc.get_antialiased(), angle, self.dpi, fx, fy)
        hit = self.cache.get(key)
        if hit is None:
            hit = self.cache[key] = self._raster(gc, fx, fy, s, prop, angle)
            if len(self.cache) > self.LIMIT:
                self.cache.popitem(last=False)
        dx, dy, pixels = hit
        if pixels is not None:                  # (dx, dy): its top-left corner from (x, y), y down
            left, top = int(x - fx) + dx, int(y - fy) + dy
            blit = self.new_gc()
            self.draw_image(blit, left, self.height - top - pixels.shape[0], pixels)
            blit.restore()

    def _raster(self, gc, fx, fy, s, prop, angle):
        """The pixels of ``s`` drawn at ``(ox + fx, oy + fy)`` on a transparent scratch canvas,
        and the offset of their top-left corner from ``(ox, oy)``. The canvas is sized from the
        font's own bounds (:func:`font_extent`: no text layout, public API only); a text with a
        character of another font, or one whose pixels reach that canvas' edge anyway, is
        drawn on a canvas sized from its measured extent."""
        bound = font_extent(s, prop, self.dpi)
        out = None if bound is None else self._raster_in(gc, fx, fy, s, prop, angle, bound)
        if out is None:
            w, h, d = self.get_text_width_height_descent(s, prop, False)
            out = self._raster_in(gc, fx, fy, s, prop, angle, (w, h, d, 0.0), whole=False)
        return out

    def _raster_in(self, gc, fx, fy, s, prop, angle, extent, whole: bool = True):
        """:meth:`_raster` on a canvas for ``extent = (w, h, d, left)`` (width, height,
        descent, overhang left of the pen) and a margin; with ``whole``, None when the text's
        pixels reach the canvas' edge (the extent was short: a pixel may be cut off)."""
        import math

        import numpy as np
        w, h, d, left = extent
        margin = 3 + int(prop.get_size_in_points() * self.dpi / 72 * 0.3)
        if angle == 0:               # the baseline at oy: ascent above it, descent below
            ox, oy = margin + math.ceil(left), margin + math.ceil(h - d)
            width, height = math.ceil(w + left) + 2 * margin, math.ceil(h) + 2 * margin + 1
        else:                        # any rotation about (x, y)
            ox = oy = math.ceil(math.hypot(w + left, h)) + margin
            width = height = 2 * ox + 1
        scratch = RendererAgg(width, height, self.dpi)
        RendererAgg.draw_text(scratch, gc, ox + fx, oy + fy, s, prop, angle)
        pixels = np.asarray(scratch.buffer_rgba())             # rows top-down
        rows, cols = np.nonzero(pixels[..., 3])
        if rows.size == 0:
            return (0, 0, None)
        r0, r1, c0, c1 = rows.min(), rows.max() + 1, cols.min(), cols.max() + 1
        if whole and (r0 == 0 or c0 == 0 or r1 == height or c1 == width):
            return None
        return (int(c0) - ox, int(r0) - oy, pixels[r0:r1, c0:c1][::-1].copy())


def font_extent(s: str, prop, dpi: float) -> tuple[float, float, float, float] | None:
    """An upper bound of ``(width, height, descent, left overhang)`` in pixels of one line
    ``s`` drawn in ``prop``'s font, from the font's own numbers: every glyph lies inside its
    bounding box and no pen step is wider than its widest advance. None when a character is
    not in that font (matplotlib then draws it with another)."""
    from matplotlib.font_manager import findfont, get_font
    font = get_font(findfont(prop))
    if not s or any(font.get_char_index(ord(c)) == 0 for c in s):
        return None
    em = prop.get_size_in_points() * dpi / 72 / font.units_per_EM
    xmin, ymin, xmax, ymax = font.bbox
    left = max(0, -xmin) * em + 1                   # + 1: the pen's rounding to whole pixels
    width = ((len(s) - 1) * font.max_advance_width + max(xmax, 0)) * em + 1
    return (width, (ymax - min(ymin, 0)) * em + 2, -min(ymin, 0) * em + 1, left)


#: (width, height, dpi) -> the renderer the canvases of that size share
_RENDERERS: OrderedDict = OrderedDict()


class Canvas(FigureCanvasAgg):
    """The Agg canvas of a view's figures: one :class:`TextCacheRenderer` per figure size,
    shared (figures are drawn one at a time, and each draw paints the whole canvas)."""

    def get_renderer(self):
        w, h = self.get_width_height(physical=True)
        key = (w, h, self.figure.dpi)
        renderer = _RENDERERS.get(key)
        if renderer is None:
            renderer = _RENDERERS[key] = TextCacheRenderer(w, h, self.figure.dpi)
            if len(_RENDERERS) > 4:
                _RENDERERS.popitem(last=False)
        self.renderer = renderer
        return renderer
