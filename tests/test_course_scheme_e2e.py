"""An instructor's course file end to end (issue 46): two exercises made optional and one
doubled by editing only course.toml, and every output of ``grade`` shows the new maximum (the
CSV, the Canvas and Moodle exports, the class report, the Classroom JSON, Gradescope).

One small class is graded once for the module (grading costs ~15 s a notebook): alice hands
in the solved notebook 03, bob the blank one; nobody hands in 02, whose ``merge`` is optional."""
from __future__ import annotations

import csv
import io
import json
import os
import shutil
from pathlib import Path

import pytest

from lesson10 import scheme
from lesson10.checks import EXERCISES
from lesson10.course.grade import main, sandbox

ROOT = Path(__file__).resolve().parents[1]
NB = "03_load_balance.ipynb"
COURSE = ('[exercises]\nring_time = { points = 2 }            # doubled\n'
          'zigzag_positions = { status = "optional" }\nmerge = { status = "optional" }\n')
ROSTER = ("student,name,sis_id,email,section,canvas_id\n"
          "alice,\"Liddell, Alice\",S001,alice@uni.example,Sec 1,101\n"
          "bob,\"Builder, Bob\",S002,bob@uni.example,Sec 2,102\n")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("course-e2e")
    course = base / "course.toml"
    course.write_text(COURSE)
    for who, src in (("alice", ROOT / "solutions" / NB), ("bob", ROOT / "notebooks" / NB)):
        (base / "subs" / who).mkdir(parents=True)
        shutil.copy(src, base / "subs" / who / NB)
    # a submission's own course file never counts: this one would make everything optional
    (base / "subs" / "alice" / "course.toml").write_text('[exercises]\nring_time = { status = "optional" }\n')
    (base / "roster.csv").write_text(ROSTER)
    out, extra = base / "out", ([] if sandbox.probe() is None else ["--no-sandbox"])
    try:
        status = main([str(base / "subs"), "--course", str(course), "--seed", "3", *extra,
                       "--results", str(out / "results"), "--csv", str(out / "grades.csv"),
                       "--roster", str(base / "roster.csv"), "--export", "canvas", "--export", "moodle",
                       "--export-dir", str(out / "lms"), "--report", str(out / "report")])
        one = main([str(base / "subs" / "alice"), "--course", str(course), "--seed", "3", *extra,
                    "--student", "alice", "--no-results", "--classroom", str(out / "classroom.json"),
                    "--gradescope", str(out / "gradescope.json")])
    finally:
        os.environ.pop(scheme.ENV, None)        # the commands pinned it: no other test sees it
    return {"status": status, "one": one, "out": out, "scheme": scheme.load(course)}


def test_the_course_file_changes_the_maximum(graded):
    got, default = graded["scheme"], scheme.load()
    assert got.maximum == default.maximum + 1 - 1 - 1       # ring_time doubled, two made optional
    assert got.maximum != default.maximum


def test_csv_shows_the_new_maximum_and_optional_is_never_failed(graded):
    rows = {r["student"]: r for r in csv.DictReader(io.StringIO((graded["out"] / "grades.csv").read_text()))}
    top = graded["scheme"].maximum
    assert {r["max"] for r in rows.values()} == {str(top)}
    alice, bob = rows["alice"], rows["bob"]
    assert alice["ring_time"] == "2" and alice["causal_work"] == str(EXERCISES["causal_work"].points)
    assert alice["zigzag_positions"] == "0" and alice["zigzag_positions status"] == "optional: passed"
    assert alice["total"] == str(2 + EXERCISES["causal_work"].points)
    assert alice["merge status"] == "optional: missing"
    assert bob["total"] == "0" and bob["zigzag_positions status"] == "optional: not attempted"
    assert "failed" not in " ".join(v for k, v in alice.items() if k.endswith(" status"))


def test_canvas_and_moodle_exports_show_the_new_maximum(graded):
    top, lms = graded["scheme"].maximum, graded["out"] / "lms"
    canvas = list(csv.reader(io.StringIO((lms / "canvas-grades.csv").read_text())))
    assert canvas[1][0].strip() == "Points Possible" and canvas[1][5] == str(top)
    moodle = list(csv.reader(io.StringIO((lms / "moodle-grades.csv").read_text())))
    alice = next(r for r in moodle if r[0] == "alice@uni.example")
    assert alice[3].startswith(f"{2 + EXERCISES['causal_work'].points} / {top}")


def test_the_class_report_shows_the_new_maximum(graded):
    md = (graded["out"] / "report" / "class-report.md").read_text()
    top = graded["scheme"].maximum
    assert f"{2 + EXERCISES['causal_work'].points}/{top}" in md and f"0/{top}" in md
    assert "optional: not passed" in md                       # the per-exercise table's column


def test_classroom_and_gradescope_show_the_new_maximum(graded):
    top = graded["scheme"].maximum
    room = json.loads((graded["out"] / "classroom.json").read_text())
    assert room["max_score"] == top and len(room["tests"]) == top    # a test per counted point
    assert not any("zigzag_positions" in t["name"] or "merge" in t["name"] for t in room["tests"])
    gs = json.loads((graded["out"] / "gradescope.json").read_text())
    assert gs["max_score"] == top and gs["score"] == 2 + EXERCISES["causal_work"].points
    tests = {t["name"]: t for t in gs["tests"]}
    assert tests["03_load_balance: ring_time"]["max_score"] == 2
    zig = tests["03_load_balance: zigzag_positions (optional practice)"]
    assert "score" not in zig and "status" not in zig and zig["output"].startswith("optional: passed")
    assert graded["one"] == 1                                 # notebooks missing: points lost
