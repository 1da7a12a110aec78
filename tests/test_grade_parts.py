"""Partial credit: a multi-point exercise scores per part (the ring's non-causal and causal
cases, capacity's copies per expert and which copies), each part's verdict and message reach the
feedback, and GitHub Classroom gets one test of one point per part."""
import json
from pathlib import Path

import pytest

from lesson10.checks import EXERCISES
from lesson10.checks import parts as checks_parts
from lesson10.course.grade import classroom, main

ROOT = Path(__file__).resolve().parent.parent


def _reduced(name: str, edit) -> dict:
    nb = json.loads((ROOT / "solutions" / name).read_text())
    keep = [c for c in nb["cells"] if c["cell_type"] == "markdown" or any(
        w in "".join(c["source"]) for w in ("check_", "def ", "import"))]
    nb["cells"] = [c for c in keep if "figures." not in "".join(c["source"])
                   and "summary()" not in "".join(c["source"])]
    for c in nb["cells"]:
        if c["cell_type"] == "code":
            c["source"] = edit("".join(c["source"]))
    return nb


def test_every_multi_point_exercise_names_its_parts():
    for ex in EXERCISES.values():
        if ex.part_names and ex.points:         # the course file's points, shared by the parts
            assert sum(p for _, p in ex.parts) == ex.points, ex.id
    assert [p for p, _ in EXERCISES["ring_attention"].parts] == ["non-causal", "causal"]
    assert [p for p, _ in EXERCISES["capacity"].parts] == ["copies kept per expert",
                                                           "which copies are dropped"]


def test_in_part_selects_and_counts():
    assert checks_parts.in_part("anything")               # no part judged: every case runs
    with checks_parts.judging("causal") as state:
        assert checks_parts.in_part("causal") and not checks_parts.in_part("non-causal")
    assert state["cases"] == 1


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("parts")
    sub = base / "ann"
    sub.mkdir()
    # the ring ignores causal (right without the mask, wrong with it)
    ring = _reduced("02_ring_attention.ipynb",
                    lambda s: s.replace("positions[r], k_pos, causal)", "positions[r], k_pos, False)"))
    (sub / "02_ring_attention.ipynb").write_text(json.dumps(ring))
    # capacity serves choice by choice (the right count per expert, not the right copies)
    cap = _reduced("05_moe_dispatch.ipynb", lambda s: s.replace(
        "    for t in range(N):                        # first come, first served\n"
        "        for j in range(k):\n",
        "    for j in range(k):\n"
        "        for t in range(N):\n"))
    (sub / "05_moe_dispatch.ipynb").write_text(json.dumps(cap))
    out = base / "out"
    status = main([str(sub), "--student", "ann", "--seed", "9", "-j", "2", "--no-results",
                   "--output", str(out / "r.json"), "--feedback", str(out / "fb"),
                   "--classroom", str(out / "classroom.json"), "--timeout", "60"])
    doc = json.loads((out / "r.json").read_text())
    entries = {e["exercise"]: e for e in doc["students"][0]["exercises"]}
    return {"status": status, "entries": entries, "out": out}


def test_a_part_right_scores_its_point(graded):
    ring = graded["entries"]["ring_attention"]
    share = dict(EXERCISES["ring_attention"].parts)
    assert ring["points"] == share["non-causal"] and ring["max_points"] == EXERCISES["ring_attention"].points
    assert not ring["passed"]
    got = {p["part"]: (p["status"], p["points"]) for p in ring["parts"]}
    assert got == {"non-causal": ("passed", share["non-causal"]), "causal": ("failed", 0)}
    assert ring["mistake"] == "ring_attention: attention without the causal mask"
    cap = graded["entries"]["capacity"]
    kept = dict(EXERCISES["capacity"].parts)["copies kept per expert"]
    assert {p["part"]: p["points"] for p in cap["parts"]} == {"copies kept per expert": kept,
                                                              "which copies are dropped": 0}
    assert cap["points"] == kept


def test_each_part_reaches_the_feedback(graded):
    md = (graded["out"] / "fb" / "ann.md").read_text()
    ring, cap = dict(EXERCISES["ring_attention"].parts), dict(EXERCISES["capacity"].parts)
    assert f"### ring_attention: failed ({ring['non-causal']}/{EXERCISES['ring_attention'].points})" in md
    assert f"non-causal: passed ({ring['non-causal']}/{ring['non-causal']})" in md
    assert f"causal: failed (0/{ring['causal']})" in md
    assert f"which copies are dropped: failed (0/{cap['which copies are dropped']})" in md
    assert f"copies kept per expert: passed ({cap['copies kept per expert']}/{cap['copies kept per expert']})" in md


def test_classroom_gets_one_point_per_part(graded):
    doc = json.loads((graded["out"] / "classroom.json").read_text())
    ring = {t["name"]: t for t in doc["tests"] if ": ring_attention" in t["name"]}
    assert set(ring) == {"02_ring_attention: ring_attention (non-causal)",
                         "02_ring_attention: ring_attention (causal)"}
    assert ring["02_ring_attention: ring_attention (non-causal)"]["status"] == "pass"
    assert ring["02_ring_attention: ring_attention (causal)"]["status"] == "fail"
    assert all(t["max_score"] == 1 for t in doc["tests"])
    passed = sum(t["status"] == "pass" for t in doc["tests"])
    assert passed / len(doc["tests"]) * doc["max_score"] == sum(t["score"] for t in doc["tests"])
    assert classroom.one_point_tests(graded["entries"]["capacity"])[1][1]["points"] == 0
