"""Nothing the student reads gives a solution away: no hint, message or docstring of the
checks, no hint a wrong answer of the answer suites gets, and no text of an exercise
notebook contains a line of a solution (the code between ``### BEGIN SOLUTION`` and
``### END SOLUTION`` in solutions/*.ipynb), compared without spaces and comments."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import numpy as np
import pytest
import test_checks_answers as T

from lesson10 import checks
from lesson10.checks import CheckFailed

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
MIN = 12                     # shorter fragments say nothing, and so does a fragment with one
#                              call or operator at most (``len(q_shards)``, ``group.all_to_all(blocks)``:
#                              names and the interface the exercise text gives)


def _norm(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _solution_fragments() -> dict:
    """``{normalised fragment: (notebook, line)}``: every solution line, and the expression
    it assigns or returns."""
    out = {}
    for path in sorted((ROOT / "solutions").glob("0[1-5]_*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            src = "".join(cell["source"])
            if BEGIN not in src:
                continue
            body = src.split(BEGIN, 1)[1].split(END, 1)[0]
            for line in body.splitlines():
                code = line.split("#", 1)[0].strip()
                parts = [code, re.sub(r"^(return\s+|[\w\[\], .]+?=(?!=))", "", code)]
                for part in parts:
                    if len(_norm(part)) >= MIN and len(re.findall(r"[(<>+*/-]", part)) >= 2:
                        out[_norm(part)] = (path.stem, code)
    return out


FRAGMENTS = _solution_fragments()


def _strings_of_checks() -> list:
    """Every string the checks' code holds (messages, hints, docstrings); an f-string's
    placeholders become a space."""
    out = []
    for path in sorted((ROOT / "lesson10" / "checks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.JoinedStr):
                out.append((path.name, "".join(v.value if isinstance(v, ast.Constant) else " "
                                               for v in node.values)))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                out.append((path.name, node.value))
    return out


def _hints(message: str) -> str:
    """The hint of a failure (its other lines may quote the student's own code)."""
    return "\n".join(line for line in message.splitlines() if line.startswith("hint:"))


def _prose(cell: dict) -> str:
    """What a notebook cell tells the student: a markdown cell's text, a code cell's
    docstrings, strings and comments (its code is the stub, not a hint)."""
    src = "".join(cell["source"])
    if cell["cell_type"] == "markdown":
        return src
    texts = [line.split("#", 1)[1] for line in src.splitlines() if "#" in line]
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return "\n".join(texts)
    texts += [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return "\n".join(texts)


def _leaks(text: str) -> list:
    flat = _norm(text)
    return [FRAGMENTS[f] for f in FRAGMENTS if f in flat]


def test_the_solutions_have_lines_to_compare():
    assert len(FRAGMENTS) >= 30
    assert any(code.startswith("return np.asarray(work)") for _, code in FRAGMENTS.values())


def test_no_string_of_the_checks_holds_a_solution_line():
    found = [(name, text[:80], leak) for name, text in _strings_of_checks() for leak in _leaks(text)]
    assert not found, found


@pytest.mark.parametrize("exercise", sorted(T.WRONG))
def test_no_hint_a_wrong_answer_gets_holds_a_solution_line(exercise):
    for i, fn in enumerate(T.WRONG[exercise]):
        with pytest.raises(CheckFailed) as info, np.errstate(all="ignore"):
            getattr(checks, f"check_{exercise}")(fn, seed=0)
        hint = _hints(str(info.value))
        assert hint and not _leaks(hint), (exercise, i, hint, _leaks(hint))


def test_no_text_of_an_exercise_notebook_holds_a_solution_line():
    for path in sorted((ROOT / "notebooks").glob("0[1-5]_*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            text = _prose(cell)
            assert not _leaks(text), (path.name, text[:200], _leaks(text))


def test_a_leak_is_found():
    """The comparison finds a solution line written into a hint, spaces and all."""
    assert _leaks("hint: try return np.asarray( work ).max(axis=1).sum()")


def test_the_ring_time_text_nudges_without_the_formula():
    """The exercise text, the stub's docstring, the check's docstring and its hints describe
    what a round costs; none of them spells out the sum over rounds of the busiest rank."""
    nb = json.loads((ROOT / "notebooks" / "03_load_balance.ipynb").read_text(encoding="utf-8"))
    texts = [_prose(c) for c in nb["cells"] if "ring_time" in "".join(c["source"])]
    texts.append(checks.check_ring_time.__doc__)
    texts += [text for name, text in _strings_of_checks() if name == "nb03_load_balance.py"]
    answer = re.compile(r"\\sum_k\s*\\max_r|sum over rounds|max over (ranks|axis 1)|"
                        r"busiest rank per round, (added|summed)", re.I)
    assert texts and not [t for t in texts if answer.search(t)]
