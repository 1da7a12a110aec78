"""Similarity flags: an answer pasted from the package (inspect.getsource), two students'
same answer, names aside; honest and unwritten answers unflagged; never a point changed."""
import importlib
import inspect
import json
import textwrap

from adjusted_class import DUE_EPOCH, args, entry, put, report, write_all

from lesson10.course.grade import similarity

RING = "02_ring_attention"
PASTED = inspect.getsource(importlib.import_module("lesson10.sim.attention").merge)
# the package's body, every name changed and comments added: still the package's code
RENAMED = (PASTED.replace("lse1", "la").replace("lse2", "lb").replace("m_safe", "shift")
           .replace("total", "z").replace("seen", "ok") + "    # my own work\n")
SHARED = textwrap.dedent('''
    def ring_time(work, t_block):
        """mine"""
        busiest = [max(row) for row in work]
        total_time = 0.0
        for b in busiest:
            total_time = total_time + b * t_block
        return float(total_time)
''')
SHARED_RENAMED = (SHARED.replace("busiest", "peaks").replace("total_time", "acc")
                  .replace('"""mine"""', "# ours"))
HONEST = textwrap.dedent('''
    def merge(o1, lse1, o2, lse2):
        import numpy as np
        big = np.logaddexp(lse1, lse2)
        safe = np.where(np.isfinite(big), big, 0.0)
        a = np.nan_to_num(np.exp(lse1 - safe))[..., None]
        b = np.nan_to_num(np.exp(lse2 - safe))[..., None]
        return a * o1 + b * o2, big
''')
STUB = "def merge(o1, lse1, o2, lse2):\n    raise NotImplementedError\n"


def _nb(*codes) -> bytes:
    cells = [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
              "source": code} for code in codes]
    return json.dumps({"cells": cells, "metadata": {"lesson10": {"notebook": RING}},
                       "nbformat": 4, "nbformat_minor": 5}).encode()


def _row(student, path):
    return {"student": student, "notebooks": {RING: str(path)}}


def test_a_pasted_or_renamed_package_function_is_flagged(tmp_path):
    a = put(tmp_path / "a" / f"{RING}.ipynb", RING, 0, _nb("import numpy as np", PASTED))
    b = put(tmp_path / "b" / f"{RING}.ipynb", RING, 0, _nb(RENAMED))
    got = similarity.flags([_row("ann", a), _row("ben", b)])
    who = {(f["student"], f["exercise"], f["matches"]) for f in got["source"]}
    assert who == {("ann", "merge", "lesson10.sim.attention.merge"),
                   ("ben", "merge", "lesson10.sim.attention.merge")}
    assert {"exercise": "merge", "students": ["ann", "ben"]} in got["pairs"]


def test_two_students_same_answer_is_a_pair_and_honest_stub_answers_are_not(tmp_path):
    a = put(tmp_path / "a" / f"{RING}.ipynb", RING, 0, _nb(SHARED, HONEST))
    b = put(tmp_path / "b" / f"{RING}.ipynb", RING, 0, _nb(SHARED_RENAMED, STUB))
    c = put(tmp_path / "c" / f"{RING}.ipynb", RING, 0, _nb(STUB, "%%time\nx = 1"))
    got = similarity.flags([_row("ann", a), _row("ben", b), _row("cy", c)])
    assert got["pairs"] == [{"exercise": "ring_time", "students": ["ann", "ben"]}]
    assert got["source"] == [] and got["unread"] == []


def test_an_unreadable_notebook_is_listed_not_raised(tmp_path):
    bad = tmp_path / "x" / f"{RING}.ipynb"
    bad.parent.mkdir()
    bad.write_bytes(b"\xff{not json")
    got = similarity.flags([_row("zed", bad), _row("gone", tmp_path / "none.ipynb")])
    assert [u["student"] for u in got["unread"]] == ["zed"] and got["source"] == []


def test_flags_change_no_point_and_reach_the_json_and_the_report(tmp_path):
    a = put(tmp_path / "subs" / "ann" / f"{RING}.ipynb", RING, DUE_EPOCH, _nb(PASTED))
    b = put(tmp_path / "subs" / "ben" / f"{RING}.ipynb", RING, DUE_EPOCH, _nb(RENAMED))
    full = [entry("block_attention"), entry("merge"), entry("ring_attention")]
    reps = [report(a, "ann", RING, [dict(e) for e in full]),
            report(b, "ben", RING, [dict(e) for e in full])]
    rows, doc = write_all(args(tmp_path / "out"), [a, b], reps)
    assert [r["points"] for r in doc["students"]] == [4, 4]
    assert {f["student"] for f in doc["similarity"]["source"]} == {"ann", "ben"}
    md = (tmp_path / "out" / "report" / "class-report.md").read_text()
    assert "## Similarity flags" in md and "lesson10.sim.attention.merge" in md
    assert "| ann and ben | merge |" in md
