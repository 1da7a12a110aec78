"""`python -m lesson10 build`: notebooks/ is generated from solutions/, and --check notices."""
import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from lesson10 import build

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
EXERCISE_NOTEBOOKS = ("01_sequence_parallel", "02_ring_attention", "03_load_balance", "04_ulysses",
                      "05_moe_dispatch")


def _copy_tree(tmp_path):
    for sub in ("solutions", "notebooks"):
        shutil.copytree(ROOT / sub, tmp_path / sub)
    return tmp_path


def test_the_five_exercise_notebooks_exist():
    names = {p.stem for p in SOLUTIONS}
    for stem in EXERCISE_NOTEBOOKS:
        assert stem in names
        assert (ROOT / "notebooks" / f"{stem}.ipynb").is_file()


def test_committed_tree_is_up_to_date(capsys):
    assert build.stale(ROOT) == []
    assert build.main(["--check"]) == 0
    assert "up to date" in capsys.readouterr().out


def test_modified_solution_makes_check_fail_until_rebuilt(tmp_path, capsys):
    root = _copy_tree(tmp_path)
    path = root / "solutions" / "03_load_balance.ipynb"
    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if "def ring_time" in c.source)
    cell.source = cell.source.replace("def ring_time(work):", "def ring_time(work, unit=1):")
    nbformat.write(nb, path)
    assert build.main(["--check", "--root", str(root)]) == 1
    err = capsys.readouterr().err
    assert "notebooks/03_load_balance.ipynb" in err
    assert "01_sequence_parallel" not in err
    assert build.main(["--root", str(root)]) == 0
    assert build.main(["--check", "--root", str(root)]) == 0
    rebuilt = (root / "notebooks" / "03_load_balance.ipynb").read_text()
    assert "def ring_time(work, unit=1):" in rebuilt


def test_deleted_or_orphan_notebook_is_stale(tmp_path, capsys):
    root = _copy_tree(tmp_path)
    (root / "notebooks" / "04_ulysses.ipynb").unlink()
    shutil.copy(root / "notebooks" / "01_sequence_parallel.ipynb", root / "notebooks" / "99_old.ipynb")
    assert build.main(["--check", "--root", str(root)]) == 1
    err = capsys.readouterr().err
    assert "04_ulysses.ipynb (missing)" in err and "99_old.ipynb" in err


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.stem)
def test_regions_replaced_by_stubs_and_no_outputs(solution):
    sol = nbformat.read(solution, as_version=4)
    ex = nbformat.read(ROOT / "notebooks" / solution.name, as_version=4)
    assert len(sol.cells) == len(ex.cells)
    regions = 0
    for s_cell, e_cell in zip(sol.cells, ex.cells):
        assert s_cell.cell_type == e_cell.cell_type
        assert s_cell.get("id") == e_cell.get("id")
        for nb_cell in (s_cell, e_cell):
            if nb_cell.cell_type == "code":
                assert nb_cell.outputs == [] and nb_cell.execution_count is None
        n = s_cell.source.count(build.BEGIN)
        regions += n
        assert build.BEGIN not in e_cell.source and build.END not in e_cell.source
        assert e_cell.source.count("raise NotImplementedError") == n + \
            s_cell.source.count("raise NotImplementedError")
        if n:   # the signature and docstring stay, the body goes
            for line in s_cell.source.splitlines():
                if line.lstrip().startswith("def "):
                    assert line in e_cell.source
    if solution.stem in EXERCISE_NOTEBOOKS:
        assert regions >= 3, "each exercise notebook has several exercises"
    assert sol.metadata["kernelspec"]["name"] == "python3"


def test_every_notebook_starts_with_a_colab_badge_and_a_colab_only_install():
    for path in SOLUTIONS:
        nb = nbformat.read(path, as_version=4)
        first_md = nb.cells[0]
        assert first_md.cell_type == "markdown"
        assert "colab.research.google.com/github/" in first_md.source
        assert f"notebooks/{path.name}" in first_md.source
        first_code = next(c for c in nb.cells if c.cell_type == "code")
        assert '"google.colab" in sys.modules' in first_code.source
        assert "pip" in first_code.source and "torch" not in first_code.source


def test_strip_solutions_keeps_indentation_and_outside_lines():
    src = ("def f(x):\n"
           "    '''doc'''\n"
           "    ### BEGIN SOLUTION\n"
           "    y = x + 1\n"
           "    return y\n"
           "    ### END SOLUTION\n"
           "\n"
           "### BEGIN SOLUTION\n"
           "z = 3\n"
           "### END SOLUTION\n"
           "print('after')")
    out = build.strip_solutions(src)
    assert out.splitlines() == [
        "def f(x):", "    '''doc'''", f"    {build.STUB}", "", build.STUB, "print('after')"]
    ns = {}
    exec(out.split("\n\n")[0], ns)
    with pytest.raises(NotImplementedError):
        ns["f"](1)


@pytest.mark.parametrize("src,match", [
    ("### BEGIN SOLUTION\nx = 1\n", "never closed"),
    ("x = 1\n### END SOLUTION\n", "without"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n", "inside another"),
    ("x = 1  ### BEGIN SOLUTION\n", "alone on their line"),
])
def test_broken_markers_are_clear_errors(src, match):
    with pytest.raises(build.BuildError, match=match):
        build.strip_solutions(src, where="nb.ipynb, cell 3")


def test_outputs_are_stripped_and_output_is_deterministic(tmp_path, capsys):
    root = tmp_path
    (root / "solutions").mkdir()
    nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                               "language": "python"}})
    nb.cells = [new_markdown_cell("# t"),
                new_code_cell("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\nf()",
                              execution_count=3, outputs=[new_output("execute_result",
                                                                     data={"text/plain": "1"},
                                                                     execution_count=3)])]
    for i, cell in enumerate(nb.cells):
        cell.id = f"c{i}"
    nb.cells[1].metadata["execution"] = {"iopub.execute_input": "2026-01-01"}
    nbformat.write(nb, root / "solutions" / "x.ipynb")

    assert build.main(["--check", "--root", str(root)]) == 1     # no notebook, solution has outputs
    assert build.main(["--root", str(root)]) == 0
    first = {p: p.read_bytes() for p in root.rglob("*.ipynb")}
    for path in first:
        cell = nbformat.read(path, as_version=4).cells[1]
        assert cell.outputs == [] and cell.execution_count is None and "execution" not in cell.metadata
    assert build.main(["--root", str(root)]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in root.rglob("*.ipynb")} == first
    assert build.main(["--check", "--root", str(root)]) == 0


def test_markers_in_markdown_are_rejected(tmp_path):
    nb = new_notebook(cells=[new_markdown_cell("### BEGIN SOLUTION\nsecret\n### END SOLUTION")])
    with pytest.raises(build.BuildError, match="code cells"):
        build.exercise_notebook(nb, "x.ipynb")


def test_canonical_text_is_what_nbformat_writes():
    """The build writes with the standard library only; its text must equal nbformat's."""
    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for mine in (build.clean(nb), build.exercise_notebook(nb, path.name)):
            theirs = nbformat.writes(nbformat.from_dict(mine), version=4)
            assert build.dumps(mine) == theirs + "\n", path.name
