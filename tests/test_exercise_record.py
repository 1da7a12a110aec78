"""An exercise is one record (issue 34): everything the check cell, the grader's sandbox and
the helpers' note know of it is written where it is registered, and read from there."""
from __future__ import annotations

import pytest

from lesson10.checks import EXERCISES, core, depends, refused


@pytest.fixture
def scratch(course_entries):
    """A scratch exercise in a scratch notebook, registered by the one decorator."""
    course_entries("scratch_sum", "counts", 2)

    @core.register_exercise("scratch_sum", "99_scratch", "a sum", "my_sum",
                            parts=("small", "large"), uses=("ring_time",),
                            withholds={"lesson10.layouts.ring_time": "my_sum",
                                       "lesson10.cost.comm_bytes": None},
                            use_instead="add the numbers yourself")
    def check_scratch_sum(my_sum, rng):
        return "ok"
    yield EXERCISES["scratch_sum"]
    del EXERCISES["scratch_sum"]


def test_one_decorator_gives_every_reader_the_exercise(scratch):
    assert scratch.notebook == "99_scratch" and scratch.function == "my_sum"
    assert dict(scratch.withholds) == refused.WITHHELD["99_scratch"]
    assert "99_scratch" in refused.WITHHELD and len(refused.WITHHELD) == len(set(
        ex.notebook for ex in EXERCISES.values()))
    assert refused.use_instead("scratch_sum") == "add the numbers yourself"
    assert depends._uses("scratch_sum") == ("ring_time",)


def test_gone_with_its_record(scratch):
    del EXERCISES["scratch_sum"]
    try:
        assert "99_scratch" not in refused.WITHHELD
        assert refused.use_instead("scratch_sum") == "write it with NumPy and the functions you wrote"
        assert depends._uses("scratch_sum") == ()
    finally:
        EXERCISES["scratch_sum"] = scratch


def test_every_course_exercise_withholds_its_reference():
    """Each exercise names what gives its answer; a notebook's table is its exercises'."""
    for ex in EXERCISES.values():
        assert ex.withholds, ex.id
        assert set(dict(ex.withholds)) <= set(refused.WITHHELD[ex.notebook]), ex.id
    assert depends._uses("ulysses_attention") == ("seq_to_heads", "heads_to_seq")
