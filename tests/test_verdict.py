"""One verdict ladder (issue 27): the check cell and the grader's judge turn an exercise
body's outcome into a verdict with the same function, so they agree on every answer."""
from __future__ import annotations

import json

import numpy as np
import pytest

from lesson10 import checks
from lesson10.checks import verdict as V
from lesson10.checks.core import Exercise, _call
from lesson10.course.grade import judge


@pytest.fixture(autouse=True)
def _toy_entry(course_entries):
    course_entries("toy", "counts", 2)


def _ex(body) -> Exercise:
    return Exercise("toy", "03_load_balance", "a toy", body, "toy_fn")


def _raises(exc):
    def body(fn, rng):
        raise exc
    return body


def _student_raises(fn, rng):
    return _call(lambda x: 1 / 0, 3)


@pytest.mark.parametrize("body, status, text", [
    (lambda fn, rng: "3 cases", V.Status.PASSED, "3 cases"),
    (_raises(NotImplementedError()), V.Status.NOT_ATTEMPTED, "toy_fn, or a function it calls"),
    (_raises(checks.CheckFailed("check_toy failed: rank 1 differs")), V.Status.FAILED,
     "check_toy failed: rank 1 differs"),
    (_student_raises, V.Status.FAILED, "check_toy failed: <lambda> raised ZeroDivisionError"),
    (_raises(KeyError("shape")), V.Status.FAILED, "could not use what your function returned "
                                                  "(KeyError"),
])
def test_each_outcome_of_a_body_has_one_verdict(body, status, text):
    v = V.judge_body(_ex(body), None, np.random.default_rng(0))
    assert v.status is status and text in v.message, v
    assert v.points == (2 if status is V.Status.PASSED else 0) and v.max_points == 2
    d = v.as_dict()
    assert list(d) == ["exercise", "status", "passed", "points", "max_points", "message"]
    assert type(d["status"]) is str and d["passed"] is (status is V.Status.PASSED)
    assert json.loads(json.dumps(d)) == d


def test_a_student_error_keeps_its_cause_for_the_traceback():
    v = V.judge_body(_ex(_student_raises), None, None)
    assert v.raised and isinstance(v.cause, ZeroDivisionError)


def test_the_judges_own_exceptions_pass_through_the_ladder():
    lost = judge.Lost("timed out", "gone")
    with pytest.raises(judge.Lost):                     # a BaseException: never a verdict
        V.judge_body(_ex(_raises(lost)), None, None)
    remote = judge.remote_error("ZeroDivisionError", "division by zero")
    with pytest.raises(judge.RemoteError):
        V.judge_body(_ex(_raises(remote)), None, None, passthrough=(judge.RemoteError,))
    v = V.judge_body(_ex(_raises(remote)), None, None)
    assert v.status is V.Status.FAILED and "ZeroDivisionError" in v.message


def test_status_is_a_plain_string_outside():
    assert V.Status.PASSED == "passed" and str(V.Status.NOT_ATTEMPTED) == "not attempted"
    assert json.dumps([V.Status.CRASHED]) == '["crashed"]'
    assert V.Status("timed out") is V.Status.TIMED_OUT


class _Local:
    """A channel whose calls run here, their errors crossing as the sandbox sends them."""

    def __init__(self, fn):
        self.fn = fn

    def call(self, args, kwargs, deadline):
        try:
            return self.fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - as the runner reports it
            raise judge.remote_error(type(exc).__name__, str(exc)) from None


class _Hangs:
    def call(self, args, kwargs, deadline):
        raise judge.Lost("timed out", "ring_time did not finish within the exercise's time limit")


def _right(work):
    return np.asarray(work).max(axis=1).sum()


def _stub(work):
    raise NotImplementedError


ANSWERS = {"right": _right, "wrong": lambda work: 0, "stub": _stub,
           "raises": lambda work: [][1], "junk": lambda work: object()}


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_check_cell_and_judge_give_the_same_verdict(name, monkeypatch, capsys):
    monkeypatch.setenv("LESSON10_STRICT_CHECKS", "0")
    ex = checks.EXERCISES["ring_time"]
    fn = ANSWERS[name]
    checks.check_ring_time(fn, seed=5)
    cell = checks.OUTCOMES[-1]
    graded = judge.judge_exercise(_Local(fn), ex, np.random.default_rng(5), 0.0, 30)
    assert cell["status"] == graded["status"] and cell["points"] == graded["points"], \
        (cell, graded)
    assert {k: cell[k] for k in graded} == graded or name in ("stub", "raises", "junk")
    assert cell["notebook"] == ex.notebook
    if name == "right":
        assert "check_ring_time passed" in capsys.readouterr().out


def test_what_crosses_the_boundary_is_the_judges_own_status():
    ex = checks.EXERCISES["ring_time"]
    e = judge.judge_exercise(_Hangs(), ex, np.random.default_rng(0), 0.0, 4)
    assert e["status"] == "timed out" and e["points"] == 0 and e["message"].endswith("(4 s)")
