"""``python -m lesson10 grade`` on a class as an instructor has one: two sections with the
same student folder names, a Colab copy beside a blank original, a -Copy1 duplicate, a
roster with a student who handed in nothing, every output at once and a recorded seed.
One grading run of four reduced notebooks serves every test here (module fixture); the
refusals before any grading cost nothing."""
import csv
import json
import os
import shutil
from pathlib import Path

import pytest

from lesson10.checks import EXERCISES
from lesson10.checks.exercises import maximum
from lesson10.course.grade import main

pytestmark = pytest.mark.slow   # a whole command end to end: make test-slow

ROOT = Path(__file__).resolve().parent.parent
NB = "03_load_balance.ipynb"
COURSE_MAX = maximum()                  # the course file in force
FULL, WORTH = maximum("03_load_balance"), EXERCISES["ring_time"].points   # s01 loses ring_time
RIGHT = "return np.asarray(work).max(axis=1).sum()"


def _solved(tag=True, wrong_later=False) -> dict:
    nb = json.loads((ROOT / "solutions" / NB).read_text())
    if tag:
        nb["metadata"]["lesson10"] = {"notebook": "03_load_balance"}
    # a reduced notebook: the exercises and their checks, not the exploration after them
    keep = [c for c in nb["cells"] if c["cell_type"] == "markdown" or "check" in "".join(c["source"])
            or "def " in "".join(c["source"]) or "import" in "".join(c["source"])]
    keep = [c for c in keep if "figures." not in "".join(c["source"])
            and "summary()" not in "".join(c["source"])]
    last = max(i for i, c in enumerate(keep) if "checks.check_" in "".join(c["source"]))
    nb["cells"] = keep[:last + 1]                   # up to the notebook's last check cell
    assert any(RIGHT in "".join(c["source"]) for c in nb["cells"])
    if wrong_later:                      # passes at its first check, fails at the last one
        code = {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": []}
        nb["cells"] += [dict(code, source="def ring_time(work):\n    return np.asarray(work).sum()"),
                        dict(code, source="checks.check_ring_time(ring_time)")]
    return nb


def _put(path: Path, nb, mtime=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(nb, dict):
        path.write_text(json.dumps(nb))
    else:
        shutil.copy(nb, path)
    if mtime:
        os.utime(path, (mtime, mtime))
    return path


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("class")
    cls = base / "class"
    _put(cls / "sec1" / "s01" / NB, _solved())
    wrong = _put(cls / "sec2" / "s01" / NB, _solved(wrong_later=True))
    _put(cls / "sec2" / "s02" / NB, ROOT / "notebooks" / NB, mtime=2_000_000_000)  # blank, newer
    _put(cls / "sec2" / "s02" / f"Copy of {NB}", _solved(tag=False), mtime=1_900_000_000)
    _put(cls / "sec2" / "s03" / NB, _solved())
    _put(cls / "sec2" / "s03" / NB.replace(".ipynb", "-Copy1.ipynb"), _solved())
    (base / "roster.csv").write_text("student,name\nsec1/s01,A\nsec2/s01,B\nsec2/s02,C\n"
                                     "sec2/s03,D\nsec3/s09,E\n")
    out = base / "out"
    out.mkdir()
    args = [str(cls), "-j", "2", "--seed", "11", "--roster", str(base / "roster.csv"),
            "--json", "--output", str(out / "report.json"), "--csv", str(out / "grades.csv"),
            "--junit", str(out / "junit.xml"), "--markdown", str(out / "summary.md"),
            "--feedback", str(out / "feedback"), "--save-executed", str(out / "executed"),
            "--timeout", "60"]
    status = main(args)
    report = json.loads((out / "report.json").read_text())
    return {"status": status, "report": report, "out": out, "wrong": wrong, "cls": cls,
            "rows": {r["student"]: r for r in report["students"]}}


def test_two_sections_with_the_same_folder_names_are_two_students(graded):
    rows = graded["rows"]
    assert list(rows) == ["sec1/s01", "sec2/s01", "sec2/s02", "sec2/s03", "sec3/s09"]
    assert rows["sec1/s01"]["points"] == 4 and rows["sec2/s01"]["points"] == 3
    for r in rows.values():
        assert r["max_points"] == COURSE_MAX and len(r["exercises"]) == len(EXERCISES)
    assert graded["status"] == 1                        # points lost and notebooks missing


def test_copies_count_once_and_the_colab_copy_is_recognised(graded):
    rows = graded["rows"]
    s02 = rows["sec2/s02"]
    assert s02["points"] == 4                           # the solved "Copy of", not the blank
    assert s02["notebooks"]["03_load_balance"].endswith(f"Copy of {NB}")
    assert [i["path"] for i in s02["ignored"]] == [str(graded["cls"] / "sec2" / "s02" / NB)]
    assert rows["sec2/s03"]["points"] == 4 and len(rows["sec2/s03"]["ignored"]) == 1
    graded_paths = [r["notebook"] for r in graded["report"]["notebooks"]]
    assert len(graded_paths) == 4                       # each copy group graded once


def test_missing_notebooks_and_the_roster(graded):
    absent = graded["rows"]["sec3/s09"]
    assert absent["points"] == 0 and absent["notebooks"] == {}
    assert {e["status"] for e in absent["exercises"]} == {"missing"}
    assert graded["rows"]["sec1/s01"]["missing"] == ["01_sequence_parallel", "02_ring_attention",
                                                     "04_ulysses", "05_moe_dispatch"]
    rows = list(csv.DictReader((graded["out"] / "grades.csv").read_text().splitlines()))
    assert [r["student"] for r in rows] == list(graded["rows"])
    assert all(r["max"] == str(COURSE_MAX) for r in rows)
    assert [r["seed"] for r in rows] == ["11"] * 4 + [""]     # s09 handed in nothing: no seed
    assert rows[1]["ring_time status"] == "failed" and rows[1]["ring_time"] == "0"
    assert rows[4]["total"] == "0" and rows[4]["zigzag_positions status"] == "missing"


def test_the_seed_is_in_every_report_and_replays(graded, tmp_path):
    report = graded["report"]
    assert report["seed"] == 11
    assert all(r["seed"] == 11 for r in report["notebooks"])
    assert [r["seed"] for r in report["students"]] == [11] * 4 + [None]    # sec3/s09: none
    out = graded["out"]
    summary = (out / "summary.md").read_text()               # students read it: no seed
    assert "seed 11" not in summary and "--seed" not in summary
    assert 'name="seed" value="11"' in (out / "junit.xml").read_text()
    first = next(r for r in report["notebooks"] if r["student"] == "sec2/s01")
    assert main([str(graded["wrong"]), "--seed", "11", "--output", str(tmp_path / "again.json"),
                 "--timeout", "60"]) == 1
    again = json.loads((tmp_path / "again.json").read_text())["notebooks"][0]
    assert [e["message"] for e in again["exercises"]] == [e["message"] for e in first["exercises"]]
    assert [e["status"] for e in again["exercises"]] == ["passed", "passed", "failed"]


def test_feedback_files_give_points_messages_and_hints(graded):
    fb = graded["out"] / "feedback"
    names = sorted(p.relative_to(fb).as_posix() for p in fb.rglob("*") if p.is_file())
    assert names == sorted(f"{s}.{ext}" for s in graded["rows"] for ext in ("md", "html"))
    md = (fb / "sec2" / "s01.md").read_text()
    assert f"**Score: {FULL - WORTH} / {COURSE_MAX}**" in md and f"### ring_time: failed (0/{WORTH})" in md
    assert "check_ring_time failed" in md and "**Hint:**" in md
    assert "Not handed in" in (fb / "sec3" / "s09.md").read_text()
    assert "Not graded:" in (fb / "sec2" / "s02.md").read_text()
    assert "check_ring_time failed" in (fb / "sec2" / "s01.html").read_text()


def test_markdown_and_junit(graded):
    md = (graded["out"] / "summary.md").read_text()
    assert f"### sec2/s01: {FULL - WORTH} / {COURSE_MAX}" in md and "check_ring_time failed" in md
    junitparser = pytest.importorskip("junitparser")
    xml = junitparser.JUnitXml.fromfile(str(graded["out"] / "junit.xml"))
    suites = list(xml)
    assert all(s.time is not None for s in suites)
    assert sum(s.errors for s in suites) == 0
    lost = [e for r in graded["rows"].values() for e in r["exercises"] if not e["passed"]]
    assert sum(s.failures for s in suites) == sum(1 for e in lost if not EXERCISES[e["exercise"]].optional)
    assert sum(s.skipped for s in suites) == sum(1 for e in lost if EXERCISES[e["exercise"]].optional) > 0


def test_executed_notebooks_agree_with_the_grade(graded):
    ran = graded["out"] / "executed" / "sec2" / "s01" / NB
    nb = json.loads(ran.read_text())
    top = "".join(nb["cells"][0]["source"])
    assert f"{FULL - WORTH} / {FULL}" in top and f"| ring_time | failed | 0/{WORTH} |" in top
    outs = ["".join("".join(o.get("text", "")) for o in c.get("outputs", [])) for c in nb["cells"]]
    shown = [t for t in outs if "[grader] check_ring_time:" in t]
    assert len(shown) == 2
    assert f"passed ({WORTH}/{WORTH})" in shown[0] and "not the verdict that counts" in shown[0]
    assert f"failed (0/{WORTH})" in shown[1] and "not the verdict that counts" not in shown[1]
    assert (graded["out"] / "executed" / "sec2" / "s02" / NB).is_file()    # "Copy of": its id


# ------------------------------------------------------------------ refused before grading
def test_refusals_cost_no_grading(tmp_path, capsys):
    flat = tmp_path / "flat"
    _put(flat / "alice_4711_03_load_balance.ipynb", ROOT / "notebooks" / NB)
    _put(flat / "bob_4712_03_load_balance.ipynb", ROOT / "notebooks" / NB)
    assert main([str(flat)]) == 2
    assert "merges nobody" in capsys.readouterr().err
    two = tmp_path / "two"
    _put(two / "alice" / NB, ROOT / "notebooks" / NB)
    _put(two / "bob" / NB, ROOT / "notebooks" / NB)
    for option in ("--gradescope", "--classroom"):
        assert main([str(two), option, str(tmp_path / "x.json")]) == 2
        assert "2 students" in capsys.readouterr().err
        assert not (tmp_path / "x.json").exists()
    assert main([str(two), "--student", "a", "--student-from", "(?P<student>x)"]) == 2
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 2
    assert "no notebook found" in capsys.readouterr().err
