"""The late policy: hand-in times from the LMS's marks, extensions, penalties in whole points,
the latest copy on time, and lateness shown in every output."""
import csv
import io
import json

import pytest
from adjusted_class import DUE, DUE_EPOCH, args, entry, put, report, write_all

from lesson10.course.grade import classroom, gradebook, late, reports

RING = "02_ring_attention"
HOUR = 3600.0


def _pol(**kw):
    return late.policy(DUE, **kw)


@pytest.mark.parametrize("name, source, mark", [
    ("smithjane_LATE_1234_5678_02_ring_attention.ipynb", "Canvas LATE_ mark", True),
    ("smithjane_1234_5678_02_ring_attention.ipynb", "Canvas name (no LATE_ mark)", False),
    ("Jane Smith_4711_assignsubmission_file_2026-03-02_14-05_02_ring.ipynb", "file time", None),
    ("02_ring_attention.ipynb", "file time", None),
])
def test_the_hand_in_time_comes_from_the_lms_marks_first(name, source, mark):
    st = late.stamp(f"subs/{name}", DUE_EPOCH + 5 * HOUR)
    assert st["source"] == source and st["late_mark"] is mark


def test_a_time_in_a_name_counts_only_where_time_from_says():
    hand_in = "subs/jane_20260302T1405"
    assert late.stamp(hand_in, DUE_EPOCH - HOUR)["time"] == DUE_EPOCH - HOUR    # typed: no
    st = late.stamp(hand_in, DUE_EPOCH - HOUR, r"_(?P<time>\d{8}T\d{4})$")
    assert st["source"] == "time in the path (--time-from)"
    assert late.seconds_late(st, _pol().due, "hour") > 0                  # 2 March
    assert late.stamp(None, 1.0, r"(?P<time>.+)")["time"] == 1.0          # no hand-in: none
    assert late.path_time("a/2026-03-02 14:05:59+00:00/x", r"a/(?P<time>[^/]+)/") == \
        DUE_EPOCH + 14 * HOUR + 6 * 60 + 59
    with pytest.raises(late.LateError, match="not a regular expression"):
        late.policy(DUE, time_from="(?P<time>")


def test_canvas_decides_late_or_not_whatever_the_file_time():
    pol = _pol(penalty="10/day")
    on_time = late.stamp("a/jane_1_2_x.ipynb", DUE_EPOCH + 50 * HOUR)   # unzip's time
    assert late.seconds_late(on_time, pol.due, "day") == 0
    marked = late.stamp("a/jane_LATE_1_2_x.ipynb", DUE_EPOCH - HOUR)     # no later time
    assert late.seconds_late(marked, pol.due, "day") is None
    assert late.percent_of(None, pol) == 10                       # one unit charged


@pytest.mark.parametrize("hours, unit, pct, cap, want", [
    (1, "day", 10, 100, 10), (24, "day", 10, 100, 10), (25, "day", 10, 100, 20),
    (26, "hour", 2, 100, 52), (100, "day", 30, 50, 50), (0.5, "hour", 5, 100, 5)])
def test_each_unit_started_costs_the_percentage_up_to_the_cap(hours, unit, pct, cap, want):
    pol = _pol(penalty=f"{pct}/{unit}", cap=cap)
    assert late.percent_of(hours * HOUR, pol) == want


@pytest.mark.parametrize("kw, says", [
    (dict(due="tomorrow"), "not a time"),
    (dict(due=DUE, penalty="10 per day"), "per day or per hour"),
    (dict(due=DUE, cap=120), "from 0 to 100"),
    (dict(due=None, penalty="10/day"), "need --due"),
    (dict(due=None, time_from="(?P<time>.+)"), "need --due"),
    (dict(due=DUE, extensions={"bob": "next week"}), "extension of bob"),
])
def test_a_policy_that_cannot_be_read_is_refused(kw, says):
    with pytest.raises(late.LateError, match=says):
        late.policy(**kw)


def test_extensions_are_times_or_lengths():
    pol = _pol(extensions={"a": "2d", "b": "36h", "c": "2026-03-04T12:00:00+00:00", "d": "1"})
    assert pol.due_for("a").timestamp() == DUE_EPOCH + 48 * HOUR
    assert pol.due_for("b").timestamp() == DUE_EPOCH + 36 * HOUR
    assert pol.due_for("c").timestamp() == 1772625600.0
    assert pol.due_for("d").timestamp() == DUE_EPOCH + 24 * HOUR
    assert pol.due_for("nobody") == pol.due


#: alice and bob hand in folders, carol a Canvas file: each its student's hand-in
KW = dict(student_from=r"subs/(?P<student>[a-z]+)")


def _class(tmp_path):
    """alice on time; bob 30 hours late by his file's time, with an extension of 2 days on
    the roster; carol's Canvas file marked LATE_ (its time says nothing later)."""
    a = put(tmp_path / "subs" / "alice" / f"{RING}.ipynb", RING, DUE_EPOCH - HOUR)
    b = put(tmp_path / "subs" / "bob" / f"{RING}.ipynb", RING, DUE_EPOCH + 30 * HOUR)
    c = put(tmp_path / "subs" / f"carol_LATE_11_22_{RING}.ipynb", RING, DUE_EPOCH)
    full = [entry("block_attention"), entry("merge"), entry("ring_attention")]
    reps = [report(p, who, RING, [dict(e) for e in full])
            for p, who in ((a, "alice"), (b, "bob"), (c, "carol"))]
    (tmp_path / "roster.csv").write_text("student,extension\nalice,\nbob,2d\ncarol,\n")
    return [a, b, c], reps


def test_lateness_and_extensions_flow_into_every_output(tmp_path):
    paths, reps = _class(tmp_path)
    a = args(tmp_path / "out", due=DUE, late_penalty="25/day", roster=tmp_path / "roster.csv")
    rows, doc = write_all(a, paths, reps, roster=["alice", "bob", "carol"], **KW)
    by = {r["student"]: r for r in doc["students"]}
    assert by["alice"]["late"] == [] and by["alice"]["points"] == 4
    assert by["bob"]["late"] == [] and by["bob"]["points"] == 4         # the extension
    assert by["bob"]["due"].startswith("2026-03-0")
    (item,) = by["carol"]["late"]
    assert item["source"] == "Canvas LATE_ mark" and item["percent"] == 25
    assert item["points_lost"] == 1 and by["carol"]["points"] == 3      # 25% of 4
    ring = next(e for e in by["carol"]["exercises"] if e["exercise"] == "ring_attention")
    assert ring["points"] == 1 and ring["late_penalty"] == 1 and ring["judged"]["points"] == 2
    assert doc["notebooks"][2]["points"] == 4                           # the judge's verdict
    out = tmp_path / "out"
    grades = {g["student"]: g for g in csv.DictReader(io.StringIO((out / "grades.csv").read_text()))}
    assert grades["carol"]["total"] == "3" and "LATE_" in grades["carol"]["late"]
    assert grades["bob"]["late"] == "" and grades["bob"]["total"] == "4"
    assert "Canvas LATE_ mark" in (out / "feedback" / "carol.md").read_text()
    assert "Canvas LATE_ mark" in (out / "summary.md").read_text()
    assert "Canvas LATE_ mark" in (out / "report" / "class-report.md").read_text()
    one = [r for r in rows if r["student"] == "carol"]
    gs = json.loads(reports.gradescope([reps[2]], one))
    assert gs["score"] == 3 and gs["extra_data"]["late"][0]["points_lost"] == 1
    assert "late by an unknown time" in gs["output"]
    cr = classroom.runner_results([reps[2]], one)
    assert sum(t["score"] for t in cr["tests"]) == 3


def test_without_the_extension_the_same_file_is_late(tmp_path):
    paths, reps = _class(tmp_path)
    a = args(tmp_path / "out", due=DUE, late_penalty="25/day")
    rows, doc = write_all(a, paths, reps, **KW)
    bob = next(r for r in doc["students"] if r["student"] == "bob")
    (item,) = bob["late"]
    assert item["hours_late"] == 30 and item["percent"] == 50 and bob["points"] == 2


def test_an_extensions_file_overrides_the_roster(tmp_path):
    paths, reps = _class(tmp_path)
    (tmp_path / "ext.csv").write_text("student,extension\nbob,1h\n")
    a = args(tmp_path / "out", due=DUE, late_penalty="25/day", roster=tmp_path / "roster.csv",
             extensions=tmp_path / "ext.csv")
    rows, doc = write_all(a, paths, reps, roster=["alice", "bob", "carol"], **KW)
    bob = next(r for r in doc["students"] if r["student"] == "bob")
    assert bob["late"] and bob["late"][0]["hours_late"] == 29


def test_an_overridden_exercise_loses_nothing_to_lateness(tmp_path):
    paths, reps = _class(tmp_path)
    (tmp_path / "o.csv").write_text("student,exercise,points,reason\ncarol,ring_attention,2,ok\n"
                                    "carol,merge,1,ok\n")
    a = args(tmp_path / "out", due=DUE, late_penalty="100/day", overrides=tmp_path / "o.csv")
    rows, doc = write_all(a, paths, reps, **KW)
    carol = next(r for r in doc["students"] if r["student"] == "carol")
    assert carol["points"] == 3 and carol["late"][0]["points_lost"] == 1    # block_attention


def test_the_latest_copy_on_time_is_graded(tmp_path):
    old = put(tmp_path / "subs" / "dave" / f"{RING}.ipynb", RING, DUE_EPOCH - 2 * HOUR)
    mid = put(tmp_path / "subs" / "dave" / f"{RING} (1).ipynb", RING, DUE_EPOCH - HOUR)
    new = put(tmp_path / "subs" / "dave" / f"{RING} (2).ipynb", RING, DUE_EPOCH + HOUR)
    paths = [old, mid, new]
    plan = gradebook.plan(paths, {p: p.read_bytes() for p in paths})
    assert plan.graded[0].path == new                    # the copy rule: the newest
    late.choose_on_time(plan, _pol(on_time_copy=True))
    assert [it.path for it in plan.graded] == [mid]
    assert set(plan.ignored) == {old, new} and all(c.path == mid for c in plan.ignored.values())
    plan = gradebook.plan(paths, {p: p.read_bytes() for p in paths})
    late.choose_on_time(plan, _pol())                    # without the option: unchanged
    assert plan.graded[0].path == new


def test_a_notebook_from_a_zip_has_the_zips_mark_and_time(tmp_path):
    st = late.stamp("all.zip/bob_LATE_12_34_hw.zip", None)      # the hand-in's name
    assert st["source"] == "Canvas LATE_ mark" and st["late_mark"] is True
    archive = tmp_path / "class" / "ann" / "hw.zip"
    put(archive, RING, DUE_EPOCH + 7 * HOUR, b"PK")
    inside = str(archive / "notebooks" / f"{RING}.ipynb")
    assert late.time_of(inside, {}) == DUE_EPOCH + 7 * HOUR
    assert late.time_of(str(tmp_path / "gone.ipynb"), {}) is None
    pol = _pol(penalty="1/hour")
    assert late.seconds_late(late.stamp("class/ann", late.time_of(inside, {})), pol.due,
                             "hour") == 7 * HOUR
