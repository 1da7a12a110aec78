"""Hand-in times and identities only from what the LMS, the file system and the instructor
name (issue 49), decided at the planning stage: nothing here is graded. Each test is one of
the sixth red-team round's attacks."""
from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

import pytest
from adjusted_class import BLANK, DUE, DUE_EPOCH, args, entry, report

from lesson10.course.grade import adjust, archives, identity, late, outputs, pipeline, store
from lesson10.course.grade.request import Request

NB = "03_load_balance"
HOUR = 3600.0


def _zip(entries: dict, path: Path | None = None, mtime: float | None = None) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(out.getvalue())
        if mtime is not None:
            os.utime(path, (mtime, mtime))
    return out.getvalue()


def _nb(path: Path, mtime: float = DUE_EPOCH - HOUR) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(BLANK[NB])
    os.utime(path, (mtime, mtime))
    return path


def _planned(tmp_path: Path, *given: Path, **options):
    """The planning stage of ``grade GIVEN... --due DUE [options]`` (nothing graded)."""
    req = pipeline._with_adjustments(Request(notebooks=given, no_results=True, due=DUE,
                                             **options), None)
    return req, pipeline.plan(req, tmp_path / "unzipped", None, 7, None)


def _lateness(tmp_path: Path, *given: Path, **options) -> dict:
    """student -> (hand-in time's source, seconds late) of each graded notebook."""
    req, planned = _planned(tmp_path, *given, **options)
    adj = req.adjust
    out = {}
    for it in planned.plan.graded:
        st = late.stamp_of(it.path, adj.policy, adj.times, adj.handins)
        out[it.student] = (st["source"], late.seconds_late(st, adj.policy.due, "hour"))
    return out


# ------------------------------------------------------------------ hand-in times
def test_a_file_in_a_canvas_late_zip_is_late_whatever_its_own_name(tmp_path):
    cls = tmp_path / "class"
    _nb(cls / "alice" / f"{NB}.ipynb")
    _zip({f"bob_3_4_{NB}.ipynb": BLANK[NB]}, cls / "bob_LATE_1_2_hw.zip", DUE_EPOCH - HOUR)
    got = _lateness(tmp_path, cls)
    assert got["bob"] == ("Canvas LATE_ mark", None)           # late: one unit charged
    assert got["alice"] == ("file time", 0.0)


def test_a_time_typed_into_a_name_is_no_hand_in_time(tmp_path):
    cls = tmp_path / "class"
    _nb(cls / "alice" / f"2026-02-01_10-00_{NB}.ipynb", DUE_EPOCH + 2 * HOUR)
    _nb(cls / "bob_20260302T1405" / f"{NB}.ipynb", DUE_EPOCH - HOUR)
    got = _lateness(tmp_path, cls)
    assert got["alice"] == ("file time", 2 * HOUR)
    assert got["bob_20260302T1405"] == ("file time", 0.0)
    where = _lateness(tmp_path / "b", cls, time_from=r"_(?P<time>\d{8}T\d{4})$")
    assert where["bob_20260302T1405"][0] == "time in the path (--time-from)"
    assert where["bob_20260302T1405"][1] == 14 * HOUR + 6 * 60          # 2 March 14:05 UTC
    assert where["alice"] == ("file time (--time-from finds no time in the hand-in)",
                              2 * HOUR)                    # inside her hand-in: not read


@pytest.mark.parametrize("folder", ["subs-2026-03-05_0900", "ml_2026_1_lesson10"])
def test_the_class_folders_name_makes_nobody_late(tmp_path, folder):
    cls = tmp_path / folder
    _nb(cls / "alice" / f"{NB}.ipynb", DUE_EPOCH - HOUR)
    _nb(cls / "bob" / f"{NB}.ipynb", DUE_EPOCH + 3 * HOUR)
    assert _lateness(tmp_path, cls) == {"alice": ("file time", 0.0),
                                        "bob": ("file time", 3 * HOUR)}


def test_a_file_from_a_zip_has_the_zips_time_in_the_copy_rule(tmp_path):
    """Her older backup.zip does not beat her notebook; graded alone, she is one student."""
    alice = tmp_path / "alice"
    real = _nb(alice / f"{NB}.ipynb", DUE_EPOCH - HOUR)
    _zip({f"{NB}.ipynb": BLANK[NB]}, alice / "backup.zip", DUE_EPOCH - 48 * HOUR)
    _, planned = _planned(tmp_path, alice)
    assert planned.plan.students == ["alice"]
    assert [it.path for it in planned.plan.graded] == [real]
    (copy,) = planned.plan.ignored
    assert planned.found.real[copy].stat().st_mtime == DUE_EPOCH - 48 * HOUR


# ------------------------------------------------------------------ identities
def test_the_hand_in_is_what_the_instructor_names():
    flat = [Path("subs/alice_LATE_1_2_03_x.ipynb"), Path("subs/bob/lesson10-main/03_x.ipynb")]
    ids = identity.resolve(flat, student_from=r"subs/(?P<student>[a-z]+)")
    assert [ids.keys[p][0] for p in flat] == ["alice", "bob"]
    assert [ids.handins[p] for p in flat] == ["subs/alice_LATE_1_2_03_x.ipynb", "subs/bob"]
    repo = Path("repo/x_LATE_1_2_03_x.ipynb")             # a name of the student's own
    one = identity.resolve([repo], student="ann", given=[Path("repo")])
    assert one.keys[repo] == ("ann", "") and one.handins[repo] == "repo"
    assert late.stamp(one.handins[repo], 5.0)["source"] == "file time"
    canvas = [Path("c/smithjane_LATE_1_2_hw.zip/03_x.ipynb"), Path("c/doe_3_4_hw/03_x.ipynb")]
    ids = identity.resolve(canvas, anchors=[Path("c/smithjane_LATE_1_2_hw.zip")])
    assert [ids.keys[p][0] for p in canvas] == ["smithjane", "doe"]      # the logins
    assert late.stamp(ids.handins[canvas[0]], None)["late_mark"] is True


def test_a_zip_holding_another_students_folder_is_its_own_students(tmp_path):
    cls = tmp_path / "class"
    mine = _nb(cls / "alice" / f"{NB}.ipynb")
    _zip({f"alice/{NB}.ipynb": BLANK[NB]}, cls / "bob.zip")
    _, planned = _planned(tmp_path, cls)
    plan = planned.plan
    graded = {it.student: it.path for it in plan.graded}
    assert sorted(graded) == ["alice", "bob"] and graded["alice"] == mine and not plan.ignored
    assert "bob.zip" in str(graded["bob"])
    assert any("holds a folder named alice" in n for n in plan.notes["bob"])
    assert any("never in place of alice's" in n for n in plan.notes["alice"])


def test_two_zips_holding_one_folder_name_are_two_students(tmp_path):
    cls = tmp_path / "class"
    for who in ("ann", "ben"):
        _zip({f"hw10/{NB}.ipynb": BLANK[NB]}, cls / f"{who}.zip")
    _, planned = _planned(tmp_path, cls)
    assert sorted(it.student for it in planned.plan.graded) == ["ann", "ben"]
    _nb(cls / f"{NB}.ipynb")                 # the instructor's own copy beside them
    _, planned = _planned(tmp_path / "2", cls)
    assert sorted(it.student for it in planned.plan.graded) == ["ann", "ben", "class"]


def test_a_lone_zip_holding_another_students_folder_is_its_own(tmp_path):
    _zip({f"alice/{NB}.ipynb": BLANK[NB]}, tmp_path / "class" / "bob.zip")
    _, planned = _planned(tmp_path, tmp_path / "class")
    assert [it.student for it in planned.plan.graded] == ["bob"]


def test_classroom_repositories_under_a_section_are_separate_students(tmp_path):
    cls = tmp_path / "class"
    for sec, who in (("sec1", "alice"), ("sec1", "bob"), ("sec2", "carol")):
        _nb(cls / sec / f"lesson10-{who}" / "notebooks" / f"{NB}.ipynb")
    _, planned = _planned(tmp_path, cls)
    assert sorted(it.student for it in planned.plan.graded) == \
        ["sec1/lesson10-alice", "sec1/lesson10-bob", "sec2/lesson10-carol"]


def test_a_link_to_another_students_zip_is_not_unpacked(tmp_path):
    cls = tmp_path / "class"
    _zip({f"{NB}.ipynb": BLANK[NB]}, cls / "alice" / "alice.zip")
    _nb(cls / "bob" / "notes.ipynb")
    os.symlink("../alice/alice.zip", cls / "bob" / "mine.zip")
    _, planned = _planned(tmp_path, cls)
    graded = [(it.student, it.path) for it in planned.plan.graded]
    assert [who for who, p in graded if Path(p).name == f"{NB}.ipynb"] == ["alice"]
    (listed,) = planned.plan.not_graded["bob"]
    assert listed["path"].endswith("mine.zip") and "symbolic link" in listed["reason"]


def test_two_hand_ins_of_one_name_are_kept_apart_and_said_everywhere(tmp_path, capsys):
    cls = tmp_path / "class"
    folder = _nb(cls / "bob" / f"{NB}.ipynb")
    _zip({f"{NB}.ipynb": BLANK[NB]}, cls / "bob.zip")
    _, planned = _planned(tmp_path, cls)
    the_plan = planned.plan
    graded = {it.student: it.path for it in the_plan.graded}
    assert sorted(graded) == ["bob", "bob.zip"] and graded["bob"] == folder
    (note,) = the_plan.notes["bob"]
    assert "bob.zip" in note and "neither replaces the other" in note
    assert the_plan.notes["bob.zip"] == [note]
    doc = store.merge(None, store.class_doc(the_plan, planned.keys, seed=7, root=str(cls)))
    assert store.load(doc, store.Store(tmp_path / "results"))[1].notes == the_plan.notes
    out = tmp_path / "out"
    a = args(out)
    a.adjust = adjust.from_args(a)
    for f in ("feedback", "report"):
        Path(getattr(a, f)).mkdir(parents=True, exist_ok=True)
    full = [entry("zigzag_positions"), entry("causal_work"), entry("ring_time")]
    reps = [report(it.path, it.student, NB, [dict(e) for e in full]) for it in the_plan.graded]
    capsys.readouterr()
    outputs.write(a, the_plan, reps, 7, True)
    assert capsys.readouterr().out.count(note) == 2              # the table
    doc = json.loads(Path(a.output).read_text())
    assert all(r["notes"] == [note] for r in doc["students"])
    assert (out / "grades.csv").read_text().count(note) == 2
    assert (out / "summary.md").read_text().count(note) == 2
    for who in ("bob", "bob.zip"):
        assert note in (out / "feedback" / f"{who}.md").read_text()


# ------------------------------------------------------------------ limits per student
def test_the_file_count_limit_is_per_student(tmp_path, monkeypatch):
    monkeypatch.setattr(archives, "MAX_MEMBERS", 3)
    cls = tmp_path / "class"
    _zip({f"repo/.git/o{i}": b"x" for i in range(3)}, cls / "alice" / "repo.zip")
    _zip({f"{NB}.ipynb": BLANK[NB], "a.txt": b"x"}, cls / "bob" / "hw.zip")
    found = archives.gather([cls], tmp_path / "u")
    assert not found.unpacked.refused                 # alice's 3 files cost bob nothing
    _zip({"b.txt": b"x"}, cls / "bob" / "more.zip")     # bob's own 3rd and 4th files
    _zip({"c.txt": b"x"}, cls / "bob" / "zz.zip")
    found = archives.gather([cls], tmp_path / "u2")
    (why,) = found.unpacked.refused.values()
    assert "more than 3 files" in why and "same hand-in" in why
    named = tmp_path / "canvas.zip"                   # a Canvas download: a zip per student
    _zip({"ann.zip": _zip({f"{i}.txt": b"x" for i in range(3)}),
          "ben.zip": _zip({f"{NB}.ipynb": BLANK[NB]})}, named)
    assert not archives.gather([named], tmp_path / "u3").unpacked.refused


def test_a_roster_name_in_two_sections_replaces_neither(tmp_path):
    one = _nb(tmp_path / "class" / "sec1" / "alice" / f"{NB}.ipynb")
    two = _nb(tmp_path / "class" / "sec2" / "alice" / f"{NB}.ipynb")
    (tmp_path / "roster.txt").write_text("alice\nbob\n")
    _, planned = _planned(tmp_path, tmp_path / "class", roster=tmp_path / "roster.txt")
    plan = planned.plan
    assert {it.student: it.path for it in plan.graded} == {"sec1/alice": one, "sec2/alice": two}
    assert plan.students[:2] == ["alice", "bob"] and not plan.ignored
    assert plan.notes["alice"] == plan.notes["sec1/alice"] == plan.notes["sec2/alice"]
