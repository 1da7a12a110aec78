"""Run one notebook in a Colab-like venv: ``.venv-colab*/bin/python run_notebook.py NB.ipynb``.

Executes every cell with nbclient in a fresh ``python3`` kernel of this interpreter (the
kernel's working folder is the notebook's folder), then prints one JSON line:

* ``error``: the error, if a cell raised;
* ``probe``: what a cell appended at the end saw: where ``lesson10`` was imported from and its
  installed version, whether ``google.colab`` was loaded at kernel start, the ipywidgets
  version, matplotlib's backend, whether torch can be imported, the Python version;
* ``install_output``: what the notebook's install cell printed;
* ``show_cells`` / ``png_cells``: the code cells that call ``plt.show()``, and those whose
  outputs hold a PNG (with the inline backend, as in Colab, every ``plt.show()`` does).
"""
import json
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

PROBE = ("import importlib.metadata, importlib.util, json, sys, lesson10, ipywidgets, matplotlib\n"
         "print('PROBE ' + json.dumps({'lesson10': lesson10.__file__, 'lesson10_version': lesson10.__version__,"
         " 'installed': importlib.metadata.version('lesson10'), 'colab': 'google.colab' in sys.modules,"
         " 'ipywidgets': ipywidgets.__version__, 'backend': matplotlib.get_backend(),"
         " 'torch': importlib.util.find_spec('torch') is not None, 'python': sys.version.split()[0]}))")


def _text(outputs) -> str:
    return "".join(out.get("text", "") for out in outputs if out.get("output_type") == "stream")


def main(path: str) -> int:
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    client = NotebookClient(nb, timeout=900, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    result = {"notebook": path.name, "error": None, "probe": None}
    try:
        client.execute()
    except CellExecutionError as exc:
        result["error"] = str(exc)[-3000:]
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    install = next((c for _, c in code if "_install_lesson10(" in c.source), code[0][1] if code else None)
    result["install_output"] = _text(install.get("outputs", [])) if install is not None else ""
    result["show_cells"] = [i for i, c in code if "plt.show()" in c.source]
    result["png_cells"] = [i for i, c in code
                           if any("image/png" in out.get("data", {}) for out in c.get("outputs", []))]
    for line in _text(nb.cells[-1].get("outputs", [])).splitlines():
        if line.startswith("PROBE "):
            result["probe"] = json.loads(line[len("PROBE "):])
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
