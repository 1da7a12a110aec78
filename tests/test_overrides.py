"""overrides.csv: one student's points for one exercise, with a reason, in every output;
the judge's verdict kept in the JSON's notebook reports."""
import csv
import io
import json

import pytest
from adjusted_class import DUE_EPOCH, args, entry, put, report, write_all

from lesson10.course.grade import classroom, overrides, reports

RING = "02_ring_attention"


def _class(tmp_path):
    a = put(tmp_path / "subs" / "alice" / f"{RING}.ipynb", RING, DUE_EPOCH - 60)
    b = put(tmp_path / "subs" / "bob" / f"{RING}.ipynb", RING, DUE_EPOCH - 60)
    reps = [report(a, "alice", RING, [entry("block_attention"), entry(
                "merge", "failed", 0, "merge differs\nhint: you averaged the two outputs: no",
                mistake="merge_mistake"), entry("ring_attention", "failed", 1, "causal lost",
                parts=[{"part": "non-causal", "status": "passed", "passed": True, "points": 1,
                        "max_points": 1, "message": "ok"},
                       {"part": "causal", "status": "failed", "passed": False, "points": 0,
                        "max_points": 1, "message": "causal lost"}])]),
            report(b, "bob", RING, [entry("block_attention"), entry("merge"),
                                    entry("ring_attention")])]
    return [a, b], reps


@pytest.mark.parametrize("text, says", [
    ("student,exercise,points\nalice,merge,1\n", "missing: reason"),
    ("student,exercise,points,reason\nalice,nope,1,x\n", "not an exercise"),
    ("student,exercise,points,reason\nalice,merge,2,x\n", "worth 1"),
    ("student,exercise,points,reason\nalice,merge,-1,x\n", "give 0 to 1"),
    ("student,exercise,points,reason\nalice,merge,half,x\n", "not a whole number"),
    ("student,exercise,points,reason\nalice,merge,1,\n", "no reason"),
    ("student,exercise,points,reason\n,merge,1,x\n", "no student"),
    ("student,exercise,points,reason\nalice,merge,1,x\nalice,merge,0,y\n", "line 2"),
])
def test_a_bad_overrides_file_is_refused_with_its_line(text, says):
    with pytest.raises(overrides.OverrideError, match=says):
        overrides.parse(text)


def test_a_good_file_reads_in_any_column_order_with_comments():
    got = overrides.parse("# regrades\nreason,points,exercise,student\n"
                          "\"ticket 12, case 3\",1,merge,alice\n\n")
    assert got == [{"student": "alice", "exercise": "merge", "points": 1,
                    "reason": "ticket 12, case 3", "line": 3}]


def test_an_override_flows_into_every_output_and_the_verdict_stays(tmp_path):
    paths, reps = _class(tmp_path)
    (tmp_path / "overrides.csv").write_text(
        "student,exercise,points,reason\nalice,merge,1,regrade: case 3 was ambiguous\n"
        "alice,ring_attention,2,regrade: causal mask typo only\nzed,merge,0,gone\n")
    a = args(tmp_path / "out", overrides=tmp_path / "overrides.csv")
    rows, doc = write_all(a, paths, reps)
    alice = next(r for r in doc["students"] if r["student"] == "alice")
    merge = next(e for e in alice["exercises"] if e["exercise"] == "merge")
    assert merge["points"] == 1 and merge["passed"] and merge["status"] == "overridden"
    assert merge["judged"] == {"status": "failed", "passed": False, "points": 0}
    assert merge["override"]["reason"] == "regrade: case 3 was ambiguous"
    ring = next(e for e in alice["exercises"] if e["exercise"] == "ring_attention")
    assert ring["points"] == 2 and "parts" not in ring and ring["judged_parts"]
    assert alice["points"] == 4                                   # 1 + 1 + 2
    nb = next(r for r in doc["notebooks"] if r["student"] == "alice")   # the judge's verdict
    assert [e["points"] for e in nb["exercises"]] == [1, 0, 1]
    assert doc["adjustments"]["overrides"][0]["reason"] == "regrade: case 3 was ambiguous"
    out = tmp_path / "out"
    grades = list(csv.DictReader(io.StringIO((out / "grades.csv").read_text())))
    row = next(g for g in grades if g["student"] == "alice")
    assert row["merge"] == "1" and row["merge status"] == "overridden" and row["total"] == "4"
    assert "case 3 was ambiguous" in row["adjustments"]
    fb = (out / "feedback" / "alice.md").read_text()
    assert "Override by the instructor: 1/1" in fb and "case 3 was ambiguous" in fb
    assert "case 3 was ambiguous" in (out / "feedback" / "alice.html").read_text()
    assert "case 3 was ambiguous" in (out / "summary.md").read_text()
    assert "case 3 was ambiguous" in (out / "report" / "class-report.md").read_text()
    assert "case 3 was ambiguous" in (out / "junit.xml").read_text()
    one = [r for r in rows if r["student"] == "alice"]
    gs = json.loads(reports.gradescope([reps[0]], one))
    assert gs["score"] == 4 and gs["extra_data"]["overrides"]["merge"]["points"] == 1
    assert any("case 3 was ambiguous" in t["output"] for t in gs["tests"])
    assert "case 3 was ambiguous" in gs["output"]
    cr = classroom.runner_results([reps[0]], one)
    assert sum(t["score"] for t in cr["tests"]) == 4
    assert any("case 3 was ambiguous" in t["message"] for t in cr["tests"])


def test_an_override_of_a_student_not_in_the_class_is_a_warning(tmp_path, capsys):
    paths, reps = _class(tmp_path)
    (tmp_path / "o.csv").write_text("student,exercise,points,reason\nzed,merge,0,gone\n")
    rows, doc = write_all(args(tmp_path / "out", overrides=tmp_path / "o.csv"), paths, reps)
    assert "no student 'zed'" in capsys.readouterr().err
    assert [r["points"] for r in doc["students"]] == [2, 4]       # nothing changed


def _results_folder(tmp_path):
    """A results folder as ``grade`` leaves it, made without grading."""
    from lesson10.course.grade import gradebook, store
    paths, reps = _class(tmp_path)
    the_plan = gradebook.plan(paths, {p: p.read_bytes() for p in paths})
    box = store.Store(tmp_path / "results")
    box.prepare()
    box.save_seed(7)
    keys = {p: f"k{i}" for i, p in enumerate(paths)}
    for p, rep in zip(paths, reps):
        box.put(keys[p], rep)
    box.save_class(store.class_doc(the_plan, keys, seed=7, root=str(tmp_path / "subs")))
    return box.folder


def test_the_results_folder_keeps_the_overrides_for_report_and_grade(tmp_path):
    from lesson10.course import report as class_report
    from lesson10.course.grade import adjust, main
    folder = _results_folder(tmp_path)
    (tmp_path / "o.csv").write_text("student,exercise,points,reason\nalice,merge,1,kept\n")
    assert main(["--resume", str(folder), "--overrides", str(tmp_path / "o.csv"), "--csv",
                 str(tmp_path / "g.csv"), "--seed", "7"]) == 1
    assert "kept" in (tmp_path / "g.csv").read_text()
    assert adjust.load(folder).overrides[0]["reason"] == "kept"
    assert class_report.main([str(folder), "--out", str(tmp_path / "r")]) == 0
    assert "kept" in (tmp_path / "r" / class_report.MD_NAME).read_text()
    (tmp_path / "o2.csv").write_text("student,exercise,points,reason\nbob,merge,0,new\n")
    assert class_report.main([str(folder), "--out", str(tmp_path / "r2"),
                              "--overrides", str(tmp_path / "o2.csv")]) == 0
    md = (tmp_path / "r2" / class_report.MD_NAME).read_text()
    assert "new" in md and "kept" not in md
    (tmp_path / "bad.csv").write_text("student,exercise,points,reason\nbob,merge,9,x\n")
    assert class_report.main([str(folder), "--overrides", str(tmp_path / "bad.csv")]) == 2
