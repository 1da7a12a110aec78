"""`python -m lesson10 build`: notebooks/ is generated from solutions/, and --check notices."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from lesson10.course import build

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
EXERCISE_NOTEBOOKS = ("01_sequence_parallel", "02_ring_attention", "03_load_balance", "04_ulysses",
                      "05_moe_dispatch")


def _copy_tree(tmp_path):
    for sub in ("solutions", "notebooks"):
        shutil.copytree(ROOT / sub, tmp_path / sub)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _set_repository(root, repository, ref):
    """An instructor's course.toml at ``root`` with only its [release]."""
    (root / "course.toml").write_text(f'[release]\nrepository = "{repository}"\nref = "{ref}"\n')


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


def test_every_notebook_starts_with_a_colab_badge_and_an_install_cell():
    repository, ref = build.repository_setting(ROOT)
    version = build.version_setting(ROOT)
    for path in SOLUTIONS:
        nb = nbformat.read(path, as_version=4)
        first_md = nb.cells[0]
        assert first_md.cell_type == "markdown"
        assert "colab.research.google.com/github/" in first_md.source
        assert f"notebooks/{path.name}" in first_md.source
        first_code = next(c for c in nb.cells if c.cell_type == "code")
        assert first_code.source.startswith(build.INSTALL_MARK)
        assert f'_install_lesson10("{build.install_url(repository, ref)}", "{version}"' in first_code.source
        assert "google.colab" not in first_code.source        # the same cell wherever it runs
        assert "--force-reinstall" not in first_code.source and "--no-deps" not in first_code.source
        # only notebook 06 runs torch: only its cell asks for the spmd extra (where torch is missing)
        assert ('extra="spmd", unless="torch"' in first_code.source) == path.stem.startswith("06")


def test_release_version_ref_and_notebooks_agree():
    """A release is one version number: pyproject's, the package's, the tag that ref names,
    and the version every notebook's install cell asks for."""
    import lesson10
    version = build.version_setting(ROOT)
    _, ref = build.repository_setting(ROOT)
    assert version == lesson10.__version__ and re.fullmatch(r"\d+\.\d+\.\d+", version)
    assert version != "0.1.0", "notebooks of 0.1.0 could not tell the old package from the new"
    assert ref == f"v{version}", f"[release] ref should be the release tag v{version}, not {ref!r}"
    for path in SOLUTIONS + [ROOT / "notebooks" / p.name for p in SOLUTIONS]:
        install = next(c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code").source
        assert f'@{ref}", "{version}"' in install, path


def test_notebook_extra_is_spmd_only_where_torch_is_used():
    def nb(*sources):
        return new_notebook(cells=[new_markdown_cell("# t")] + [new_code_cell(s) for s in sources])
    assert build.notebook_extra(nb("import numpy as np", "from lesson10 import sim")) is None
    assert build.notebook_extra(nb("x = 1", "import torch")) == "spmd"
    assert build.notebook_extra(nb("from lesson10.spmd import workers")) == "spmd"
    assert build.notebook_extra(nb("from lesson10.bench.cstar import cstar_sweep")) == "spmd"
    assert build.notebook_extra(nb("# import torch would be nice", "print('torchvision')")) is None
    assert build.notebook_extra(nb(build.install_cell_source("o/n", "v1", "1.0", "spmd"), "x = 1")) is None


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
    _set_repository(root, "me/course", "v1")

    assert build.main(["--check", "--root", str(root)]) == 1     # no notebook, solution has outputs
    assert build.main(["--root", str(root)]) == 0
    first = {p: p.read_bytes() for p in root.rglob("*.ipynb")}
    for path in first:
        cell = nbformat.read(path, as_version=4).cells[2]       # [1] is the install cell the build added
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


# ------------------------------------------------------------------ the repository setting
def _badges_and_installs(root):
    """Every GitHub address written in the notebooks (badge targets and pip URLs)."""
    found = []
    for sub in ("solutions", "notebooks"):
        for path in sorted((root / sub).glob("*.ipynb")):
            found += re.findall(r"(?:colab\.research\.google\.com/github/|git\+https://github\.com/)"
                                r"[^\s\")\\]+", path.read_text())
    return found


def test_every_badge_and_install_cell_comes_from_pyproject():
    repository, ref = build.repository_setting(ROOT)
    found = _badges_and_installs(ROOT)
    assert len(found) == 2 * 2 * len(SOLUTIONS)          # a badge and an install URL per notebook, both trees
    for address in found:
        assert f"/{repository}/blob/{ref}/notebooks/" in address or address == f"git+https://github.com/{repository}@{ref}"


def test_pointing_at_a_fork_rewrites_all_24_addresses_and_check_notices(tmp_path, capsys):
    root = _copy_tree(tmp_path)
    _set_repository(root, "someone/my-fork", "v2.1")
    assert build.main(["--check", "--root", str(root)]) == 1
    err = capsys.readouterr().err
    assert err.count("disagrees with [release] someone/my-fork@v2.1") == 2 * len(SOLUTIONS)
    assert build.main(["--root", str(root)]) == 0
    assert build.main(["--check", "--root", str(root)]) == 0
    found = _badges_and_installs(root)
    assert len(found) == 4 * len(SOLUTIONS)
    assert all("someone/my-fork" in a and ("@v2.1" in a or "/blob/v2.1/" in a) for a in found), found
    assert not any("lesson10-course" in p.read_text() for p in root.rglob("*.ipynb"))
    nb = nbformat.read(root / "notebooks" / "02_ring_attention.ipynb", as_version=4)
    assert nb.cells[0].source.startswith(
        "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
        "(https://colab.research.google.com/github/someone/my-fork/blob/v2.1/notebooks/"
        "02_ring_attention.ipynb)\n\n# 02")


def test_hand_edited_install_cell_makes_check_fail(tmp_path, capsys):
    root = _copy_tree(tmp_path)
    path = root / "notebooks" / "05_moe_dispatch.ipynb"
    _, ref = build.repository_setting(root)
    path.write_text(path.read_text().replace(f"@{ref}", "@dev"))
    assert build.main(["--check", "--root", str(root)]) == 1
    err = capsys.readouterr().err
    assert "notebooks/05_moe_dispatch.ipynb (its install cell disagrees" in err
    assert "solutions/05_moe_dispatch" not in err


@pytest.mark.parametrize("repository,ref,match", [
    ("lesson10", "main", "owner/name"),
    ("a/b c", "main", "owner/name"),
    ("https://github.com/a/b", "main", "owner/name"),
    ("../b", "main", "owner/name"),
    ("a/b", "", "branch, tag or commit"),
    ("a/b", "x y", "branch, tag or commit"),
    ("a/b", "../etc", "branch, tag or commit"),
])
def test_bad_repository_setting_is_a_clear_error(tmp_path, capsys, repository, ref, match):
    root = _copy_tree(tmp_path)
    _set_repository(root, repository, ref)
    assert build.main(["--check", "--root", str(root)]) == 2
    assert match in capsys.readouterr().err


def test_a_bad_course_file_is_a_clear_error(tmp_path, capsys):
    root = _copy_tree(tmp_path)
    _set_repository(root, "not a repository", "v1")
    assert build.main(["--root", str(root)]) == 2
    assert "release.repository = 'not a repository' is no GitHub repository" in capsys.readouterr().err


def test_missing_badge_and_install_cell_are_added():
    nb = new_notebook(cells=[new_markdown_cell("# Title"), new_code_cell("x = 1")])
    for i, cell in enumerate(nb.cells):
        cell.id = f"c{i}"
    out = build.apply_repository(nb, "07_x.ipynb", "o/n", "main")
    assert [c["cell_type"] for c in out["cells"]] == ["markdown", "code", "code"]
    assert out["cells"][0]["source"] == build.badge_line("o/n", "main", "07_x.ipynb") + "\n\n# Title"
    assert out["cells"][1]["source"] == build.install_cell_source("o/n", "main")
    assert out["cells"][1]["id"] not in {"c0", "c1"} and out["cells"][2]["source"] == "x = 1"
    again = build.apply_repository(out, "07_x.ipynb", "o/n", "main")
    assert again == out                                    # idempotent: no second badge or cell


# The install cell's decisions, in a child interpreter (it edits sys.modules) with pip, the
# installed metadata and the import system replaced by fakes. The real installs (Colab-like,
# plain Jupyter, an update over an older release) are in tests/test_colab.py.
_CELL_PROBE = r"""
import contextlib, importlib.metadata, importlib.util, io, json, subprocess, sys, types
cell, states = sys.argv[1], json.loads(sys.argv[2])
real_find = importlib.util.find_spec

def version(name):
    if name == "lesson10" and state["have"] is not None:
        return state["have"]
    raise importlib.metadata.PackageNotFoundError(name)

def find_spec(name, *a):
    if name == "lesson10":
        origin = "/x/lesson10/__init__.py" if state["have"] or state.get("checkout") == "package" else None
        return types.SimpleNamespace(origin=origin) if origin or state.get("checkout") else None
    if name == "torch":
        return object() if state["torch"] else None
    return real_find(name, *a)

def run(cmd, **kw):
    calls.append({"cmd": cmd, "kw": kw})
    state["have"] = "0.2.0"
    return types.SimpleNamespace(returncode=0)

importlib.metadata.version, importlib.util.find_spec, subprocess.run = version, find_spec, run
out = []
for state in states:
    calls = []
    sys.modules["lesson10.fake_old_module"] = types.ModuleType("lesson10.fake_old_module")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(cell, {"__name__": "__main__"})
    out.append({"calls": calls, "purged": "lesson10.fake_old_module" not in sys.modules,
                "printed": printed.getvalue()})
print(json.dumps(out))
"""


def _run_cell(cell, *cases):
    """Run ``cell`` once per case ``(have, torch, checkout)`` (all in one child interpreter);
    a ``(result, printed)`` per case."""
    import json
    states = [{"have": have, "torch": torch, "checkout": checkout} for have, torch, checkout in cases]
    proc = subprocess.run([sys.executable, "-c", _CELL_PROBE, cell, json.dumps(states)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return [(r, r["printed"]) for r in json.loads(proc.stdout)]


def test_install_cell_installs_where_missing_or_older_and_nowhere_else():
    url = "git+https://github.com/o/n@v0.2.0"
    cell = build.install_cell_source("o/n", "v0.2.0", "0.2.0")
    older, current = (None, "0.1.0", "0.1.9.dev3"), ("0.2.0", "0.10.0", "1.0")
    runs = iter(_run_cell(cell, *[(have, True, False) for have in older + current],
                          (None, True, "package"), (None, True, "folder"), ("0.2.0", False, False)))
    for have in older:
        result, printed = next(runs)
        (call,) = result["calls"]
        assert call["cmd"][1:] == ["-m", "pip", "install", "-q", url] and call["kw"] == {}
        assert result["purged"], "an older lesson10 imported earlier must not shadow the new one"
        assert "installed lesson10 0.2.0" in printed and (have is None or f"(was {have})" in printed)
    for have in current:
        result, printed = next(runs)
        assert result["calls"] == [] and f"lesson10 {have} is installed: nothing to do" in printed
    result, printed = next(runs)                                  # importable, not installed
    assert result["calls"] == [] and "source checkout" in printed
    result, printed = next(runs)                                  # a clone named lesson10 next to it
    assert len(result["calls"]) == 1 and "installed lesson10" in printed
    result, _ = next(runs)                                        # 01-05 never ask for torch
    assert result["calls"] == []


def test_install_cell_of_a_torch_notebook_adds_the_extra_only_where_torch_is_missing():
    url = "git+https://github.com/o/n@v0.2.0"
    cell = build.install_cell_source("o/n", "v0.2.0", "0.2.0", extra="spmd")
    no_torch = (None, "0.1.0", "0.2.0")
    runs = iter(_run_cell(cell, (None, True, False), ("0.2.0", True, False),
                          *[(have, False, False) for have in no_torch]))
    result, _ = next(runs)                                        # Colab, Kaggle: torch is there
    assert [c["cmd"][-1] for c in result["calls"]] == [url]
    result, _ = next(runs)
    assert result["calls"] == []
    for have in no_torch:                                         # no torch: lesson10[spmd] brings it
        result, printed = next(runs)
        assert [c["cmd"][-1] for c in result["calls"]] == [f"lesson10[spmd] @ {url}"], have
        assert "the spmd extra" in printed


def test_toml_sections_come_from_the_course_files_parser():
    text = (ROOT / "pyproject.toml").read_text()
    assert build._toml_section(text, "project")["version"] == build.version_setting(ROOT)
    assert "lesson10" not in build._toml_section(text, "tool"), "[tool.lesson10] moved to course.toml"



def test_build_check_runs_with_the_standard_library_only():
    """`python lesson10/course/build.py --check` with no site-packages at all (-S -I): instructors and CI
    can check the notebooks with any python3, outside the venv."""
    proc = subprocess.run([sys.executable, "-S", "-I", str(ROOT / "lesson10" / "course" / "build.py"), "--check"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "up to date" in proc.stdout


def test_install_cell_offline_says_how_to_install_from_a_local_copy(tmp_path):
    """The real cell in a fresh Python without lesson10 (``-I``: no site, no checkout on the
    path), with pip pointed at an index and a URL nothing answers on: one sentence on what
    failed and how to install from a local copy, no traceback, and the cell returns."""
    for extra in (None, "spmd"):
        cell = build.install_cell_source("o/n", "v9.9.9", "9.9.9", extra)
        cell = cell.replace("git+https://github.com/o/n@v9.9.9", "http://127.0.0.1:9/lesson10.zip")
        env = dict(os.environ, PIP_INDEX_URL="http://127.0.0.1:9/simple", PIP_NO_INPUT="1",
                   PIP_RETRIES="0", PIP_TIMEOUT="2", PIP_DISABLE_PIP_VERSION_CHECK="1",
                   PIP_FIND_LINKS="", PIP_NO_CACHE_DIR="1")
        code = cell
        proc = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True,
                              timeout=600, env=env, cwd=tmp_path)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0 and "Traceback" not in out, out
        assert "CalledProcessError" not in out, out
        said = [ln for ln in proc.stdout.splitlines() if ln.startswith("pip could not install")]
        assert len(said) == 1 and "pip install -e" in said[0] and "wheel" in said[0], proc.stdout
        assert said[0].count(". ") == 0 and said[0].endswith("run this cell again."), said
        assert ("[spmd]" in said[0]) == (extra is not None), said
