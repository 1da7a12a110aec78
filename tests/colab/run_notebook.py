"""Run one notebook in the Colab-like venv: ``.venv-colab/bin/python run_notebook.py NB.ipynb``.

Executes every cell with nbclient in a fresh ``python3`` kernel of this interpreter (the
kernel's working folder is the notebook's folder), then prints one JSON line: the error, if a
cell raised, and what a probe cell appended at the end saw (where ``lesson10`` was imported
from, whether ``google.colab`` was loaded at kernel start, the ipywidgets version).
"""
import json
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

PROBE = ("import json, sys, lesson10, ipywidgets\n"
         "print('PROBE ' + json.dumps({'lesson10': lesson10.__file__, 'colab': 'google.colab' in sys.modules,"
         " 'ipywidgets': ipywidgets.__version__}))")


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
    for out in nb.cells[-1].get("outputs", []):
        for line in out.get("text", "").splitlines():
            if line.startswith("PROBE "):
                result["probe"] = json.loads(line[len("PROBE "):])
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
