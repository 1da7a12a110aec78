"""``python -m lesson10 release --self-study DIR``: the self-study edition of the course.

The same notebooks as the student repository, for someone learning alone: after each
exercise cell comes a markdown cell holding the solved cell (the code of ``solutions/``, its
``### BEGIN/END SOLUTION`` marker lines left out) inside a closed ``<details>`` fold::

    <details>
    <summary>Solution</summary>

    ```python
    def ring_time(work):
        ...
    ```

    </details>

A fold is plain HTML and markdown, so it opens on a click and stays closed until then in
Colab, JupyterLab, Notebook 6/7 and GitHub's renderer alike (collapsed-source metadata is
understood by some frontends only). Each fold cell carries ``metadata["lesson10"]["solution"]``
(the exercise cell's id), so tools can find them. The check cells are unchanged: a student who
pastes the fold into the cell above passes the check.

The edition has no grading files: no Classroom workflow, no Gradescope bundle, and its README
speaks of learning, not of grades::

    DIR/
      lesson10/               the package (the check cells import it)
      notebooks/*.ipynb       the exercise notebooks, each exercise followed by its fold
      pyproject.toml          so that `pip install -e DIR` works
      README.md               for self-study, a link per notebook
      .gitignore, .lesson10-release.json   ({"edition": "self-study", ...})

This module makes the notebooks and the README; :func:`lesson10.course.release.self_study`
writes them, and refuses a folder that holds a graded release (the student repository that
Classroom copies: its class would see the solutions) unless forced.
"""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

from ..errors import Lesson10Error
from .build import BADGE_PREFIX, BEGIN, END, dumps

EDITION = "self-study"
SUMMARY = "Solution"
README_TITLE = "# Lesson 10: sequence, context and expert parallelism (self-study edition)"


class EditionError(Lesson10Error, ValueError):
    """The self-study edition cannot be written (no notebooks, or a fold came out wrong)."""


def solved_code(source: str) -> str:
    """A solved cell's code without its solution marker lines (what a student pastes)."""
    lines = [line for line in source.split("\n") if line.strip() not in (BEGIN, END)]
    return "\n".join(lines).strip("\n")


def fold_source(code: str) -> str:
    """The markdown of a closed fold holding ``code`` in a python code block (its fence is
    longer than any run of backticks in the code)."""
    longest = max((len(run) for run in re.findall(r"`+", code)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"<details>\n<summary>{SUMMARY}</summary>\n\n{fence}python\n{code}\n{fence}\n\n</details>"


_FOLD_RE = re.compile(r"\A<details>\n<summary>" + SUMMARY + r"</summary>\n\n(`{3,})python\n(.*)\n\1\n\n</details>\Z",
                      re.DOTALL)


def fold_code(markdown: str) -> str | None:
    """The code of a fold that :func:`fold_source` wrote (None: ``markdown`` is no such fold)."""
    m = _FOLD_RE.match(markdown)
    return m.group(2) if m else None


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _fold_cell(exercise: dict, solved: dict, taken: set) -> dict:
    """The markdown cell that follows ``exercise``: the fold of ``solved``'s code."""
    ref = exercise.get("id")
    cell: dict = {"cell_type": "markdown", "metadata": {"lesson10": {"solution": ref}},
                  "source": fold_source(solved_code(_source(solved)))}
    if ref is not None:                                   # nbformat 4.5: every cell has a unique id
        new = f"{ref}-solution"
        while new in taken:
            new += "-1"
        taken.add(new)
        cell["id"] = new
    return cell


def _without_badge(cell: dict) -> dict:
    """The first cell without the build's Colab badge line (it opens the graded edition)."""
    head, _, rest = _source(cell).partition("\n")
    if head.startswith(BADGE_PREFIX):
        cell = {**cell, "source": rest.lstrip("\n")}
    return cell


def edition_notebook(solution: dict, exercise: dict, name: str = "notebook") -> dict:
    """``exercise`` (a built exercise notebook) with a fold of the solved cell after each
    exercise cell (a code cell of ``solution`` with a solution region) and no Colab badge."""
    cells, solved = exercise["cells"], solution["cells"]
    if len(cells) != len(solved) or any(a["cell_type"] != b["cell_type"] for a, b in zip(cells, solved)):
        raise EditionError(f"{name}: the exercise notebook does not match its solution cell by cell; "
                         f"run `python -m lesson10 build`")
    nb = copy.deepcopy(exercise)
    taken = {c.get("id") for c in cells}
    out = []
    for index, (cell, answer) in enumerate(zip(nb["cells"], solved)):
        out.append(_without_badge(cell) if index == 0 else cell)
        if answer["cell_type"] == "code" and BEGIN in _source(answer):
            out.append(_fold_cell(cell, answer, taken))
    nb["cells"] = out
    return nb


def _is_fold(cell: dict) -> bool:
    return cell["cell_type"] == "markdown" and "<details" in _source(cell)


def problems(edition: dict, solution: dict, name: str = "notebook") -> list[str]:
    """What is wrong with an edition notebook, against its solution notebook: an exercise not
    followed by exactly one closed fold of its solved code, or a fold anywhere else."""
    found: list[str] = []
    cells = edition["cells"]
    plain = [i for i, c in enumerate(cells) if not _is_fold(c)]
    if [cells[i]["cell_type"] for i in plain] != [c["cell_type"] for c in solution["cells"]]:
        return [f"{name}: its cells (folds aside) are not those of its solution notebook"]
    for i, answer in zip(plain, solution["cells"]):
        folds = []
        for cell in cells[i + 1:]:
            if not _is_fold(cell):
                break
            folds.append(cell)
        exercise = answer["cell_type"] == "code" and BEGIN in _source(answer)
        if not exercise:
            if folds:
                found.append(f"{name}, cell {i}: a fold after a cell that is no exercise")
            continue
        if len(folds) != 1:
            found.append(f"{name}, cell {i}: an exercise followed by {len(folds)} folds, not 1")
            continue
        code = fold_code(_source(folds[0]))
        if code is None:
            found.append(f"{name}, cell {i + 1}: not a closed <details> fold of one code block")
        elif code != solved_code(_source(answer)):
            found.append(f"{name}, cell {i + 1}: the fold's code is not the solved cell's")
    return found


def readme(names: list[str]) -> str:
    """The edition's README: what it is, a link per notebook, how to run them."""
    rows = "\n".join(f"- [`{n}`](notebooks/{n})" for n in names)
    return f"""{README_TITLE}

Notebooks for learning on your own. Each exercise asks for one function, and the check cell
after it tells you at once whether your function is right, and if not, what differs, where,
and a hint. Under every exercise a folded **{SUMMARY}** holds the course's answer: try first,
open it when you are done or stuck. Pasted into the exercise cell, it passes the check.

{rows}

## Running them

**In Colab**: *File -> Open notebook -> GitHub*, this repository, then a notebook. Its first
code cell installs the course package (a few seconds).

**On your machine**, with Python 3.10 or newer:

```bash
python -m venv .venv && . .venv/bin/activate
pip install -e .          # the course package (lesson10) from this folder
pip install jupyterlab
jupyter lab notebooks/
```

Run a notebook top to bottom: an exercise you have not written yet prints "not attempted",
and the cells after it use the course's reference instead. Nothing here is graded.
"""


def files(built: dict[Path, str]) -> dict[str, str]:
    """The edition's notebooks and README (relative path -> text) from the build's plan
    (:func:`lesson10.course.build.plan`: the solution and exercise notebooks' texts); each
    notebook is checked with :func:`problems` first."""
    texts = {(p.parent.name, p.name): t for p, t in built.items()}
    names = sorted(n for kind, n in texts if kind == "notebooks")
    if not names:
        raise EditionError("no notebooks to write: solutions/ holds none")
    out = {"README.md": readme(names)}
    for name in names:
        solution, exercise = (json.loads(texts[kind, name]) for kind in ("solutions", "notebooks"))
        nb = edition_notebook(solution, exercise, name)
        wrong = problems(nb, solution, name)
        if wrong:
            raise EditionError("the self-study edition came out wrong:\n  " + "\n  ".join(wrong))
        out[f"notebooks/{name}"] = dumps(nb)
    return out
