"""--export canvas / moodle: gradebook import files keyed by the roster, in the shapes the
LMSs document (Canvas: its gradebook export's columns and the "Points Possible" row;
Moodle: a CSV with an "Email address" column to map users by)."""
import csv
import io

import pytest
from adjusted_class import DUE, DUE_EPOCH, args, entry, put, report, write_all

from lesson10.checks.exercises import maximum
from lesson10.course.grade import lms

RING = "02_ring_attention"
ROSTER = ("student,name,sis_id,email,section,canvas_id\n"
          "alice,\"Liddell, Alice\",S001,alice@uni.example,Sec 1,101\n"
          "bob,\"Builder, Bob\",S002,bob@uni.example,Sec 2,102\n"
          "carol,\"Jones, Carol\",,,Sec 2,\n")


def _class(tmp_path):
    a = put(tmp_path / "subs" / "alice" / f"{RING}.ipynb", RING, DUE_EPOCH - 60)
    b = put(tmp_path / "subs" / f"bob_LATE_102_9_{RING}.ipynb", RING, DUE_EPOCH + 60)  # Canvas's
    reps = [report(a, "alice", RING, [entry("block_attention"), entry("merge", "failed", 0),
                                      entry("ring_attention")]),
            report(b, "bob", RING, [entry("block_attention"), entry("merge"),
                                    entry("ring_attention")])]
    (tmp_path / "roster.csv").write_text(ROSTER)
    (tmp_path / "o.csv").write_text("student,exercise,points,reason\nalice,merge,1,regrade\n")
    return [a, b], reps


def _exported(tmp_path, formats):
    paths, reps = _class(tmp_path)
    a = args(tmp_path / "out", roster=tmp_path / "roster.csv", export=formats,
             overrides=tmp_path / "o.csv", due=DUE, late_penalty="50/day")
    write_all(a, paths, reps, roster=["alice", "bob", "carol"],
              student_from=r"subs/(?P<student>[a-z]+)")
    return tmp_path / "out" / "lms"


def test_canvas_gets_its_gradebook_columns_and_points_possible(tmp_path, capsys):
    folder = _exported(tmp_path, ["canvas"])
    rows = list(csv.reader(io.StringIO((folder / "canvas-grades.csv").read_text())))
    assert rows[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "lesson10"]
    assert rows[1][0].strip() == "Points Possible" and rows[1][1:5] == ["", "", "", ""]
    assert rows[1][5] == str(maximum())          # the course file's maximum
    assert all(len(r) == 6 for r in rows)
    body = {r[2]: r for r in rows[2:]}
    assert body["S001"] == ["Liddell, Alice", "101", "S001", "alice@uni.example", "Sec 1", "4"]
    assert body["S002"][5] == "2"                  # bob's LATE_ copy: half of 4
    assert len(body) == 2 and "carol" in capsys.readouterr().err      # no key: left out


def test_moodle_gets_email_keyed_rows_with_feedback(tmp_path):
    folder = _exported(tmp_path, ["moodle"])
    rows = list(csv.DictReader(io.StringIO((folder / "moodle-grades.csv").read_text())))
    assert list(rows[0]) == ["Email address", "ID number", "lesson10", "Feedback"]
    by = {r["Email address"]: r for r in rows}
    assert set(by) == {"alice@uni.example", "bob@uni.example"}
    assert by["alice@uni.example"]["lesson10"] == "4" and "regrade" in by["alice@uni.example"]["Feedback"]
    assert by["bob@uni.example"]["lesson10"] == "2" and "LATE_" in by["bob@uni.example"]["Feedback"]


@pytest.mark.parametrize("roster, formats, says", [
    (None, ["canvas"], "needs --roster"),
    ("alice\nbob\n", ["canvas"], "no header with a 'student' column"),
    ("student,name\nalice,A\n", ["canvas"], "sis_id"),
    ("student,sis_id\nalice,S1\n", ["moodle"], "email"),
])
def test_an_export_the_roster_cannot_key_is_refused_before_grading(tmp_path, roster, formats,
                                                                   says):
    path = None
    if roster is not None:
        path = tmp_path / "r.csv"
        path.write_text(roster)
    with pytest.raises(lms.ExportError, match=says):
        lms.check(formats, path)


def test_the_grade_command_refuses_a_bad_export_with_status_2(tmp_path, capsys):
    from lesson10.course.grade import main
    nb = put(tmp_path / "subs" / "alice" / f"{RING}.ipynb", RING, DUE_EPOCH)
    assert main([str(nb), "--export", "canvas", "--no-results"]) == 2
    assert "--export needs --roster" in capsys.readouterr().err
    assert main([str(nb), "--due", "soon", "--no-results"]) == 2
    assert "not a time" in capsys.readouterr().err
