"""The course file (issue 46): one scheme, read from the package's default and an
instructor's course.toml over it, refused in one sentence when it is wrong, and printed by
``python -m lesson10 course``."""
from __future__ import annotations

import re
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
