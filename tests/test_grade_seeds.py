"""The grade of an answer does not depend on the grader's seed: every answer of the answer
suites (tests/test_checks_answers.py) is graded under three random batches, and all three
verdicts are the check cell's (right answers pass, wrong ones fail).

One grader batch: in each graded notebook every check cell runs three times; the grader
draws each judged call's cases from ``(seed, exercise, call number)``, so the three calls
see three different random batches. The executed notebooks (``--save-executed``) hold the
verdict of each call. Every case class that tells a mistake apart is a fixed case of its
check, so no batch can miss it.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import test_checks_answers as T
from redteam import clock
from test_grade_answers import _notebooks, _write

from lesson10.course.grade import sandbox

HERE = Path(__file__).resolve().parent
CALLS = 3                       # judged calls per exercise (the judge serves up to 3)
SEED = 20261201
_VERDICT = re.compile(r"\[grader\] check_(\w+): (passed|failed|not attempted|\w[\w ]*) \(")

pytestmark = [pytest.mark.slow, pytest.mark.redteam]   # make test-redteam


def _plan():
    """``{folder: (course notebook, {exercise: (table, index)})}``: test_grade_answers' plan."""
    return {name[:-len(".ipynb")]: plan for name, plan in _notebooks().items()}


def _verdicts(executed: Path) -> dict:
    """``{exercise: [status of each call]}`` from the outputs of an executed notebook."""
    nb = json.loads(executed.read_text(encoding="utf-8"))
    seen: dict = {}
    for cell in nb["cells"]:
        text = "".join("".join(o.get("text", "")) for o in cell.get("outputs", []))
        m = _VERDICT.search(text)
        if cell["cell_type"] == "code" and "checks.check_" in "".join(cell["source"]) and m:
            seen.setdefault(m.group(1), []).append(m.group(2))
    return seen


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("seeds")
    plan, paths = _plan(), []
    for name, (nb_id, chosen) in plan.items():
        folder = tmp / "in" / name
        folder.mkdir(parents=True)
        for helper in ("answers_01_03.py", "answers_04_05.py", "test_checks_answers.py"):
            shutil.copyfile(HERE / helper, folder / helper)
        _write(folder, nb_id, chosen, CALLS)
        paths.append(folder / f"{nb_id}.ipynb")
    extra = [] if sandbox.probe() is None else ["--no-sandbox"]
    proc = subprocess.run([sys.executable, "-m", "lesson10", "grade", *map(str, paths), "--json",
                           "-j", "2", *clock.limits(cell=120, exercise=60, notebook=600),
                           "--seed", str(SEED),
                           "--save-executed", str(tmp / "out"), *extra],
                          capture_output=True, text=True, timeout=clock.scaled(2400), cwd=tmp)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    executed = {p.parent.name: p for p in (tmp / "out").rglob("*.ipynb")}
    return plan, executed


def test_every_answer_gets_one_verdict_whatever_the_random_batch(graded):
    plan, executed = graded
    assert set(executed) == set(plan), sorted(set(plan) ^ set(executed))
    wrong = []
    for name, (_, chosen) in plan.items():
        seen = _verdicts(executed[name])
        for ex, (table, i) in chosen.items():
            want = "passed" if table == "RIGHT" else "failed"
            got = seen.get(ex, [])
            if got != [want] * CALLS:
                wrong.append(f"{table}[{ex!r}][{i}] ({T._name(getattr(T, table)[ex][i])}): {got}")
    assert not wrong, "\n".join(wrong)
