"""The grading request (:mod:`lesson10.course.grade.request`): one record of what a run is
asked to do, with the command line's defaults, frozen."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from lesson10.course.grade.cli import _parser
from lesson10.course.grade.request import DEFAULTS, Request


def test_the_command_line_and_the_record_have_one_set_of_defaults():
    parsed = _parser().parse_args([])
    assert Request.from_args(parsed) == DEFAULTS == Request()
    # every field is an option, and every option a field (adjust is the pipeline's own)
    assert set(vars(parsed)) == {f.name for f in dataclasses.fields(Request)} - {"adjust"}


def test_options_reach_their_fields():
    parsed = _parser().parse_args(["a.ipynb", "subs", "--exercise-timeout", "45", "-j", "3",
                                   "--export", "canvas", "--export", "moodle", "--no-sandbox",
                                   "--student", "ann"])
    req = Request.from_args(parsed)
    assert req.notebooks == (Path("a.ipynb"), Path("subs")) and req.export == ("canvas", "moodle")
    assert (req.exercise_timeout, req.jobs, req.no_sandbox, req.student) == (45.0, 3, True, "ann")
    assert req.timeout == DEFAULTS.timeout


def test_a_request_is_frozen_and_adjustments_make_a_new_one():
    req = Request(notebooks=(Path("x"),))
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.timeout = 1.0                                        # type: ignore[misc]
    made = object()
    adjusted = req.with_adjustments(made)
    assert adjusted.adjust is made and req.adjust is None and adjusted.notebooks == req.notebooks


def test_the_verdict_limits_are_the_options_that_change_a_verdict():
    req = Request(timeout=5, exercise_timeout=6, notebook_timeout=7, memory=1.5, no_sandbox=True)
    assert req.verdict_limits() == {"cell_timeout": 5, "exercise_timeout": 6,
                                    "notebook_timeout": 7, "memory_gib": 1.5, "sandboxed": False}
    assert Request(jobs=4).verdict_limits() == Request().verdict_limits()    # -j changes none
