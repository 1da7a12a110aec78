"""One ``Status`` (issue 34): every status word a writer emits is a member, and each writer
(class report, JUnit, Classroom, the rows) takes its classification from the member."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import lesson10
from lesson10.checks.exercises import maximum
from lesson10.checks.verdict import Kind, Status
from lesson10.course import report
from lesson10.course.grade import classroom, gradebook, reports

PACKAGE = Path(lesson10.__file__).parent
#: words of other programs' formats that a module writes under "status" (not ours)
FOREIGN = {"classroom.py": {"pass", "fail", "error"}}
#: functions whose second argument is a status word
STATUS_ARG = {"entry", "of", "_zero"}


def _words(node: ast.AST) -> list[str]:
    """The string constants a status expression can take (a constant, either side of an if)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _words(node.body) + _words(node.orelse)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [w for e in node.elts for w in _words(e)]
    return []


def _is_status_key(node: ast.AST) -> bool:
    return (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
            and node.slice.value == "status")


def status_words(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, word) of every status word written or compared in a module: a ``"status"``
    key's value, ``x["status"] = ...``, ``x["status"] == / in ...``, ``entry(ex, word)``."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        found: list[str] = []
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and k.value == "status":
                    found += _words(v)
        elif isinstance(node, ast.Assign) and any(map(_is_status_key, node.targets)):
            found += _words(node.value)
        elif isinstance(node, ast.Compare) and _is_status_key(node.left):
            found += [w for c in node.comparators for w in _words(c)]
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            if name in STATUS_ARG:
                found += _words(node.args[1])
        out += [(getattr(node, "lineno", 0), w) for w in found]
    return out


def test_the_scanner_finds_the_words_it_must():
    tree = ast.parse('a = {"status": "x" if ok else "y"}\ne["status"] = "z"\n'
                     'if e["status"] in ("u", "v"): pass\nentry(ex, "w", "msg")\n')
    assert sorted(w for _, w in status_words(tree)) == ["u", "v", "w", "x", "y", "z"]


def test_every_status_word_any_writer_emits_is_a_status():
    known = {s.value for s in Status}
    wrong = []
    for path in sorted((PACKAGE / "course").rglob("*.py")) + sorted((PACKAGE / "checks").glob("*.py")):
        allowed = known | FOREIGN.get(path.name, set())
        for line, word in status_words(ast.parse(path.read_text(encoding="utf-8"))):
            if word not in allowed:
                wrong.append(f"{path.relative_to(PACKAGE)}:{line}: {word!r}")
    assert not wrong, "status words that are no Status member:\n" + "\n".join(wrong)


def test_each_status_has_a_meaning_and_a_kind():
    assert len({s.meaning for s in Status}) == len(Status) and all(s.meaning for s in Status)
    assert all(isinstance(s.kind, Kind) for s in Status)
    assert {s for s in Status if s.against_student} == {
        Status.FAILED, Status.TIMED_OUT, Status.CRASHED, Status.CHECK_REMOVED, Status.NOT_JUDGED}
    assert [s for s in Status if s.grader_error] == [Status.GRADER_ERROR]
    assert Status.PASSED.kind is Kind.CREDIT and Status.MISSING.kind is Kind.NOT_HANDED_IN


def test_an_unknown_word_is_a_clear_error():
    with pytest.raises(ValueError, match="'bogus' is no exercise status.*grade the notebooks"):
        Status.of("bogus")
    with pytest.raises(ValueError, match="no exercise status"):
        report.column({"exercise": "x", "passed": False, "points": 0, "max_points": 1,
                       "status": "bogus"})


def test_no_writer_keeps_its_own_table():
    assert not hasattr(gradebook, "STATUSES") and not hasattr(reports, "ERROR_STATUSES")
    assert not hasattr(report, "ERRORS")


def _entry(s: Status) -> dict:
    return {"exercise": "ring_time", "notebook": "02_ring_attention", "status": s.value,
            "passed": False, "points": 0, "max_points": 1, "message": "m"}


@pytest.mark.parametrize("s", list(Status), ids=str)
def test_the_writers_classify_as_the_status_says(s):
    e = _entry(s)
    case = "\n".join(reports._junit_case(e, "alice.02", 0.0))
    assert ("<error " in case) is s.grader_error and ("<failure " in case) is not s.grader_error
    assert (classroom._status(e) == "error") is s.grader_error
    assert classroom._status(e) in ("error", "fail")
    assert report.column(e) == (s.value if s in report.OWN_COLUMN else "other")
    row = {"student": "alice", "points": 0, "max_points": maximum(), "missing": [], "exercises": [e]}
    why = report.attention([row])[0]["why"]
    assert ("exercises failed or broken" in why) is s.against_student


def test_the_readme_lists_every_status():
    text = (PACKAGE.parent / "README.md").read_text(encoding="utf-8")
    listed = text[text.index("Each exercise's status is one of"):]
    listed = listed[:listed.index("\n- ")]
    assert set(re.findall(r"`([a-z ]+)`", listed)) == {s.value for s in Status}
