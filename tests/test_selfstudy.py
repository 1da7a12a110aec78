"""``python -m lesson10 release --self-study DIR``: every exercise is followed by one closed
fold of its solved cell, the check cells are those of the exercise notebooks, the edition has
no grading files, and with the folds pasted in every check passes."""
from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from lesson10.course import release, selfstudy
from lesson10.course.build import BADGE_PREFIX, BEGIN, END, STUB, plan

ROOT = Path(__file__).resolve().parent.parent
NAMES = sorted(p.name for p in (ROOT / "solutions").glob("*.ipynb"))


@pytest.fixture(scope="module")
def edition(tmp_path_factory):
    folder = tmp_path_factory.mktemp("selfstudy") / "edition"
    proc = subprocess.run([sys.executable, "-m", "lesson10", "release", "--self-study", str(folder)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "no grading files" in proc.stdout
    return folder


def _nb(folder: Path, name: str) -> dict:
    return json.loads((folder / "notebooks" / name).read_text(encoding="utf-8"))


def _solution(name: str) -> dict:
    return json.loads(next(t for p, t in plan(ROOT).items() if p.parent.name == "solutions" and p.name == name))


def _src(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


class _Fold(HTMLParser):
    """A rendered fold: the attributes of each <details>, the summary text, the code text."""

    def __init__(self):
        super().__init__()
        self.details, self.summary, self.code, self._in = [], "", "", None

    def handle_starttag(self, tag, attrs):
        if tag == "details":
            self.details.append(dict(attrs))
        elif tag in ("summary", "code"):
            self._in = tag

    def handle_endtag(self, tag):
        if tag == self._in:
            self._in = None

    def handle_data(self, data):
        if self._in == "summary":
            self.summary += data
        elif self._in == "code":
            self.code += data


def _rendered(markdown: str) -> _Fold:
    """The fold as a CommonMark renderer (mistune, nbconvert's) turns it into HTML."""
    mistune = pytest.importorskip("mistune")
    parser = _Fold()
    parser.feed(mistune.html(markdown))
    return parser


# ----------------------------------------------------------------------------------- structure
def test_the_edition_has_notebooks_and_the_package_and_no_grading_files(edition):
    top = sorted(p.name for p in edition.iterdir())
    assert top == sorted([".gitignore", release.MARKER, "README.md", "lesson10", "notebooks", "pyproject.toml"])
    assert sorted(p.name for p in (edition / "notebooks").iterdir()) == NAMES
    assert not (edition / ".github").exists() and not list(edition.rglob("*.zip"))
    assert not any(p.name == "solutions" for p in edition.rglob("*"))
    meta = json.loads((edition / release.MARKER).read_text())
    assert meta["edition"] == selfstudy.EDITION
    readme = (edition / "README.md").read_text()
    assert "graded" in readme and "Classroom" not in readme and "workflow" not in readme
    for name in NAMES:
        assert f"(notebooks/{name})" in readme


@pytest.mark.parametrize("name", NAMES)
def test_every_exercise_is_followed_by_one_closed_fold_of_its_solution(edition, name):
    nb, solution = _nb(edition, name), _solution(name)
    assert selfstudy.problems(nb, solution, name) == []
    exercises = [c for c in solution["cells"] if c["cell_type"] == "code" and BEGIN in _src(c)]
    folds = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "markdown" and "<details" in _src(c)]
    assert len(folds) == len(exercises) > 0
    regions = [body for nb_name, body in release._solution_regions(ROOT) if nb_name == name]
    shown = []
    for i, answer in zip(folds, exercises):
        before, fold = nb["cells"][i - 1], _src(nb["cells"][i])
        assert before["cell_type"] == "code" and STUB in _src(before), (name, i)
        assert nb["cells"][i + 1]["cell_type"] != "markdown" or "<details" not in _src(nb["cells"][i + 1])
        page = _rendered(fold)
        assert page.details == [{}], (name, i, page.details)        # one fold, no "open"
        assert page.summary.strip() == selfstudy.SUMMARY
        code = page.code.rstrip("\n")
        assert code == selfstudy.solved_code(_src(answer)), (name, i)
        assert BEGIN not in code and END not in code and STUB not in code
        assert nb["cells"][i]["metadata"]["lesson10"]["solution"] == before["id"]
        shown.append("\n".join(line.strip() for line in code.splitlines() if line.strip()))
    for body in regions:                             # every solution region of the notebook, in a fold
        assert any(body in code for code in shown), (name, body[:80])
    assert len({c["id"] for c in nb["cells"]}) == len(nb["cells"])


@pytest.mark.parametrize("name", NAMES)
def test_apart_from_the_folds_the_notebook_is_the_exercise_notebook(edition, name):
    nb = _nb(edition, name)
    exercise = json.loads(next(t for p, t in plan(ROOT).items() if p.parent.name == "notebooks" and p.name == name))
    rest = [c for c in nb["cells"] if "lesson10" not in c["metadata"]]
    first = _src(exercise["cells"][0])
    assert first.startswith(BADGE_PREFIX) and not _src(rest[0]).startswith(BADGE_PREFIX)
    exercise["cells"][0]["source"] = first.partition("\n")[2].lstrip("\n")
    assert [(c["cell_type"], _src(c), c["metadata"]) for c in rest] == \
        [(c["cell_type"], _src(c), c["metadata"]) for c in exercise["cells"]]
    assert nb["metadata"] == exercise["metadata"]


def test_a_fold_survives_backticks_and_html_characters():
    code = 'def f(x):\n    """``x`` & <y> ```\n    ```` fence"""\n\n    return x < 2 and "</details>"'
    page = _rendered(selfstudy.fold_source(code))
    assert page.code.rstrip("\n") == code and page.details == [{}]
    assert selfstudy.fold_code(selfstudy.fold_source(code)) == code


def test_problems_finds_a_missing_a_second_an_open_and_a_wrong_fold(edition):
    name = "03_load_balance.ipynb"
    nb, solution = _nb(edition, name), _solution(name)
    folds = [i for i, c in enumerate(nb["cells"]) if "lesson10" in c["metadata"]]

    def broken(change):
        copy_ = copy.deepcopy(nb)
        change(copy_["cells"])
        return selfstudy.problems(copy_, solution, name)

    assert any("followed by 0 folds" in p for p in broken(lambda cells: cells.pop(folds[0])))
    assert any("followed by 2 folds" in p for p in broken(lambda cells: cells.insert(folds[0], cells[folds[0]])))

    def opened(cells):
        cells[folds[1]]["source"] = _src(cells[folds[1]]).replace("<details>", "<details open>")
    assert any("not a closed" in p for p in broken(opened))

    def other(cells):
        cells[folds[1]] = copy.deepcopy(cells[folds[0]])
    assert any("not the solved cell's" in p for p in broken(other))

    def stray(cells):
        cells.insert(3, copy.deepcopy(cells[folds[0]]))
    assert any("no exercise" in p for p in broken(stray))
    assert any("not those of its solution" in p for p in broken(lambda cells: cells.pop(2)))


# ----------------------------------------------------------------------------------- refusals
def test_the_edition_refuses_a_graded_release_and_rewrites_an_earlier_edition(tmp_path):
    graded = tmp_path / "student-repo"
    release.release(graded)
    with pytest.raises(release.ReleaseError, match="graded release"):
        release.self_study(graded)
    assert (graded / ".github" / "workflows" / "classroom.yml").is_file()
    assert release.leaks(graded, release._solution_regions(ROOT)) == []      # nothing written
    folder = tmp_path / "edition"
    release.self_study(folder)
    (folder / "stale.txt").write_text("from an earlier edition")
    release.self_study(folder)
    assert not (folder / "stale.txt").exists()
    release.self_study(graded, force=True)
    assert not (graded / ".github").exists()
    with pytest.raises(release.ReleaseError, match="inside the course repository"):
        release.self_study(ROOT / "build" / "selfstudy")
    release.release(tmp_path / "again")
    proc = subprocess.run([sys.executable, "-m", "lesson10", "release", "--self-study", str(tmp_path / "again")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and "graded release" in proc.stderr


# ----------------------------------------------------------------------------------- running
def _run(nb: dict, strict: bool) -> dict:
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    node = nbformat.reads(json.dumps(nb), as_version=4)
    before = os.environ.pop("LESSON10_STRICT_CHECKS", None)
    if strict:                                       # a failed or unattempted check raises
        os.environ["LESSON10_STRICT_CHECKS"] = "1"
    try:
        nbclient.NotebookClient(node, timeout=300, kernel_name="python3",
                                resources={"metadata": {"path": str(ROOT)}}).execute()
    finally:
        os.environ.pop("LESSON10_STRICT_CHECKS", None)
        if before is not None:
            os.environ["LESSON10_STRICT_CHECKS"] = before
    return node


def _text(cell) -> str:
    return "".join(o.get("text", "") or str(o.get("data", {}).get("text/plain", "")) for o in cell.get("outputs", []))


def _pasted(nb: dict) -> dict:
    """The notebook with each fold's code pasted over the exercise cell before it."""
    nb = copy.deepcopy(nb)
    for i, cell in enumerate(nb["cells"]):
        code = selfstudy.fold_code(_src(cell)) if cell["cell_type"] == "markdown" else None
        if code is not None:
            nb["cells"][i - 1]["source"] = code
    return nb


def _check_outputs(node) -> list[str]:
    return [_text(c) for c in node.cells
            if c.cell_type == "code" and re.match(r"checks\.check_\w+\(", c.source.strip())]


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in NAMES if not n.startswith("06")])
def test_with_the_folds_pasted_in_every_check_passes(edition, name):
    """The edition as given is the exercise notebook plus markdown (nbval runs notebooks/);
    with each fold pasted over its exercise, every check passes (strict: none may fail)."""
    nb = _nb(edition, name)
    solved = _check_outputs(_run(_pasted(nb), strict=True))
    assert len(solved) == sum(1 for c in nb["cells"] if "lesson10" in c["metadata"])
    assert all(re.search(r"\bpass", t) and "not attempted" not in t for t in solved), solved
