"""The grader's parts: the wire, the course's notebook ids, the worker protocol, the outputs,
and one end-to-end run of ``python -m lesson10 grade`` (the red team is in
test_grade_redteam.py, the CI workflow in test_grade_workflow.py)."""
import json
import re
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from lesson10 import checks
from lesson10.grade import course, exit_status, main, reports, wire
from lesson10.grade.judge import Worker, Lost, Violation, Missing
from lesson10.grade.sandbox import Package
from lesson10.grade.worker import RemoteError

ROOT = Path(__file__).resolve().parent.parent
NB = "03_load_balance.ipynb"


# ------------------------------------------------------------------ wire
def _roundtrip(value, callables=None):
    tree, blobs = wire.encode(value, callables)
    json.dumps(tree)                                   # plain JSON, nothing else
    return wire.decode(tree, blobs, make_fn=lambda i, n: ("fn", i, n))


def test_wire_round_trip_keeps_types_dtypes_and_special_floats():
    value = {"a": [np.arange(6, dtype=np.int32).reshape(2, 3), (1.5, float("nan"), -np.inf)],
             "b": np.float32(2.5), "c": None, "d": True, 3: "text", "e": np.array([True, False])}
    out = _roundtrip(value)
    assert out["a"][0].dtype == np.int32 and out["a"][0].shape == (2, 3)
    assert isinstance(out["a"][1], tuple) and np.isnan(out["a"][1][1]) and out["a"][1][2] == -np.inf
    assert isinstance(out["b"], np.float32) and out["b"] == 2.5
    assert out["c"] is None and out["d"] is True and out[3] == "text"
    assert out["e"].dtype == bool and out["a"][0].flags.writeable


def test_wire_refuses_code_and_strange_objects():
    class Sneaky(list):
        pass
    assert type(_roundtrip(Sneaky([1, 2]))) is list            # arrives as a plain list
    for bad in (np.array([object()]), object(), lambda x: x, {1, 2}, np.zeros(2, dtype=[("x", int)])):
        with pytest.raises(wire.WireError):
            wire.encode(bad)
    calls = []
    assert _roundtrip([len], calls) == [("fn", 0, "len")] and calls == [len]
    with pytest.raises(wire.WireError):                        # a forged object array
        wire.decode({"$": "array", "dtype": "|O", "shape": [1], "blob": 0}, [b"\0" * 8])
    with pytest.raises(wire.WireError):                        # size does not match
        wire.decode({"$": "array", "dtype": "<f8", "shape": [3], "blob": 0}, [b"\0" * 8])
    with pytest.raises(wire.WireError):
        wire.decode({"$": "fn", "id": 0}, [])                  # no callables this way
    nested = []
    for _ in range(wire.MAX_DEPTH + 2):
        nested = [nested]
    with pytest.raises(wire.WireError):
        wire.encode(nested)


# ------------------------------------------------------------------ the course
def test_notebook_ids_come_from_metadata_then_file_name():
    nb = json.loads((ROOT / "notebooks" / NB).read_text())
    assert nb["metadata"]["lesson10"]["notebook"] == "03_load_balance"       # written by build
    assert course.identify(nb, Path("x/homework.ipynb")) == ("03_load_balance", "metadata")
    assert course.identify({}, Path("x/03_load_balance-alice.ipynb"))[0] == "03_load_balance"
    nid, why = course.identify({"metadata": {"lesson10": {"notebook": "99_fake"}}}, Path("hw.ipynb"))
    assert nid is None and "99_fake" in why
    assert course.full_marks(None) == sum(e.points for e in checks.EXERCISES.values())
    assert course.full_marks("03_load_balance") == 4


def test_every_exercise_notebook_carries_its_id_and_function_names_match_the_check_cells():
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = json.loads(path.read_text())
        assert course.identify(nb, Path("renamed.ipynb"))[0] == path.stem
    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        assert path.stem in course.course_notebooks()
        text = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"])
        for ex_id, fn in re.findall(r"check_(\w+)\((\w+)\)", text):
            assert course.function_name(ex_id) == fn, (path.name, ex_id)


def test_check_cells_and_kernels():
    assert course.is_check_cell("checks.check_merge(merge)\nchecks.summary()")
    assert course.is_check_cell("check_merge(merge, seed=0)")
    assert not course.is_check_cell("def f():\n    pass\nchecks.check_merge(f)")
    assert not course.is_check_cell("%timeit x")                 # a magic: kept, IPython runs it
    nb = {"cells": [{"cell_type": "code", "source": ["x = 1"]},
                    {"cell_type": "markdown", "source": "check_x(y)"},
                    {"cell_type": "code", "source": "checks.check_merge(merge)"}]}
    assert course.worker_cells(nb) == [(0, "x = 1")]
    assert course.language_problem({"metadata": {"kernelspec": {"name": "julia-1.10",
                                                                 "language": "julia"}}})
    assert course.language_problem({"metadata": {"kernelspec": {"name": "python3"}}}) is None


# ------------------------------------------------------------------ the worker protocol
@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("worker")
    cells = [(0, "import numpy as np\nfrom lesson10 import layouts"),
             (1, "def bump(x, ys):\n    x[0] = 99.0\n    ys[1][:] = -1\n    return float(x.sum())"),
             (2, "def apply(f, x):\n    return f(x) + f(2 * x)"),
             (3, "def broken(x):\n    raise KeyError('nope')"),
             (4, "def stub(x):\n    raise NotImplementedError"),
             (5, "def cheat(w):\n    return layouts.ring_time(w)"),
             (6, "checks_would_run = True"), (7, "import os\nos._exit(1)"), (8, "after_exit = 1")]
    w = Worker(cells, package=Package(), tmp=tmp, workdir=tmp, memory=2**31, cell_timeout=20,
               fingerprints=[])
    assert w.start(time.monotonic() + 60)
    yield w
    w.kill()


def test_worker_copies_mutations_back_and_calls_back(worker):
    far = time.monotonic() + 30
    x, ys = np.zeros(3), [np.ones(2), np.ones(2)]
    assert worker.call("bump", (x, ys), {}, (), far) == 99.0
    assert x[0] == 99.0 and (ys[1] == -1).all() and (ys[0] == 1).all()
    seen = []

    def op(v):
        seen.append(v.shape)
        return v + 1
    out = worker.call("apply", (op, np.arange(3.0)), {}, (), far)
    assert np.allclose(out, np.arange(3.0) * 3 + 2) and seen == [(3,), (3,)]


def test_worker_errors_missing_and_reference_calls(worker):
    far = time.monotonic() + 30
    with pytest.raises(RemoteError) as err:
        worker.call("broken", (1,), {}, (), far)
    assert type(err.value).__name__ == "KeyError" and "nope" in str(err.value)
    with pytest.raises(NotImplementedError):
        worker.call("stub", (1,), {}, (), far)
    with pytest.raises(Missing):
        worker.call("after_exit", (), {}, (), far)             # not a function
    with pytest.raises(Violation, match="lesson10.layouts.ring_time"):
        worker.call("cheat", (np.ones((2, 2)),), {}, (), far)
    assert worker.call("cheat", (np.ones((2, 2)),), {}, ("lesson10.layouts.ring_time",), far) == 2
    assert "cell 7 killed the grading worker: skipped" in worker.notes


def test_worker_timeout_kills_it(tmp_path):
    w = Worker([(0, "def spin():\n    while True:\n        pass")], package=Package(), tmp=tmp_path,
               workdir=tmp_path, memory=2**31, cell_timeout=20, fingerprints=[])
    try:
        assert w.start(time.monotonic() + 60)
        pid = w.proc.pid
        with pytest.raises(Lost) as lost:
            w.call("spin", (), {}, (), time.monotonic() + 1)
        assert lost.value.status == "timed out" and not w.alive()
        with pytest.raises(ProcessLookupError):
            import os
            os.kill(pid, 0)
    finally:
        w.kill()


# ------------------------------------------------------------------ outputs
def _fake(student, notebook, entries, ok=True):
    return {"notebook": f"subs/{student}/{notebook}.ipynb", "student": student,
            "course_notebook": notebook, "ok": ok, "error": None, "feedback": [],
            "exercises": [{"exercise": e, "status": "passed" if p else "failed", "passed": bool(p),
                           "points": p, "max_points": m, "message": "" if p else "wrong <here> & \x01"}
                          for e, p, m in entries],
            "points": sum(p for _, p, _ in entries), "max_points": sum(m for _, _, m in entries)}


def test_reports_csv_gradescope_junit_and_exit_status():
    reps = [_fake("alice", "03_load_balance", [("zigzag_positions", 1, 1), ("causal_work", 2, 2),
                                               ("ring_time", 0, 1)]),
            _fake("bob", "02_ring_attention", [("merge", 1, 1)])]
    rows = reports.class_csv(reps).splitlines()
    assert rows[0] == "student,merge,zigzag_positions,causal_work,ring_time,total,max"
    assert rows[1:] == ["alice,0,1,2,0,3,5", "bob,1,0,0,0,1,5"]
    gs = json.loads(reports.gradescope(reps))
    assert (gs["score"], gs["max_score"], len(gs["tests"])) == (4, 5, 4)
    assert set(gs["tests"][2]) >= {"name", "score", "max_score", "output", "visibility"}
    root = ET.fromstring(reports.junit(reps))                    # valid XML despite \x01 and <
    cases = root.findall(".//testcase")
    assert len(cases) == 4 and len(root.findall(".//failure")) == 1
    assert "wrong <here>" in root.find(".//failure").text
    assert exit_status(reps) == 1 and exit_status(reps, fail_under=80) == 0
    assert exit_status(reps, fail_under=81) == 1
    assert exit_status(reps + [_fake("carl", "01", [], ok=False)]) == 2
    assert exit_status([_fake("dan", "02", [("merge", 1, 1)])]) == 0
    assert "| subs/alice/03_load_balance.ipynb | ring_time | failed | 0/1 |" in reports.markdown(reps)


# ------------------------------------------------------------------ end to end
def test_grade_solution_and_blank_notebook_end_to_end(tmp_path, capsys):
    out, gs, ju = tmp_path / "r.json", tmp_path / "gs.json", tmp_path / "j.xml"
    status = main([str(ROOT / "solutions" / NB), str(ROOT / "notebooks" / NB), "--json", "-j", "2",
                   "--output", str(out), "--gradescope", str(gs), "--junit", str(ju),
                   "--timeout", "60", "--save-executed", str(tmp_path / "runs")])
    report = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text()) == report
    assert (report["points"], report["max_points"]) == (4, 8)
    solved, blank = report["notebooks"]
    assert solved["ok"] and blank["ok"] and solved["points"] == 4 and blank["points"] == 0
    assert {e["status"] for e in blank["exercises"]} == {"not attempted"}
    assert blank["feedback"] == []                              # the exercise notebook runs clean
    assert status == 1
    assert json.loads(gs.read_text())["score"] == 4
    assert len(ET.parse(ju).getroot().findall(".//failure")) == 3
    ran = json.loads((tmp_path / "runs" / "solutions" / NB).read_text())   # the student's outputs
    outs = [o.get("text", "") for c in ran["cells"] for o in c.get("outputs", [])]
    assert any("check_ring_time passed" in "".join(t) for t in outs)


def test_missing_file_and_bad_options_are_status_2(tmp_path, capsys):
    assert main([str(tmp_path / "nope.ipynb")]) == 2
    assert "no such file" in capsys.readouterr().out
    assert main([str(tmp_path / "nope.ipynb"), "--fail-under", "120"]) == 2


def test_wire_plain_python_extras_and_copy_back_through_tuples():
    assert _roundtrip(range(3)) == [0, 1, 2]
    assert _roundtrip(1 + 2j) == 1 + 2j
    from lesson10.grade.judge import _copy_back
    a, b = np.zeros(2), [np.zeros(1), 5]
    _copy_back([(a,), b], [(np.ones(2),), [np.full(1, 7.0), 6]])
    assert (a == 1).all() and b[0][0] == 7 and b[1] == 6
