"""`python -m lesson10 grade`: run notebooks in a fresh kernel and score their checks.

Each graded notebook starts a Jupyter kernel (a few seconds), so this file grades as
few notebooks as possible: one solved and one exercise notebook together, and one tiny
synthetic notebook for the failure paths.
"""
import json
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from lesson10 import checks, grade

ROOT = Path(__file__).resolve().parent.parent
NB = "03_load_balance.ipynb"          # the quickest of the five


def test_expected_exercises_come_from_the_course_not_only_from_the_cells():
    nb = nbformat.read(ROOT / "notebooks" / NB, as_version=4)
    wanted = [ex for ex, e in checks.EXERCISES.items() if e.notebook == "03_load_balance"]
    assert grade.expected_exercises(nb, NB) == wanted
    # a student who deletes a check cell still owes that exercise
    nb.cells = [c for c in nb.cells if "check_ring_time(" not in c.source]
    assert "ring_time" in grade.expected_exercises(nb, NB)
    # the other checks identify the notebook even under another file name
    assert grade.expected_exercises(nb, "renamed.ipynb") == wanted
    assert grade.expected_exercises(new_notebook(), "renamed.ipynb") == []


def test_solution_scores_full_and_exercise_notebook_scores_zero(tmp_path, capsys):
    out = tmp_path / "report.json"
    status = grade.main([str(ROOT / "solutions" / NB), str(ROOT / "notebooks" / NB),
                         "--json", "--output", str(out), "--timeout", "120"])
    report = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text()) == report
    solved, blank = report["notebooks"]
    assert solved["ok"] and blank["ok"]
    n_points = sum(e.points for e in checks.EXERCISES.values() if e.notebook == "03_load_balance")
    assert solved["points"] == solved["max_points"] == n_points
    assert all(e["status"] == "passed" for e in solved["exercises"])
    assert blank["points"] == 0 and blank["max_points"] == n_points
    assert all(e["status"] == "not attempted" for e in blank["exercises"])
    assert blank["errors"] == []                  # the exercise notebook runs clean
    assert status == 1                            # not everything passed


def test_failed_and_missing_checks_and_the_table(tmp_path, capsys):
    nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                               "language": "python"}})
    nb.cells = [
        new_code_cell("from lesson10 import checks\nimport numpy as np"),
        new_code_cell("def ring_time(work):\n    return np.asarray(work).max(axis=1).sum()"),
        new_code_cell("checks.check_ring_time(ring_time)"),
        new_code_cell("def causal_work(positions):\n    return np.zeros((len(positions),) * 2)"),
        new_code_cell("checks.check_causal_work(causal_work)"),          # fails: CheckFailed
        new_code_cell("raise RuntimeError('student cell crashed')"),
        new_code_cell("checks.check_zigzag_positions(lambda s, n: None)"),  # fails, after a crash
    ]
    path = tmp_path / "03_load_balance_submission.ipynb"
    nbformat.write(nb, path)
    status = grade.main([str(path), "--timeout", "60"])
    table = capsys.readouterr().out
    assert status == 1
    rows = {line.split()[1]: line for line in table.splitlines() if line.startswith(str(path))}
    assert "passed" in rows["ring_time"] and "1/1" in rows["ring_time"]
    assert "failed" in rows["causal_work"] and "0/2" in rows["causal_work"]
    assert "failed" in rows["zigzag_positions"]
    assert "RuntimeError: student cell crashed" in table
    total = table.splitlines()[-1]
    assert total.startswith("total") and total.split()[-1] == "1/4"


def test_missing_file_is_exit_status_2(tmp_path, capsys):
    assert grade.main([str(tmp_path / "nope.ipynb")]) == 2
    assert "no such file" in capsys.readouterr().out
