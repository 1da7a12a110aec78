"""The predict-first helper: a prediction is printed next to the truth, whatever it is."""
import pytest

from lesson10.sim.predict import compare, reveal


def test_a_close_number_is_close_and_a_far_one_names_the_factor():
    assert compare(70, 73, "GB").startswith("close")
    far = compare(584, 73, "GB")
    assert far.startswith("not quite") and "too high" in far and "factor 8" in far
    assert "too low" in compare(9, 73, "GB")


def test_no_prediction_says_so_and_still_gives_the_answer():
    line = compare(None, 2.0)
    assert "no prediction" in line and "2" in line


def test_yes_no_and_named_answers():
    assert compare(True, True).startswith("right")
    assert compare("no", True).startswith("not quite")
    assert "True or False" in compare(3, False)
    assert compare("Zigzag", "zigzag").startswith("right")
    assert compare("ring", "ulysses").startswith("not quite")


def test_a_word_for_a_number_is_told_to_write_a_number():
    assert "not a number" in compare("lots", 5.0)
    assert "not a number" in compare(True, 5.0)


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="rtol"):
        compare(1, 1, rtol=-1)
    with pytest.raises(TypeError, match="truth"):
        compare(1, [1])


def test_reveal_prints(capsys):
    reveal(2, 2.0, "x")
    assert capsys.readouterr().out.startswith("your prediction: exact")


def test_an_answer_near_zero_needs_an_absolute_tolerance():
    assert compare(0, 2e-16).startswith("not quite")
    assert compare(0, 2e-16, atol=1e-12).startswith("close")
