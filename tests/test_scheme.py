"""The course file (issue 46): one scheme, read from the package's default and an
instructor's course.toml over it, refused in one sentence when it is wrong, and printed by
``python -m lesson10 course``."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lesson10 import scheme
from lesson10.checks import EXERCISES
from lesson10.checks.exercises import maximum, shown_status
from lesson10.course import coursefile

ROOT = Path(__file__).resolve().parents[1]


def _file(tmp_path, text: str) -> Path:
    path = tmp_path / "course.toml"
    path.write_text(text)
    return path


def test_the_default_names_every_exercise_and_only_those():
    default = scheme.load()
    assert list(default.exercises) == list(EXERCISES)
    assert default.source == scheme.DEFAULT
    assert default.maximum == sum(p for s, p in default.exercises.values() if s == "counts")
    assert maximum() == default.maximum


def test_issue_47s_default_makes_four_exercises_optional():
    default = scheme.load()
    optional = {e for e, (s, _) in default.exercises.items() if s == "optional"}
    assert optional == {"all_gather", "sp_bytes", "heads_to_seq", "aux_loss"}
    assert all(p == 0 for e, (_, p) in default.exercises.items() if e in optional)


def test_the_subset_parser_reads_the_default_as_tomllib_does():
    text = scheme.DEFAULT.read_text()
    assert scheme._parse_subset(text) == scheme.parse(text)
    sample = 'term = "a # b"  # c\n[x]\ny = { p = 2, s = "q" }\nz = true\nw = 1.5\n'
    assert scheme._parse_subset(sample) == {"term": "a # b", "x": {"y": {"p": 2, "s": "q"}, "z": True,
                                                                 "w": 1.5}}


def test_an_instructors_file_overrides_entry_by_entry(tmp_path):
    path = _file(tmp_path, 'term = "2027-spring"\n[exercises]\nring_time = { points = 2 }\n'
                           'merge = { status = "optional" }\nall_gather = { status = "bonus", points = 1 }\n')
    got, default = scheme.load(path), scheme.load()
    assert got.term == "2027-spring" and got.source == path.resolve()
    assert got.exercises["ring_time"] == ("counts", 2)
    assert got.exercises["merge"] == ("optional", 0)
    assert got.exercises["all_gather"] == ("bonus", 1)
    assert got.exercises["zigzag_positions"] == default.exercises["zigzag_positions"]
    assert got.maximum == default.maximum + (2 - 1) - 1     # ring_time doubled, merge out; a bonus is not in it
    assert (got.repository, got.ref) == (default.repository, default.ref)


@pytest.mark.parametrize("text, words", [
    ("[exercises]\nring_tme = { points = 1 }\n", "exercises.ring_tme is no exercise of the course"),
    ("[exercises]\nring_time = { pionts = 1 }\n", "unknown key 'exercises.ring_time.pionts'"),
    ("colour = 1\n", "unknown key 'colour'"),
    ("[late]\ndue_date = \"2026-03-01\"\n", "unknown key 'late.due_date'"),
    ("[exercises]\nring_time = { points = \"2\" }\n", "exercises.ring_time.points = '2' is not a whole number"),
    ("[exercises]\nring_time = { points = true }\n", "is not a whole number"),
    ("[exercises]\nring_time = { points = 1.5 }\n", "is not a whole number"),
    ("term = 2027\n", "term = 2027 is not a string in quotes"),
    ("[exercises]\nring_time = { points = -1 }\n", "exercises.ring_time.points = -1 is negative"),
    ("[exercises]\nring_time = { status = \"extra\", points = 1 }\n",
     "exercises.ring_time.status = 'extra' is no status"),
    ("[exercises]\nring_time = { status = \"optional\", points = 1 }\n", "is optional with points = 1"),
    ("[exercises]\nring_time = { points = 0 }\n", "counts with 0 points"),
    ("[exercises]\nring_time = { status = \"counts\" }\n", "exercises.ring_time has no points"),
    ("[exercises]\nring_time = 2\n", "exercises.ring_time = 2 is not a table"),
    ("[late]\ndue = \"friday\"\n", "late.due = 'friday' is no time"),
    ("[late]\npenalty = \"10%\"\n", "late.penalty = '10%' is no penalty"),
    ("[late]\ncap = 120\n", "late.cap = 120 is not a percentage"),
    ("[release]\nref = \"a..b\"\n", "release.ref = 'a..b' is no git ref"),
    ('term = ""\n', "term = '' is empty"),
    ("[exercises\n", "not a TOML file"),
])
def test_a_bad_file_is_refused_in_one_sentence_naming_the_key(tmp_path, text, words):
    path = _file(tmp_path, text)
    with pytest.raises(scheme.SchemeError) as got:
        scheme.load(path)
    message = str(got.value)
    assert words in message and str(path.resolve()) in message and "\n" not in message
    assert re.search(r"\b(write|drop|give)\b", message), message     # it says what to do


def test_points_that_do_not_split_over_the_parts_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _file(tmp_path, "[exercises]\nring_attention = { points = 3 }\n")
    with pytest.raises(scheme.SchemeError, match="does not split equally over its 2 parts"):
        assert EXERCISES["ring_attention"].parts
    assert coursefile.main([]) == 2


def test_the_nearest_file_is_in_force_and_says_so(tmp_path, monkeypatch, capsys):
    inner = tmp_path / "a" / "b"
    inner.mkdir(parents=True)
    _file(tmp_path, "[exercises]\nring_attention = { points = 4 }\nmerge = { status = \"optional\" }\n")
    monkeypatch.chdir(inner)
    assert scheme.current().source == (tmp_path / "course.toml").resolve()
    assert EXERCISES["ring_attention"].points == 4
    assert EXERCISES["ring_attention"].parts == (("non-causal", 2), ("causal", 2))
    assert EXERCISES["merge"].optional and EXERCISES["merge"].points == 0
    assert shown_status("merge", "failed") == "optional: not passed"
    assert shown_status("ring_attention", "failed") == "failed"
    assert coursefile.main([]) == 0
    out = capsys.readouterr().out
    assert f"maximum: {scheme.load().maximum + 2 - 1} points" in out
    assert f"course file: {(tmp_path / 'course.toml').resolve()}" in out
    assert re.search(r"02_ring_attention\s+merge\s+optional\s+0", out)


def test_an_explicit_file_wins_and_a_missing_one_is_refused(tmp_path, capsys):
    path = _file(tmp_path, "[exercises]\nring_time = { points = 5 }\n")
    assert coursefile.main(["--course", str(path)]) == 0
    assert re.search(r"ring_time\s+counts\s+5", capsys.readouterr().out)
    assert coursefile.main(["--course", str(tmp_path / "nope.toml")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_the_course_command_exits_non_zero_on_a_bad_file(tmp_path):
    path = _file(tmp_path, "[exercises]\nring_time = { points = -3 }\n")
    proc = subprocess.run([sys.executable, "-m", "lesson10", "course", "--course", str(path)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "exercises.ring_time.points = -3 is negative" in proc.stderr
    ok = subprocess.run([sys.executable, "-m", "lesson10", "course"], capture_output=True, text=True,
                        timeout=120, cwd=ROOT)
    assert ok.returncode == 0 and f"maximum: {scheme.load().maximum} points" in ok.stdout
    assert "(the package's default)" in ok.stdout


def _numbers_near_points(text: str) -> set[int]:
    """Whole numbers written as a maximum or a score: ``24 points``, ``max_score 24``,
    ``"max_score": 24``, ``maximum (24)``, ``worth 24``, ``3 / 24``."""
    found = set()
    for pattern in (r"\b(\d+) points\b", r"max_score\W{1,4}(\d+)", r"maximum\W{1,3}(\d+)",
                    r"\bworth (\d+)", r"\b\d+ ?/ ?(\d+)\b(?! ?(?:day|hour))"):
        found |= {int(m) for m in re.findall(pattern, text, flags=re.I)}
    return found


def test_no_maximum_is_written_outside_the_course_file():
    """The maximum (today's and the old 24) is nowhere in the README, CONTRIBUTING, the
    package's code or the Classroom template but where build writes it from the course file."""
    top = {scheme.load().maximum, 24}
    texts = {p: p.read_text() for p in [ROOT / "README.md", ROOT / "CONTRIBUTING.md",
                                         *(ROOT / "lesson10").rglob("*.py"),
                                         *(ROOT / "classroom").rglob("*.md")]}
    workflow = (ROOT / "classroom" / ".github" / "workflows" / "classroom.yml").read_text()
    texts[Path("classroom.yml")] = re.sub(r'"max_score": \d+', "", workflow)   # build's, from the file
    bad = {str(p.relative_to(ROOT) if p.is_absolute() else p): sorted(_numbers_near_points(t) & top)
           for p, t in texts.items() if _numbers_near_points(t) & top}
    assert not bad, f"a course maximum written by hand: {bad}; write how to see it (python -m lesson10 course)"
    assert _numbers_near_points("a Programming Assignment worth 24 points") == {24}   # it can fail
    assert _numbers_near_points('"max_score": 20, score 3 / 20') == {20}


def test_no_exercise_points_are_written_in_the_checks():
    """The decorators hold no points: the default course.toml is the only place."""
    decorator = re.compile(r'@register_exercise\("\w+", NB0\d, (\d+)')
    for path in (ROOT / "lesson10" / "checks").glob("nb0*_*.py"):
        assert not decorator.findall(path.read_text()), path.name
        assert not re.search(r"parts=\(\(\"[^\"]+\", \d+\)", path.read_text()), path.name
    assert decorator.findall('@register_exercise("x", NB01, 2, "t")') == ["2"]     # it can fail


def test_build_check_sees_the_classroom_template_stale_when_the_scheme_changes(tmp_path, capsys):
    from lesson10.course import build
    for sub in ("solutions", "notebooks", "classroom"):
        shutil.copytree(ROOT / sub, tmp_path / sub)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    assert build.main(["--check", "--root", str(tmp_path)]) == 0
    (tmp_path / "course.toml").write_text("[exercises]\nring_time = { points = 3 }\n")
    assert build.main(["--check", "--root", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    want = scheme.load().maximum + 2
    assert "classroom.yml" in err and f"the maximum {want}" in err
    assert build.main(["--root", str(tmp_path)]) == 0
    workflow = (tmp_path / "classroom" / ".github" / "workflows" / "classroom.yml").read_text()
    assert f'"max_score": {want},' in workflow
    assert build.main(["--check", "--root", str(tmp_path)]) == 0


def test_a_new_term_gives_new_hidden_cases_and_keeps_the_check_cells(tmp_path, monkeypatch):
    from lesson10.checks.exercises import seed_of
    from lesson10.course.grade import session
    before = (session.hidden_seed(7, "ring_time", 0), seed_of("ring_time"))
    monkeypatch.chdir(tmp_path)
    _file(tmp_path, 'term = "2027-spring"\n')
    after = (session.hidden_seed(7, "ring_time", 0), seed_of("ring_time"))
    assert after[0] != before[0] and after[1] == before[1]
    import numpy as np
    assert np.random.default_rng(after[0]).random() != np.random.default_rng(before[0]).random()


def test_a_doubled_exercise_with_parts_is_still_one_point_per_classroom_test(tmp_path, monkeypatch):
    from lesson10.course.grade import classroom
    monkeypatch.chdir(tmp_path)
    _file(tmp_path, "[exercises]\nring_attention = { points = 4 }\n")
    parts = [{"part": p, "status": s, "passed": s == "passed", "points": 2 if s == "passed" else 0,
              "max_points": 2, "message": ""} for p, s in (("non-causal", "passed"), ("causal", "failed"))]
    e = {"notebook": "02_ring_attention", "exercise": "ring_attention", "status": "failed", "passed": False,
         "points": 2, "max_points": 4, "message": "", "parts": parts}
    tests = classroom.one_point_tests(e)
    assert len(tests) == 4 and all(t["max_points"] == 1 for _, t in tests)
    assert sum(t["points"] for _, t in tests) == 2
    assert [n for n, _ in tests][:2] == ["02_ring_attention: ring_attention (non-causal, point 1)",
                                         "02_ring_attention: ring_attention (non-causal, point 2)"]


def test_the_course_command_warns_where_a_graded_exercise_calls_optional_practice(tmp_path, capsys):
    assert coursefile.main([]) == 0
    assert "note: ulysses_attention (counts) calls the student's heads_to_seq" in capsys.readouterr().out
    path = _file(tmp_path, "[exercises]\nheads_to_seq = { points = 1 }\n")
    assert coursefile.main(["--course", str(path)]) == 0
    assert "note:" not in capsys.readouterr().out
