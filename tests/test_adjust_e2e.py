"""`grade` end to end with the instructor's adjustments: the latest copy on time graded, a
Canvas LATE_ copy penalised, an extension from the roster, an override, the LMS exports, and
`report` of the results folder giving the same points."""
import csv
import io
import json
import os
import zipfile
from pathlib import Path

import pytest

from lesson10.course import report as class_report
from lesson10.course.grade import adjust, main

pytestmark = pytest.mark.slow   # a whole command end to end: make test-slow

ROOT = Path(__file__).resolve().parent.parent
NB03 = "03_load_balance.ipynb"
DUE, DUE_EPOCH, HOUR = "2026-03-01T23:59:00+00:00", 1772409540.0, 3600.0


def _reduced(edit=None) -> str:
    nb = json.loads((ROOT / "solutions" / NB03).read_text())
    nb["cells"] = [c for c in nb["cells"] if c["cell_type"] == "markdown" or (
        any(w in "".join(c["source"]) for w in ("check_", "def ", "import"))
        and "figures." not in "".join(c["source"]) and "summary()" not in "".join(c["source"]))]
    for c in nb["cells"]:
        if edit and c["cell_type"] == "code":
            c["source"] = edit("".join(c["source"]))
    return json.dumps(nb)


def _put(path: Path, text: str, mtime: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (mtime, mtime))
    return path


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("adj")
    cls = base / "class"
    right = _reduced()
    wrong = _reduced(lambda s: s.replace("return np.asarray(work).max(axis=1).sum()",
                                         "return np.asarray(work).sum(axis=0).max()"))
    _put(cls / "ann" / NB03, right, DUE_EPOCH - HOUR)                    # on time
    _put(cls / "ann" / "03_load_balance (1).ipynb", wrong, DUE_EPOCH + HOUR)   # late, newer
    canvas = cls / "ben_LATE_12_34_hw.zip"                   # Canvas: late; the login is ben
    with zipfile.ZipFile(canvas, "w") as z:
        z.writestr(f"lesson10-main/{NB03}", right)
    os.utime(canvas, (DUE_EPOCH - HOUR, DUE_EPOCH - HOUR))
    _put(cls / "cy" / NB03, right, DUE_EPOCH + 30 * HOUR)                # the extension
    (base / "roster.csv").write_text(
        "student,name,sis_id,email,section,extension\n"
        "ann,\"A, Ann\",S1,ann@x.example,1,\nben,\"B, Ben\",S2,ben@x.example,1,\n"
        "cy,\"C, Cy\",S3,cy@x.example,2,2d\n")
    (base / "overrides.csv").write_text("student,exercise,points,reason\n"
                                        "cy,causal_work,1,regrade: one part only (ticket 7)\n")
    out = base / "out"
    status = main([str(cls), "--roster", str(base / "roster.csv"), "--seed", "5", "-j", "2",
                   "--timeout", "60", "--output", str(out / "report.json"),
                   "--csv", str(out / "grades.csv"), "--feedback", str(out / "feedback"),
                   "--report", str(out / "report"), "--junit", str(out / "junit.xml"),
                   "--overrides", str(base / "overrides.csv"), "--due", DUE,
                   "--late-penalty", "50/day", "--latest-on-time", "--export", "canvas",
                   "--export", "moodle", "--export-dir", str(out / "lms")])
    doc = json.loads((out / "report.json").read_text())
    return {"status": status, "out": out, "doc": doc,
            "rows": {r["student"]: r for r in doc["students"]}}


def _on_03(row):
    return sum(e["points"] for e in row["exercises"] if e["notebook"] == "03_load_balance")


def test_the_adjustments_reach_the_rows(graded):
    rows = graded["rows"]
    assert rows["ann"]["notebooks"]["03_load_balance"].endswith(f"ann/{NB03}")  # on time
    assert _on_03(rows["ann"]) == 4 and rows["ann"]["late"] == []
    (late,) = rows["ben"]["late"]
    assert late["source"] == "Canvas LATE_ mark" and late["points_lost"] == 2
    assert _on_03(rows["ben"]) == 2
    assert rows["cy"]["late"] == [] and _on_03(rows["cy"]) == 3          # extension; override
    judged = [r for r in graded["doc"]["notebooks"] if r["student"] in ("ben", "cy")]
    assert all(r["points"] == 4 for r in judged)                         # the judge's verdicts


def test_every_output_agrees(graded):
    out = graded["out"]
    grades = {g["student"]: g for g in csv.DictReader(io.StringIO((out / "grades.csv").read_text()))}
    assert (grades["ann"]["total"], grades["ben"]["total"], grades["cy"]["total"]) == ("4", "2", "3")
    assert "ticket 7" in grades["cy"]["adjustments"] and "LATE_" in grades["ben"]["late"]
    assert "ticket 7" in (out / "feedback" / "cy.md").read_text()
    assert "Canvas LATE_ mark" in (out / "feedback" / "ben.md").read_text()
    assert "ticket 7" in (out / "junit.xml").read_text()
    canvas = list(csv.reader(io.StringIO((out / "lms" / "canvas-grades.csv").read_text())))
    assert [r[2:] for r in canvas[2:]] == [["S1", "ann@x.example", "1", "4"],
                                           ["S2", "ben@x.example", "1", "2"],
                                           ["S3", "cy@x.example", "2", "3"]]
    moodle = {r["Email address"]: r["lesson10"] for r in csv.DictReader(
        io.StringIO((out / "lms" / "moodle-grades.csv").read_text()))}
    assert moodle == {"ann@x.example": "4", "ben@x.example": "2", "cy@x.example": "3"}


def test_report_of_the_results_folder_gives_the_same_points(graded, tmp_path):
    folder = graded["out"] / "lesson10-results"
    assert adjust.load(folder).policy is not None
    assert class_report.main([str(folder), "--out", str(tmp_path)]) == 0
    assert (tmp_path / class_report.MD_NAME).read_text() == \
        (graded["out"] / "report" / class_report.MD_NAME).read_text()
