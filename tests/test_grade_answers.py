"""Every answer of the answer suites gets the same verdict from the grader as from its check
cell: the right ones pass, the wrong ones fail (tests/test_checks_answers.py shows the check
cells' verdicts for 20 seeds each).

The answers reach the sandbox the way a student's helper module does: the answer files lie
beside the graded notebooks, whose cells import them. Each graded notebook holds, for every
exercise of one course notebook, the i-th right (or wrong) answer and its check cell, so the
whole suite is graded in one batch.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import test_checks_answers as T
from redteam import clock

from lesson10.course.grade import course, sandbox

pytestmark = pytest.mark.slow   # a whole command end to end: make test-slow

HERE = Path(__file__).resolve().parent
PY3 = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
       "language_info": {"name": "python"}}


def _cell(source: str) -> dict:
    return {"cell_type": "code", "metadata": {}, "source": source, "outputs": [],
            "execution_count": None}


def _notebooks():
    """``{file name: (course notebook, {exercise: (table, index)})}``."""
    out = {}
    for table_name in ("RIGHT", "WRONG"):
        table = getattr(T, table_name)
        for nb_id in course.course_notebooks():
            exs = [ex.id for ex in course.exercises(nb_id) if ex.id in table]
            if not exs:
                continue
            for i in range(max(len(table[ex]) for ex in exs)):
                chosen = {ex: (table_name, i) for ex in exs if i < len(table[ex])}
                out[f"{nb_id}-{table_name.lower()}{i}.ipynb"] = (nb_id, chosen)
    return out


def _write(folder: Path, nb_id: str, chosen: dict, calls: int = 1) -> None:
    """``folder/NB.ipynb``: each chosen answer, then ``calls`` cells calling its check."""
    cells = [_cell("import numpy as np\nfrom lesson10 import checks\nimport test_checks_answers as T")]
    for ex, (table, i) in chosen.items():
        name = course.function_name(ex)
        cells.append(_cell(f"{name} = T.{table}[{ex!r}][{i}]"))
        cells += [_cell(f"checks.check_{ex}({name})") for _ in range(calls)]
    nb = {"cells": cells, "metadata": dict(PY3, lesson10={"notebook": nb_id}),
          "nbformat": 4, "nbformat_minor": 5}
    (folder / f"{nb_id}.ipynb").write_text(json.dumps(nb), encoding="utf-8")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("answers")
    plan = _notebooks()
    paths = []
    for fname, (nb_id, chosen) in plan.items():
        folder = tmp / fname[:-len(".ipynb")]
        folder.mkdir()
        for helper in ("answers_01_03.py", "answers_04_05.py", "test_checks_answers.py"):
            shutil.copyfile(HERE / helper, folder / helper)
        _write(folder, nb_id, chosen)
        paths.append(folder / f"{nb_id}.ipynb")
    extra = [] if sandbox.probe() is None else ["--no-sandbox"]
    proc = subprocess.run([sys.executable, "-m", "lesson10", "grade", *map(str, paths), "--json",
                           "-j", "2", *clock.limits(cell=120, exercise=60, notebook=600), *extra],
                          capture_output=True, text=True, timeout=clock.scaled(900), cwd=tmp)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    return {p.parent.name + ".ipynb": rep for p, rep in zip(paths, report["notebooks"])}, plan


def test_every_answer_gets_its_check_cells_verdict_from_the_grader(graded):
    reports, plan = graded
    wrong_verdicts = []
    for fname, (_nb_id, chosen) in plan.items():
        rep = reports[fname]
        assert rep["ok"], rep
        by = {e["exercise"]: e for e in rep["exercises"]}
        for ex, (table, i) in chosen.items():
            expected = table == "RIGHT"
            if by[ex]["passed"] != expected:
                wrong_verdicts.append(f"{table}[{ex!r}][{i}] ({T._name(getattr(T, table)[ex][i])}): "
                                      f"{by[ex]['status']}: {by[ex]['message'][:300]}")
    assert not wrong_verdicts, "\n".join(wrong_verdicts)
