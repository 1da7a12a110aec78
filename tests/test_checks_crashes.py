"""A crash inside the student's function gets a hint that names the likely mistake
(lesson10/checks/crashes.py), the same in the check cell and in the grader, whose judge sees
only the type's name and the message of what the sandbox raised.

The wrong answers that crash are in the answer suites (tests/test_checks_answers.py names
each one's hint for 20 seeds), but for merge_no_trailing_axis, whose shapes broadcast in some
seeds' cases (then it is a wrong value first): judged here on the check cell's own seed. Here
too: the judge's side, the rules no answer reaches, and the traceback a student sees."""
from __future__ import annotations

import answers_01_03 as a1
import answers_04_05 as a4
import numpy as np
import pytest

from lesson10 import checks
from lesson10.checks import CheckFailed, crashes
from lesson10.course.grade.judge import remote_error

CRASHING = [("reduce_scatter", a1.rs_wrong_axis), ("seq_to_heads", a4.s2h_wrong_axes),
            ("heads_to_seq", a4.h2s_is_s2h), ("heads_to_seq", a4.h2s_reshape_all_heads),
            ("causal_work", a1.work_stack), ("causal_work", a1.work_int16),
            ("causal_work", a1.work_column_stack), ("causal_work", a1.work_no_wrap),
            ("zigzag_positions", a1.zz_index_off_by_one), ("merge", a1.merge_no_trailing_axis),
            ("capacity", a4.cap_no_none), ("moe_stats", a4.make_moe_stats(minlength=False)),
            ("aux_loss", a4.aux_no_minlength)]
GENERIC = "the traceback shows the line of your code that raised"


def _message(exercise, fn) -> str:
    with pytest.raises(CheckFailed) as info, np.errstate(all="ignore"):
        getattr(checks, f"check_{exercise}")(fn)
    return str(info.value)


def _hint(message: str) -> str:
    return next(line for line in message.splitlines() if line.startswith("hint: "))


def _as_the_judge_sees_it(fn):
    """``fn``, raising what the judge's stub raises (``judge.remote_error``, which the check
    refuses inside a student's function, so built the same way here): an exception of the
    same type's name and message, without the original class, traceback or frames."""
    def remote(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - every error crosses the wire as data
            raise type(type(exc).__name__, (Exception,), {})(str(exc)[:4000]) from None
    remote.__name__ = fn.__name__
    return remote


def test_the_judge_raises_a_stand_in_of_the_same_name_and_message():
    exc = remote_error("ValueError", "array split does not result in an equal division")
    assert type(exc).__name__ == "ValueError" and not isinstance(exc, ValueError)
    assert str(exc) == "array split does not result in an equal division"


def test_outputs_that_miss_a_trailing_axis_are_named_on_the_check_cells_seed():
    hint = _hint(_message("merge", a1.merge_no_trailing_axis))
    assert "(5, 3) meets the last axes of (5, 3, 3), not the first: it needs a trailing axis" in hint


@pytest.mark.parametrize("exercise,fn", CRASHING, ids=[f"{e}-{f.__name__}" for e, f in CRASHING])
def test_a_crash_gets_its_named_hint_in_the_check_cell_and_the_judge_alike(exercise, fn):
    cell = _message(exercise, fn)
    assert f"{fn.__name__} raised" in cell and GENERIC not in cell, cell
    assert _hint(_message(exercise, _as_the_judge_sees_it(fn))) == _hint(cell)


def test_an_unknown_crash_keeps_the_general_hint():
    msg = _message("ring_attention", a1.ring_all_gather)      # the network's own message says it
    assert GENERIC in _hint(msg)
    assert crashes.crash_hint("merge", "KeyError", "'x'", ()) is None
    assert crashes.crash_hint("merge", "ValueError", "something else", ()) is None


def test_an_odd_argument_or_message_never_breaks_the_verdict():
    class Odd(np.ndarray):
        @property
        def shape(self):
            raise RuntimeError("no shape")
    odd = [np.zeros(3).view(Odd)] * 2
    assert crashes.crash_hint("reduce_scatter", "ValueError",
                              "array split does not result in an equal division", (odd,)) is None
    assert crashes.crash_hint("x", "OverflowError", "Python integer 5 out of bounds for int7", ()) is None


def test_the_split_hint_names_the_wrong_axis_only_where_the_right_one_divides():
    xs = [np.zeros((4, 3)), np.zeros((4, 3))]
    text = crashes.crash_hint("reduce_scatter", "ValueError",
                              "array split does not result in an equal division", (xs,))
    assert "the hidden size (axis 1, length 3)" in text and "cuts the tokens (axis 0)" in text
    # the tokens do not divide either, or an exercise without a split axis: no axis is named
    for ex, arrays in (("reduce_scatter", [np.zeros((3, 3))] * 2), ("all_gather", xs),
                       ("merge", xs)):
        text = crashes.crash_hint(ex, "ValueError", "array split does not result in an equal "
                                  "division", (arrays,))
        assert "likely split the wrong axis" not in text and "np.split cuts an axis" in text


def test_a_join_names_the_axis_the_exercise_joins_along():
    msg = ("all the input array dimensions except for the concatenation axis must match exactly, "
           "but along dimension 1, the array at index 0 has size 2 and the array at index 1 has "
           "size 1")
    shards = [np.zeros((2, 2, 3))] * 2
    text = crashes.crash_hint("heads_to_seq", "ValueError", msg, (shards,))
    assert "differ along axis 1 (block 0 has 2, block 1 has 1)" in text
    assert "heads_to_seq joins along the heads (axis 1)" in text
    other = crashes.crash_hint("merge", "ValueError", msg, (shards,))
    assert "differ along axis 1" in other and "joins along" not in other
    assert "np.stack needs one shape" in crashes.crash_hint(
        "merge", "ValueError", "all input arrays must have the same shape", (shards,))


def test_a_matrix_product_names_bincount_only_where_something_is_counted():
    msg = ("matmul: Input operand 1 has a mismatch in its core dimension 0, with gufunc signature "
           "(n?,k),(k,m?)->(n?,m?) (size 6 is different from 4)")
    assert "minlength" in crashes.crash_hint("aux_loss", "ValueError", msg, ())
    text = crashes.crash_hint("block_attention", "ValueError", msg, ())
    assert "inner sizes differ (6 and 4)" in text and "bincount" not in text
    dot = crashes.crash_hint("block_attention", "ValueError",
                             "shapes (4,) and (6,) not aligned: 4 (dim 0) != 6 (dim 0)", ())
    assert "inner sizes differ (4 and 6)" in dot
    plain = crashes.crash_hint("merge", "ValueError", "operands could not be broadcast together "
                               "with shapes (4,2) (3,2) ", ())
    assert "check the shape each of them should have" in plain and "trailing" not in plain


@pytest.mark.parametrize("message,text", [
    ("Python integer 40000 out of bounds for int16", "holds only -32768..32767"),
    ("Python integer -1 out of bounds for uint8", "holds only 0..255"),
])
def test_an_overflow_names_the_dtype_and_its_range(message, text):
    assert text in crashes.crash_hint("causal_work", "OverflowError", message, ())
    assert crashes.crash_hint("causal_work", "OverflowError", "int too large", ()) is None


def test_the_students_traceback_ends_at_their_line_without_numpy_frames(capsys, monkeypatch):
    monkeypatch.setenv("LESSON10_STRICT_CHECKS", "0")
    checks.check_reduce_scatter(a1.rs_wrong_axis)
    out = capsys.readouterr().out
    assert "Traceback of your code" in out and "np.split(np.sum(xs, axis=0)" in out
    assert "_shape_base_impl.py" not in out and "site-packages" not in out, out
    assert out.index("ValueError: array split") < out.index("hint: np.split cannot cut")
