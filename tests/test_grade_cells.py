"""Check cells as Jupyter runs them (issue 23): found after IPython's input transformation,
or from the checks that ran; every check call judged, the last one counting."""
from __future__ import annotations

import pytest

from lesson10 import checks
from lesson10.course.grade import course, judge, session
from lesson10.course.grade.notebook import _entries


def _nb(*sources) -> dict:
    return {"cells": [{"cell_type": "code", "source": s} for s in sources]}


@pytest.mark.parametrize("src", [
    "checks.check_ring_time(ring_time)",
    "%%time\nchecks.check_ring_time(ring_time)\n",
    "%%capture out\nchecks.check_ring_time(ring_time)",
    "%%time\n%%capture\nchecks.check_ring_time(ring_time)",
    "!echo checking\nchecks.check_ring_time(ring_time)",
    "files = !ls\nchecks.check_ring_time(ring_time)",
    "%time checks.check_ring_time(ring_time)",
    "%%timeit -n1 -r1\ncheck_ring_time(ring_time)",
    ["%matplotlib inline\n", "checks.check_ring_time(ring_time)\n"],
])
def test_a_check_cell_with_magics_or_shell_lines_is_a_check_cell(src):
    assert course.called_checks(_nb(src)) == {"ring_time"}


@pytest.mark.parametrize("src", [
    "%%writefile x.py\nchecks.check_ring_time(ring_time)",   # written, not run
    "# checks.check_ring_time(ring_time)",
    "s = 'checks.check_ring_time(ring_time)'",
    "def broken(:\n    checks.check_ring_time(ring_time)",
])
def test_text_that_does_not_run_a_check_is_no_check_cell(src):
    assert course.called_checks(_nb(src)) == set()


def test_a_check_that_ran_counts_even_where_the_cells_text_hides_it():
    ex = checks.EXERCISES["ring_time"]
    run = session.Run()
    e = judge.entry(ex, "passed", "15 cases")
    run.record((4, 0), e)
    got = {g["exercise"]: g for g in _entries(ex.notebook, _nb("exec('chec' + 'ks.check_...')"), run)}
    assert got["ring_time"] == e
    assert got["causal_work"]["status"] == "check removed" and got["causal_work"]["points"] == 0


def test_the_last_check_call_that_ran_counts():
    ex = checks.EXERCISES["ring_time"]
    run = session.Run()
    for n in range(5):
        run.record((7, n), judge.entry(ex, "failed" if n < 4 else "passed", f"try {n}"))
    assert run.verdicts["ring_time"]["message"] == "try 4" and len(run.history) == 5
    run.record((9, 0), judge.entry(ex, "failed", "later"))
    assert run.verdicts["ring_time"]["status"] == "failed"


@pytest.mark.slow
def test_matplotlib_inline_atop_the_imports_cell_costs_nothing(tmp_path):
    """The imports cell of an honest notebook opens with ``%matplotlib inline``: graded in
    full (the sandbox's shell used to raise NotImplementedError there, before ``checks``
    was imported, and the notebook scored 0)."""
    import json
    from pathlib import Path

    from lesson10.course.grade import main, sandbox
    root = Path(__file__).resolve().parents[1]
    nb = json.loads((root / "solutions" / "03_load_balance.ipynb").read_text(encoding="utf-8"))
    keep = [c for c in nb["cells"] if c["cell_type"] == "markdown" or any(
        w in "".join(c["source"]) for w in ("check_", "def ", "import"))]
    nb["cells"] = [c for c in keep if "figures." not in "".join(c["source"])
                   and "summary()" not in "".join(c["source"])]
    first = next(c for c in nb["cells"] if "from lesson10 import" in "".join(c["source"]))
    first["source"] = "%matplotlib inline\n" + "".join(first["source"])
    path = tmp_path / "ann" / "03_load_balance.ipynb"
    path.parent.mkdir()
    path.write_text(json.dumps(nb), encoding="utf-8")
    out = tmp_path / "r.json"
    extra = [] if sandbox.probe() is None else ["--no-sandbox"]
    assert main([str(path), "--output", str(out), "--no-results", "--timeout", "90", *extra]) in (0, 1)
    (rep,) = json.loads(out.read_text())["notebooks"]
    assert rep["points"] == rep["max_points"] > 0, rep["feedback"]
    assert not [f for f in rep["feedback"] if "NotImplementedError" in f], rep["feedback"]
