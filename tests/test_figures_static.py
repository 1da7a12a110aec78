"""A figure saved in a notebook shows a picture where widgets do not run: its display carries a
PNG of the figure as first shown (``image/png``) beside the widget view, with ipywidgets 8 and
7.7.1 (Colab), and a notebook converted to HTML (nbconvert, what nbviewer shows) holds it."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("MPLBACKEND", "Agg")

import pytest

from lesson10 import figures
from lesson10.figures import kit

ROOT = Path(__file__).resolve().parent.parent
COLAB_PYTHON = ROOT / ".venv-colab" / "bin" / "python"
MAKERS = [figures.ring_rounds, figures.sp_strip, figures.block_size, figures.ulysses_grid, figures.moe_capacity]
PNG = b"\x89PNG\r\n\x1a\n"


def _bundle(box) -> dict:
    """What Jupyter saves of ``box``: its display bundle, from a shell made for this call only
    (a shell left behind would make every later check in this process print, not raise)."""
    from IPython.core.interactiveshell import InteractiveShell
    had = InteractiveShell.initialized()
    try:
        data, _ = InteractiveShell.instance().display_formatter.format(box)
    finally:
        if not had:
            InteractiveShell.clear_instance()
    return data


@pytest.mark.parametrize("make", MAKERS, ids=lambda f: f.__name__)
def test_a_figure_displays_a_png_of_its_first_state_beside_the_widget(make):
    box = make()
    first = bytes(box.view.image.value)
    data = _bundle(box)
    assert kit.WIDGET_VIEW in data and data[kit.WIDGET_VIEW]["model_id"] == box.model_id
    png = base64.b64decode(data["image/png"])
    assert png.startswith(PNG) and png == first
    assert "VBox(" not in data["text/plain"] and make.__name__ in data["text/plain"]
    assert set(data) - {"text/plain"}                    # text/plain is not the only fallback


def test_the_png_is_the_picture_shown_when_displayed():
    box = figures.ring_rounds(n=4, s=16, layout="zigzag")
    first = base64.b64decode(_bundle(box)["image/png"])
    box.next_round()
    later = base64.b64decode(_bundle(box)["image/png"])
    assert later != first and later == bytes(box.view.image.value)


def test_a_bundle_without_a_widget_view_or_a_figure_is_left_alone():
    box = figures.sp_strip()
    plain = {"text/plain": "x"}
    assert kit.static_bundle(box, plain) == plain
    other = kit.widgets().VBox()
    view = {"text/plain": "VBox()", kit.WIDGET_VIEW: {"model_id": other.model_id}}
    assert kit.static_bundle(other, view) == view
    box.close()                                          # a closed widget: no view, no picture
    assert not {"image/png", kit.WIDGET_VIEW} & set(_bundle(box))


_RUN = r"""
import json, sys, nbformat
from nbclient import NotebookClient
nb = nbformat.v4.new_notebook()
nb.cells = [nbformat.v4.new_code_cell("import ipywidgets\nprint(ipywidgets.__version__)"),
            nbformat.v4.new_code_cell("from lesson10 import figures\nfigures.sp_strip(t=2)"),
            nbformat.v4.new_code_cell("from IPython.display import display\ndisplay(figures.block_size())"),
            nbformat.v4.new_code_cell("closed = figures.sp_strip()\nclosed.close()\nclosed")]
NotebookClient(nb, timeout=300, kernel_name="python3").execute()
nb.metadata.pop("widgets", None)                # a notebook saved without widget state
html = None
if "--html" in sys.argv:
    from nbconvert import HTMLExporter
    html = HTMLExporter().from_notebook_node(nb)[0]
print(json.dumps({"version": nb.cells[0].outputs[0]["text"].strip(),
                  "outputs": [[dict(o.get("data", {})) for o in c.outputs] for c in nb.cells[1:]],
                  "html": html}))
"""


def _saved(python: Path, html: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    env.pop("LESSON10_STRICT_CHECKS", None)
    proc = subprocess.run([str(python), "-c", _RUN] + (["--html"] if html else []), capture_output=True,
                          text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _assert_saved_outputs_hold_pictures(saved: dict) -> list[str]:
    *shown, closed = saved["outputs"]
    assert [sorted(d) for d in closed] == [["text/plain"]], closed      # a closed widget: its text
    pngs = []
    for outputs in shown:
        assert len(outputs) == 1, outputs
        data = outputs[0]
        assert kit.WIDGET_VIEW in data and "image/png" in data, sorted(data)
        assert base64.b64decode(data["image/png"]).startswith(PNG)
        assert "VBox(" not in data["text/plain"]
        pngs.append(data["image/png"])
    return pngs


def test_a_saved_figure_cell_holds_a_png_and_html_shows_it():
    """ipywidgets 8 (this venv): the saved outputs hold the PNG, and nbconvert's HTML of the
    notebook saved without widget state (nbviewer's view) shows it."""
    saved = _saved(Path(sys.executable), html=True)
    assert saved["version"].startswith("8.")
    for png in _assert_saved_outputs_hold_pictures(saved):
        assert f"data:image/png;base64,{png}" in saved["html"]
    assert "VBox(children" not in saved["html"]


def test_a_saved_figure_cell_holds_a_png_with_colabs_ipywidgets_7():
    if not COLAB_PYTHON.exists():
        pytest.skip(f"no {COLAB_PYTHON}: `make test-colab` builds .venv-colab (ipywidgets 7.7.1)")
    saved = _saved(COLAB_PYTHON, html=False)
    assert saved["version"] == "7.7.1"
    _assert_saved_outputs_hold_pictures(saved)
