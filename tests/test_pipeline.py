"""The grading pipeline's stages (:mod:`lesson10.course.grade.pipeline`) on their own: a bad
request stops before any file is read, and planning reads and keys every file without
running any student code."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from adjusted_class import BLANK

from lesson10.course.grade import pipeline
from lesson10.course.grade.request import Request


@pytest.mark.parametrize("given, said", [
    (dict(jobs=0), "must be positive"),
    (dict(memory=-1), "must be positive"),
    (dict(fail_under=101), "percentage"),
    (dict(student="a", student_from="(?P<student>x)"), "not both"),
    (dict(notebooks=()), "--resume"),
    (dict(results=Path("r"), no_results=True), "not both"),
])
def test_a_bad_request_is_one_line_and_status_2(given, said, capsys, monkeypatch):
    graded = []
    monkeypatch.setattr(pipeline, "plan", lambda *a, **k: graded.append(a))
    req = Request(**{"notebooks": (Path("x.ipynb"),), **given})
    assert said in (pipeline.validate(req) or "")
    assert pipeline.run(req) == 2 and not graded
    err = capsys.readouterr().err
    assert err.startswith("grade: ") and said in err and err.count("\n") == 1


def test_a_good_request_passes_validation(tmp_path):
    assert pipeline.validate(Request(notebooks=(tmp_path,), csv=tmp_path / "c.csv")) is None


def _class(tmp_path: Path) -> Path:
    for who, data in (("ann", BLANK["02_ring_attention"]), ("bob", BLANK["02_ring_attention"]),
                      ("cy", BLANK["03_load_balance"])):
        (tmp_path / "subs" / who).mkdir(parents=True)
        (tmp_path / "subs" / who / "work.ipynb").write_bytes(data)
    return tmp_path / "subs"


def test_planning_keys_every_file_and_runs_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "grade_notebook", lambda *a, **k: pytest.fail("graded"))
    req = pipeline._with_adjustments(Request(notebooks=(_class(tmp_path),), no_results=True), None)
    planned = pipeline.plan(req, tmp_path / "unzipped", None, 7, None)
    assert sorted(planned.plan.students) == ["ann", "bob", "cy"]
    keys = [planned.keys[it.path] for it in planned.plan.graded]
    assert len(keys) == 3
    # the same bytes for the same notebook: one key (graded once); another notebook: another
    by = {it.student: planned.keys[it.path] for it in planned.plan.graded}
    assert by["ann"] == by["bob"] != by["cy"]
    assert all(planned.seeds.get(it.path, 7) == 7 for it in planned.plan.graded)
    # another seed or other limits: other keys (a verdict depends on both)
    other = pipeline.plan(req, tmp_path / "u2", None, 8, None)
    assert {other.keys[p] for p in other.keys}.isdisjoint(keys)
    slower = pipeline.plan(dataclasses.replace(req, exercise_timeout=60), tmp_path / "u3",
                           None, 7, None)
    assert {slower.keys[p] for p in slower.keys}.isdisjoint(keys)


def test_an_empty_folder_is_said_before_anything_runs(tmp_path):
    (tmp_path / "empty").mkdir()
    req = pipeline._with_adjustments(Request(notebooks=(tmp_path / "empty",)), None)
    with pytest.raises(pipeline.SetupError, match="no notebook found"):
        pipeline.plan(req, tmp_path / "u", None, 7, None)
