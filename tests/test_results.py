"""Typed results (issue 34): the records read the grader's JSON and give back the same
bytes; a wrong document is a clear error."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from lesson10.checks import EXERCISES
from lesson10.checks.verdict import Status
from lesson10.course.grade import gradebook, judge, overrides
from lesson10.course.grade.notebook import notebook_report
from lesson10.course.grade.results import (
    VERSION,
    ClassResult,
    Entry,
    NotebookResult,
    PartEntry,
    ResultsError,
    StudentRow,
)


def _graded() -> dict:
    """A class as the grader's own builders make it: a plain verdict, one with parts and a
    mistake, a notebook not handed in, an override."""
    sp = EXERCISES["sp_forward"]
    parts = [{"part": "output", "status": "passed", "passed": True, "points": 1,
              "max_points": 1, "message": "ok"},
             {"part": "op on s/t tokens", "status": "failed", "passed": False, "points": 0,
              "max_points": 1, "message": "check_sp_forward failed: ops differ",
              "mistake": "count_ops"}]
    entries = [judge.combine_parts(sp, parts)]
    entries += [judge.entry(ex, "not attempted", "stub") for ex in EXERCISES.values()
                if ex.notebook == sp.notebook and ex.id != sp.id]
    entries[-1]["seconds"] = 0.25
    rep = notebook_report(Path("alice/01.ipynb"), sp.notebook, entries, feedback=["line"],
                          student="alice")
    rep["seconds"] = 1.5
    rows = gradebook.rows([rep])
    overrides.apply(rows, [{"student": "alice", "exercise": entries[-1]["exercise"],
                            "points": 1, "reason": "regrade"}])
    return {"version": VERSION, "notebooks": [rep], "students": rows, "seed": 5}


def test_a_class_round_trips_to_the_same_bytes():
    doc = _graded()
    typed = ClassResult.from_json(copy.deepcopy(doc))
    assert json.dumps(typed.to_json(), indent=1) == json.dumps(doc, indent=1)


def test_the_records_are_typed():
    typed = ClassResult.from_json(_graded())
    nb = typed.notebooks[0]
    assert isinstance(nb, NotebookResult) and nb.student == "alice" and nb.seconds == 1.5
    first = nb.exercises[0]
    assert isinstance(first, Entry) and first.status is Status.FAILED and first.points == 1
    assert first.parts is not None and all(isinstance(p, PartEntry) for p in first.parts)
    assert first.parts[1].mistake == "count_ops" and first.mistake == "count_ops"
    row = typed.students[0]
    assert isinstance(row, StudentRow) and row.max_points == gradebook.course_max()
    assert {e.status for e in row.exercises} >= {Status.MISSING, Status.OVERRIDDEN}
    over = next(e for e in row.exercises if e.status is Status.OVERRIDDEN)
    assert over.override is not None and over.judged == {"status": "not attempted",
                                                         "passed": False, "points": 0}
    assert typed.extra == {"seed": 5}                  # a key of no field is kept as it is
    assert row.extra == {} and row.ignored == [] and row.on_roster is None


def test_a_new_entry_is_written_in_the_canonical_order():
    e = Entry(exercise="ring_time", status=Status.PASSED, passed=True, points=2, max_points=2,
              message="3 cases")
    assert list(e.to_json()) == ["exercise", "status", "passed", "points", "max_points",
                                 "message"]
    assert e.to_json()["status"] == "passed" and type(e.to_json()["status"]) is str


def test_the_missing_entry_is_the_gradebooks():
    ex = EXERCISES["ring_time"]
    rows = gradebook.rows([notebook_report(Path("b/01.ipynb"), "01_sequence_parallel", [],
                                           student="bob")])
    got = next(e for e in rows[0]["exercises"] if e["exercise"] == ex.id)
    want = Entry.missing(ex.id, ex.notebook, ex.points).to_json()
    assert json.dumps(got) == json.dumps(want)


@pytest.mark.parametrize("doc, words", [
    ({"version": 2, "notebooks": [], "students": []}, "version 2: this grader reads version 1"),
    ({"notebooks": [], "students": []}, "version None"),
    ({"version": 1, "notebooks": []}, "no students"),
    ({"version": 1, "notebooks": [{"notebook": "a", "student": "s", "ok": True,
                                   "exercises": [{"exercise": "x", "status": "passed"}]}],
      "students": []}, r"notebooks\[0\]\.exercises\[0\]: no passed, points, max_points"),
    ({"version": 1, "notebooks": [], "students": [7]}, "an object was expected, not int"),
])
def test_a_wrong_document_is_a_clear_error(doc, words):
    with pytest.raises(ResultsError, match=words):
        ClassResult.from_json(doc)


def test_an_unknown_status_is_refused():
    e = {"exercise": "x", "status": "won", "passed": True, "points": 1, "max_points": 1}
    with pytest.raises(ValueError, match="'won' is no exercise status"):
        Entry.from_json(e)


def test_the_class_report_reads_the_records():
    from lesson10.course import report
    doc = _graded()
    typed = ClassResult.from_json(copy.deepcopy(doc)).students
    assert all(isinstance(r, StudentRow) for r in report.typed(doc["students"]))
    assert report.markdown(list(typed), 5) == report.markdown(doc["students"], 5)
    assert "Exercises overridden by the instructor: 1" in report.markdown(list(typed))
