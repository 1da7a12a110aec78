"""What the interactive figures share: colours, fixed margins, the PNG view of a figure and
its controls (:class:`View`). The figures themselves are in :mod:`lesson10.figures`.
"""
from __future__ import annotations

import io

from matplotlib.figure import Figure

__all__ = ["COLORS", "MARGINS", "BLANK", "RELEASE", "STYLE", "new_figure", "legend", "png",
           "widgets", "View"]

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
    """``fig`` cleared (or a new Figure of ``size``) with the fixed margins of figure ``name``."""
    if fig is None:
        fig = Figure(figsize=size)
    else:
        fig.clear()
    fig.subplots_adjust(**MARGINS[name])
    return fig


def legend(ax, entries, **kw):
    """A legend of coloured boxes: ``entries`` = [(COLORS key or colour, label), ...]."""
    from matplotlib.patches import Patch
    handles = [Patch(fc=COLORS.get(c, c), ec=COLORS["edge"], lw=0.5, label=label) for c, label in entries]
    return ax.legend(handles=handles, **{"fontsize": 8, **kw})


def png(fig) -> bytes:
    """The figure as PNG bytes (90 dpi)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
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
    """Glue for one interactive figure: an Image showing ``draw(fig, **state)`` and a message line."""

    def __init__(self, draw, state, size):
        w = widgets()
        self.draw, self.state = draw, dict(state)
        self.fig = Figure(figsize=size)
        self.image = w.Image(format="png")
        self.message = w.HTML()

    def update(self, **changes):
        self.state.update(changes)
        try:
            self.draw(self.fig, **self.state)
        except ValueError as exc:          # bad combination of controls: say why, show no stale picture
            self.message.value = f"<span style='color:{COLORS['split']}'>{exc}</span>"
            self.image.value = BLANK
            return False
        self.message.value = ""
        self.image.value = png(self.fig)
        return True

    def watch(self, controls, on_change) -> None:
        """Call ``on_change`` whenever one of ``controls`` changes value, then draw once."""
        for control in controls:
            control.observe(on_change, names="value")
        self.update()

    def box(self, controls):
        w = widgets()
        box = w.VBox([w.HBox(controls) if isinstance(controls, list) else controls, self.message, self.image])
        box.view = self                    # tests and curious users can reach the state and figure
        return box
