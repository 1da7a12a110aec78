"""A term's files, end to end (issue 32): a class with a malformed notebook, a notebook
holding a 200,000-term expression, a folder named in Latin-1 bytes, a Canvas zip with a zip
inside and byte-identical files. Every output is written for everybody, only the two broken
files lose points, identical files are graded once, and the students' outputs never name
the seed. Then the seeds: in the same results folder a resubmission (or --new-cases) meets
new cases, an unchanged file keeps its verdict, a replay reuses the stored seed, and a longer
--exercise-timeout is never served a stored verdict."""
import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_grade_zips import _zip

from lesson10.checks.exercises import maximum
from lesson10.course.grade import sandbox

pytestmark = [pytest.mark.slow, pytest.mark.redteam]   # whole grading runs

ROOT = Path(__file__).resolve().parent.parent
NB03 = "03_load_balance.ipynb"
COURSE_MAX = maximum()                  # the course file in force
RIGHT = "return np.asarray(work).max(axis=1).sum()"
NO_SANDBOX = [] if sandbox.probe() is None else ["--no-sandbox"]


def _reduced(wrong: bool = False) -> dict:
    nb = json.loads((ROOT / "solutions" / NB03).read_text())
    keep = [c for c in nb["cells"] if c["cell_type"] == "markdown" or any(
        w in "".join(c["source"]) for w in ("check_", "def ", "import"))]
    nb["cells"] = [c for c in keep if "figures." not in "".join(c["source"])
                   and "summary()" not in "".join(c["source"])]
    if wrong:
        for c in nb["cells"]:
            c["source"] = "".join(c["source"]).replace(RIGHT, "return np.asarray(work).sum()")
    return nb


def _class(base: Path) -> Path:
    cls = base / "class"
    good = json.dumps(_reduced())
    for who in ("alice", "bob"):                                   # bob: alice's bytes
        (cls / who).mkdir(parents=True)
        (cls / who / NB03).write_text(good)
    latin = os.path.join(os.fsencode(cls), b"Jos\xe9")             # a Windows zip's folder
    os.makedirs(latin)
    with open(os.path.join(latin, NB03.encode()), "w") as f:
        f.write(good)
    broken = _reduced()
    broken["metadata"] = []
    (cls / "dave").mkdir()
    (cls / "dave" / NB03).write_text(json.dumps(broken))
    deep = _reduced()
    deep["cells"].append({"cell_type": "code", "metadata": {}, "outputs": [],
                          "execution_count": None, "source": "x = " + "+".join(["1"] * 200_000)})
    (cls / "eve").mkdir()
    (cls / "eve" / NB03).write_text(json.dumps(deep))
    inner = _zip({f"carol_submission/{NB03}": json.dumps(_reduced(wrong=True))})
    (cls / "carol").mkdir()
    (cls / "carol" / "submission.zip").write_bytes(_zip({"carol_4711_lesson10.zip": inner}))
    return cls


def _grade(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lesson10", "grade", *args, *NO_SANDBOX,
                           "-j", "2", "--timeout", "90"],
                          capture_output=True, text=True, timeout=1800)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("robust")
    cls, out = _class(base), base / "out"
    proc = _grade(str(cls), "--output", str(out / "report.json"), "--csv", str(out / "grades.csv"),
                  "--feedback", str(out / "feedback"), "--markdown", str(out / "summary.md"),
                  "--junit", str(out / "junit.xml"), "--save-executed", str(out / "executed"),
                  "--report", str(out / "report"))
    return {"proc": proc, "out": out, "cls": cls}


def test_every_output_is_written_and_only_the_broken_files_lose_points(graded):
    proc, out = graded["proc"], graded["out"]
    assert proc.returncode == 1, proc.stderr[-3000:]
    doc = json.loads((out / "report.json").read_text())
    rows = {r["student"]: r for r in doc["students"]}
    assert {s: r["points"] for s, r in rows.items()} == \
        {"José": 4, "alice": 4, "bob": 4, "carol": 3, "dave": 0, "eve": 0}
    for who, word in (("dave", "validator"), ("eve", "expression")):
        statuses = {e["status"] for e in rows[who]["exercises"] if e["notebook"] == "03_load_balance"}
        assert statuses == {"unreadable"}
        rep = next(r for r in doc["notebooks"] if r["student"] == who)
        assert rep["ok"] and word in rep["feedback"][0]
    assert all(r["ok"] and r["max_points"] == COURSE_MAX for r in rows.values())
    csv_rows = list(csv.DictReader((out / "grades.csv").read_text(encoding="utf-8").splitlines()))
    assert sorted(r["student"] for r in csv_rows) == sorted(rows)
    for who in rows:
        assert (out / "feedback" / f"{who}.md").is_file() and (out / "feedback" / f"{who}.html").is_file()
    assert "José" in (out / "summary.md").read_text(encoding="utf-8")
    assert "José" in (out / "junit.xml").read_text(encoding="utf-8")
    assert (out / "report" / "class-report.md").is_file()
    carol = next(r for r in doc["notebooks"] if r["student"] == "carol")
    assert "submission.zip/carol_4711_lesson10.zip/carol_submission" in carol["notebook"]


def test_identical_files_are_graded_once_and_reported_for_each(graded):
    proc, out = graded["proc"], graded["out"]
    started = re.findall(r"^grading (.+) \((.+)\) \.\.\.$", proc.stderr, re.M)
    assert len(started) == 4, started                 # alice's bytes once for three students
    doc = json.loads((out / "report.json").read_text())
    same = [r for r in doc["notebooks"] if r["student"] in ("alice", "bob", "José")]
    assert len(same) == 3 and len({r["notebook"] for r in same}) == 3
    assert len({json.dumps(r["exercises"]) for r in same}) == 1
    for who in ("alice", "bob", "José"):
        assert (out / "executed" / who / NB03).is_file()


def test_the_students_outputs_never_name_the_seed(graded):
    out = graded["out"]
    seed = str(json.loads((out / "report.json").read_text())["seed"])
    assert seed in (out / "grades.csv").read_text()               # the instructor's outputs
    students = list((out / "feedback").glob("*")) + list((out / "executed").rglob("*.ipynb"))
    students.append(out / "summary.md")
    assert len(students) >= 13
    for path in students:
        assert seed not in path.read_text(encoding="utf-8"), path


def test_a_resubmission_meets_new_cases_and_an_unchanged_file_keeps_its_verdict(tmp_path):
    folder = tmp_path / "ann"
    folder.mkdir()
    (folder / NB03).write_text(json.dumps(_reduced()))
    results = tmp_path / "results"

    def run(*extra):
        proc = _grade(str(folder), "--student", "ann", "--resume", str(results), "--output",
                      str(tmp_path / "r.json"), *extra)
        assert proc.returncode == 1, proc.stderr[-3000:]       # the other notebooks: missing
        graded = json.loads((tmp_path / "r.json").read_text())["notebooks"]
        return graded[0]["seed"], proc.stderr

    first, _ = run()
    assert not (results / "running").exists()
    second, err = run()                                 # unchanged: its verdict, seed and all
    assert second == first and "1 of 1 notebooks already graded" in err
    third, err = run("--new-cases")                     # every file again, with a new seed
    assert third != first and "already graded" not in err
    changed = _reduced()
    changed["cells"].append({"cell_type": "markdown", "metadata": {}, "source": "resubmitted"})
    (folder / NB03).write_text(json.dumps(changed))
    fourth, err = run()                                 # a resubmission: new cases
    assert fourth not in (first, third) and "already graded" not in err
    fifth, err = run("--replay")                        # the stored seed: the stored verdict
    assert fifth == fourth and "1 of 1 notebooks already graded" in err
    sixth, err = run("--replay", "--exercise-timeout", "45")   # another limit: graded again
    assert sixth == fourth and "already graded" not in err
