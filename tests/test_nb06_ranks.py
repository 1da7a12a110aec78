"""lesson10.checks.nb06_ranks: the rank side of notebook 06's checks, the parts that run
without torch.distributed (loading the student's cell, naming its error, swapping a
function in and back)."""
import types

import pytest

from lesson10.checks.nb06_ranks import load_student, replaced, student_error


def _cell(tmp_path, text, name="cell.py"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_load_student_gives_the_named_function_of_a_fresh_module(tmp_path):
    path = _cell(tmp_path, "COUNT = []\ndef shift(x):\n    COUNT.append(x)\n    return x + 1\n")
    first, second = load_student(path, "shift"), load_student(path, "shift")
    assert first(1) == 2 and first is not second
    assert first.__globals__["COUNT"] == [1] and second.__globals__["COUNT"] == []
    with pytest.raises(AttributeError):
        load_student(path, "missing")


def test_student_error_shows_the_student_s_lines_only(tmp_path):
    path = _cell(tmp_path, "def shift(x):\n    return helper(x)\n\ndef helper(x):\n    return x[5]\n")
    fn = load_student(path, "shift")
    with pytest.raises(IndexError) as info:
        fn([1])
    text = student_error(info.value, path)
    assert text.startswith("IndexError: list index out of range")
    assert "in shift: return helper(x)" in text and "in helper: return x[5]" in text
    assert "test_nb06_ranks" not in text                    # the caller's frames are left out


def test_student_error_cuts_a_long_message():
    assert len(student_error(ValueError("x" * 1000), "nowhere.py")) == len("ValueError: ") + 400


def test_replaced_swaps_functions_and_puts_them_back_on_error():
    module = types.SimpleNamespace(send=lambda: "real", recv=lambda: "real")
    original = module.send
    with pytest.raises(KeyError), replaced(module, send=lambda: "fake") as saved:
        assert module.send() == "fake" and saved == {"send": original}
        raise KeyError
    assert module.send is original and module.recv() == "real"
