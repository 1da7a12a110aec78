"""The grader's parts: the wire, the course's notebook ids, the stand-in package, the
sandbox, one judged exercise, the outputs, and end-to-end runs of ``python -m lesson10
grade`` (the red team is in test_grade_redteam.py)."""
import ast
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

import lesson10
from lesson10 import checks
from lesson10.checks.exercises import maximum
from lesson10.course.grade import course, exit_status, judge, main, sandbox, standin, wire

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
    assert course.full_marks(None) == maximum()
    assert course.full_marks("03_load_balance") == 4


def test_every_exercise_notebook_carries_its_id_and_function_names_match_the_check_cells():
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = json.loads(path.read_text())
        assert course.identify(nb, Path("renamed.ipynb"))[0] == path.stem
    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        assert path.stem in course.course_notebooks()
        if path.stem in course.NOTEBOOKS_WITHOUT_EXERCISES:    # 06: checked in Jupyter only, not registered
            continue
        text = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"])
        for ex_id, fn in re.findall(r"check_(\w+)\((\w+)\)", text):
            assert course.function_name(ex_id) == fn, (path.name, ex_id)


def test_code_cells_and_kernels():
    nb = {"cells": [{"cell_type": "code", "source": ["x = 1"]},
                    {"cell_type": "markdown", "source": "check_x(y)"},
                    {"cell_type": "code", "source": "   "},
                    {"cell_type": "code", "source": "checks.check_merge(merge)"}]}
    assert course.code_cells(nb) == [(0, "x = 1"), (3, "checks.check_merge(merge)")]
    assert course.called_checks(nb) == {"merge"}
    assert course.language_problem({"metadata": {"kernelspec": {"name": "julia-1.10",
                                                                 "language": "julia"}}})
    assert course.language_problem({"metadata": {"kernelspec": {"name": "python3"}}}) is None


def test_wire_sends_an_object_as_its_methods_only():
    class Net:
        __wire_methods__ = ("ring_shift",)
        secret = 42

        def ring_shift(self, xs):
            return xs[::-1]

    calls = []
    tree, blobs = wire.encode([Net()], calls)
    stubs = {}
    obj = wire.decode(tree, blobs, make_fn=lambda i, n: stubs.setdefault(n, (lambda *a: calls[i](*a))))[0]
    assert obj.ring_shift([1, 2]) == [2, 1]
    with pytest.raises(AttributeError, match="offers only ring_shift"):
        _ = obj.secret
    with pytest.raises(wire.WireError):                       # no objects without callables
        wire.encode(Net())
    back, _ = wire.encode([obj], [])                          # copied back: stays where it lives
    assert wire.decode(back, [], make_fn=lambda i, n: None) == [None]


# ------------------------------------------------------------------ the stand-in
@pytest.fixture(scope="module")
def box(tmp_path_factory):
    folder = standin.write(tmp_path_factory.mktemp("standin") / "box")
    yield folder
    for p in [folder, *folder.rglob("*")]:
        os.chmod(p, 0o755)


def _inside(box, code: str) -> subprocess.CompletedProcess:
    """Run ``code`` with only the stand-in (and NumPy) importable, as the sandbox does."""
    boot = f"import sys; sys.path.insert(0, {str(box)!r}); " + code
    return subprocess.run([sys.executable, "-I", "-c", boot], capture_output=True, text=True,
                          timeout=600, cwd=box)


def test_standin_has_the_names_and_none_of_the_code(box):
    source = Path(lesson10.__file__).parent
    real = (source / "sim" / "ring.py").read_text()
    fake = (box / "lesson10" / "sim" / "ring.py").read_text()
    assert "ring_attention" in fake and "def " not in fake and len(fake) < len(real) / 3
    for path in (box / "lesson10").rglob("*.py"):        # names and literals, no code
        if path.name == "_standin.py" or path.parent.name == "checks" and path.stem == "__init__":
            continue
        tree = ast.parse(path.read_text())             # code, not the text of a literal
        code = [type(n).__name__ for n in ast.walk(tree)
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.Return,
                                  ast.For, ast.While, ast.comprehension))
                or isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                and n.value.id == "np"]
        assert not code, (path, code)
    proc = _inside(box, "from lesson10 import checks, cost, figures, layouts\n"
                        "from lesson10.sim import SimGroup, attention, ring_attention as ref\n"
                        "import lesson10.spmd\n"
                        "print(sorted(n for n in dir(checks) if n.startswith('check_')))\n"
                        "figures.ring_rounds(n=4)\n"
                        "try:\n    ref([], [], [], [])\nexcept Exception as e:\n"
                        "    print(type(e).__name__, e)\n"
                        "try:\n    SimGroup(4)\nexcept Exception as e:\n    print(type(e).__name__)\n"
                        "print(issubclass(checks.CheckFailed, AssertionError), cost.__name__)")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert eval(lines[0]) == sorted(f"check_{e}" for e in checks.EXERCISES)
    assert "interactive figure" in lines[1]
    assert lines[2].startswith("NotAvailable lesson10.sim.ring_attention is not available")
    assert lines[3] == "NotAvailable" and lines[4] == "True lesson10.cost"


def test_standin_refuses_by_exercise_name_while_judging(box):
    proc = _inside(box, "import lesson10._standin as s\nfrom lesson10 import layouts\n"
                        "s.JUDGING = ('ring_time', 'write it yourself')\n"
                        "try:\n    layouts.ring_time([[1]])\nexcept Exception as e:\n    print(e)")
    assert proc.stdout.strip() == ("exercise ring_time may not call lesson10.layouts.ring_time; "
                                   "write it yourself")


# ------------------------------------------------------------------ the sandbox
needs_bwrap = pytest.mark.skipif(sandbox.probe() is not None,
                                 reason=f"no sandbox here: {sandbox.probe()}")


@needs_bwrap
def test_sandbox_sees_no_package_no_network_no_other_process(box):
    argv = sandbox.bwrap_argv(box, sandbox.Limits(), {"PATH": "/usr/bin:/bin"})
    code = ("import os, socket, pathlib\n"
            f"print(os.getpid(), len([p for p in os.listdir('/proc') if p.isdigit()]))\n"
            f"print(pathlib.Path({str(Path(lesson10.__file__))!r}).exists())\n"
            "try:\n    socket.create_connection(('127.0.0.1', 1), timeout=2)\n"
            "except OSError as e:\n    print('no network', type(e).__name__)\n"
            "for d in ('/usr', os.path.dirname(os.__file__), '/opt/lesson10'):\n"
            "    try:\n        open(os.path.join(d, 'x'), 'w')\n        print('wrote', d)\n"
            "    except OSError:\n        print('read-only')\n"
            "open('/tmp/work/ok', 'w').write('fine'); print('tmp ok')")
    proc = subprocess.run(argv + [sys.executable, "-I", "-c", code], capture_output=True,
                          text=True, timeout=600)
    lines = proc.stdout.splitlines()
    pid, nprocs = map(int, lines[0].split())
    assert pid <= 3 and nprocs <= 3, proc.stdout            # its own PID namespace
    assert lines[1] == "False"                               # the package's files are not there
    assert lines[2].startswith("no network")
    assert lines[3:6] == ["read-only"] * 3 and lines[6] == "tmp ok", proc.stdout + proc.stderr


@needs_bwrap
def test_the_real_package_is_hidden_where_a_bound_folder_holds_it(monkeypatch, tmp_path):
    pkg = Path(lesson10.__file__).resolve().parent
    assert sandbox.hidden_paths([str(pkg.parent)]) == [str(pkg)] + (
        [str(pkg.parent / "solutions")] if (pkg.parent / "solutions").is_dir() else [])
    assert sandbox.hidden_paths([str(tmp_path)]) == []


def test_no_sandbox_is_refused_unless_asked(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sandbox._PROBE, "result", "bubblewrap (bwrap) is not installed")
    assert main([str(ROOT / "notebooks" / NB)]) == 2
    assert "--no-sandbox" in capsys.readouterr().err


# ------------------------------------------------------------------ one judged call
class _Fork:
    """A stand-in for the runner's fork: serves ``fn`` on a socket in a thread."""

    def __init__(self, fn, tmp_path, box):
        self.judge_end, inside = socket.socketpair()
        sys.path.insert(0, str(box))
        try:
            import _lesson10_runner as r
        finally:
            sys.path.remove(str(box))
        import threading
        self.thread = threading.Thread(target=r.Serve(r.wire.Conn(inside.fileno(), inside.fileno())).serve,
                                       args=(fn,), daemon=True)
        self.inside = inside
        self.thread.start()

    def stop(self) -> None:
        """End the serving thread before its socket's number can be reused by another test."""
        self.judge_end.close()                   # EOF: serve() returns
        self.thread.join(5)
        self.inside.close()


def test_importing_the_runner_leaves_the_path_alone(box):
    before = list(sys.path)
    _Fork(lambda: None, None, box).stop()
    assert sys.path == before and str(box) not in sys.path
    assert not sys.modules["lesson10"].__file__.startswith(str(box))


def test_a_judged_exercise_passes_fails_and_sees_mutations(box, tmp_path):
    ex = checks.EXERCISES["ring_time"]

    def right(work):
        return np.asarray(work).max(axis=1).sum()

    def sorts(work):
        work.sort(axis=1)                                    # changes its input
        return work.max(axis=1).sum()

    rng = np.random.default_rng(0)
    got = {}
    for name, fn in (("right", right), ("sorts", sorts), ("stub", None)):
        if fn is None:
            def fn(work):
                raise NotImplementedError
        fork = _Fork(fn, tmp_path, box)
        ch = judge.Channel(fork.judge_end, "ring_time")
        got[name] = judge.judge_exercise(ch, ex, rng, __import__("time").monotonic() + 30, 30)
        ch.close()
        fork.thread.join(5)
        fork.inside.close()
    assert got["right"]["status"] == "passed" and got["right"]["points"] == 1, got["right"]["message"]
    assert got["sorts"]["status"] == "failed" and "in place" in got["sorts"]["message"]
    assert got["stub"]["status"] == "not attempted"


def _fake(student, notebook, entries, ok=True):
    return {"notebook": f"subs/{student}/{notebook}.ipynb", "student": student,
            "course_notebook": notebook, "ok": ok, "error": None, "feedback": [],
            "exercises": [{"exercise": e, "status": "passed" if p else "failed", "passed": bool(p),
                           "points": p, "max_points": m, "message": "" if p else "wrong <here> & \x01"}
                          for e, p, m in entries],
            "points": sum(p for _, p, _ in entries), "max_points": sum(m for _, _, m in entries)}


def test_exit_status():
    """(The CSV, Gradescope, JUnit and Markdown outputs are tested in test_gradebook*.py.)"""
    reps = [_fake("alice", "03_load_balance", [("zigzag_positions", 1, 1), ("causal_work", 2, 2),
                                               ("ring_time", 0, 1)]),
            _fake("bob", "02_ring_attention", [("merge", 1, 1)])]
    assert exit_status(reps) == 1 and exit_status(reps, fail_under=80) == 0
    assert exit_status(reps, fail_under=81) == 1
    assert exit_status(reps + [_fake("carl", "01", [], ok=False)]) == 2
    assert exit_status([_fake("dan", "02", [("merge", 1, 1)])]) == 0


# ------------------------------------------------------------------ end to end
def test_grade_solution_and_blank_notebook_end_to_end(tmp_path, capsys):
    out, ju = tmp_path / "r.json", tmp_path / "j.xml"
    files = []                  # copies: the other xdist worker runs these notebooks meanwhile
    for folder in ("solutions", "notebooks"):
        (tmp_path / folder).mkdir()
        files.append(str(shutil.copy(ROOT / folder / NB, tmp_path / folder / NB)))
    status = main([*files, "--json", "-j", "2",
                   "--output", str(out), "--junit", str(ju),
                   "--timeout", "60", "--save-executed", str(tmp_path / "runs")])
    report = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text()) == report
    full = course.full_marks("03_load_balance")             # the course file's points of 03
    assert (report["points"], report["max_points"]) == (full, 2 * full)
    solved, blank = report["notebooks"]
    assert solved["ok"] and blank["ok"] and solved["points"] == full and blank["points"] == 0
    assert {e["status"] for e in blank["exercises"]} == {"not attempted"}, \
        (blank["feedback"], [e["message"] for e in blank["exercises"]])
    assert blank["feedback"] == []                              # the exercise notebook runs clean
    assert status == 1
    root = ET.parse(ju).getroot()              # every course exercise of both "students"
    assert len(root.findall(".//testcase")) == 2 * len(checks.EXERCISES)
    optional = [ex for ex in checks.EXERCISES.values() if ex.optional]
    practice = 2 * len(optional) - sum(ex.notebook == "03_load_balance" for ex in optional)
    lost = 2 * len(checks.EXERCISES) - len(course.exercises("03_load_balance"))
    assert len(root.findall(".//failure")) == lost - practice      # optional practice: <skipped>
    assert len(root.findall(".//skipped")) == practice
    ran = json.loads((tmp_path / "runs" / "solutions" / NB).read_text())   # the student's outputs
    outs = [o.get("text", "") for c in ran["cells"] for o in c.get("outputs", [])]
    worth = checks.EXERCISES["ring_time"].points
    assert any(f"[grader] check_ring_time: passed ({worth}/{worth})" in "".join(t) for t in outs)
    assert solved["sandboxed"] is (sandbox.probe() is None) and isinstance(report["seed"], int)


@pytest.mark.slow
def test_seed_replays_and_no_sandbox_says_so(tmp_path, capsys):
    nb = str(ROOT / "solutions" / NB)
    main([nb, "--json", "--seed", "7", "--no-sandbox"])
    first = json.loads(capsys.readouterr().out)
    main([nb, "--json", "--seed", "7", "--no-sandbox"])
    again = json.loads(capsys.readouterr().out)
    assert first["seed"] == again["seed"] == 7 and first["sandboxed"] is False
    assert [e["message"] for e in first["notebooks"][0]["exercises"]] == \
        [e["message"] for e in again["notebooks"][0]["exercises"]]
    assert first["points"] == 4
    assert "not sandboxed: graded with --no-sandbox" in first["notebooks"][0]["feedback"]


def test_missing_file_and_bad_options_are_status_2(tmp_path, capsys):
    assert main([str(tmp_path / "nope.ipynb")]) == 2
    assert "no such file" in capsys.readouterr().out
    assert main([str(tmp_path / "nope.ipynb"), "--fail-under", "120"]) == 2


def test_wire_plain_python_extras_and_copy_back_through_tuples():
    assert _roundtrip(range(3)) == [0, 1, 2]
    assert _roundtrip(1 + 2j) == 1 + 2j
    from lesson10.course.grade.judge import _copy_back
    a, b = np.zeros(2), [np.zeros(1), 5]
    _copy_back([(a,), b], [(np.ones(2),), [np.full(1, 7.0), 6]])
    assert (a == 1).all() and b[0][0] == 7 and b[1] == 6
    shards = [np.zeros(2), np.zeros(2)]                     # the answer put other arrays in
    _copy_back([shards], [[np.ones(4), np.zeros(2)]])
    assert shards[0].shape == (4,)


@pytest.mark.slow
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_five_solutions_get_full_marks_and_blank_notebooks_zero(jobs, capsys):
    sols = sorted(str(p) for p in (ROOT / "solutions").glob("0[1-5]_*.ipynb"))
    blanks = sorted(str(p) for p in (ROOT / "notebooks").glob("0[1-5]_*.ipynb"))
    extra = [] if sandbox.probe() is None else ["--no-sandbox"]
    main([*sols, *blanks, "--json", "-j", jobs, *extra])
    report = json.loads(capsys.readouterr().out)
    for rep in report["notebooks"]:
        full = rep["notebook"] in sols
        statuses = {e["status"] for e in rep["exercises"]}
        assert rep["ok"] and rep["points"] == (rep["max_points"] if full else 0), rep
        assert statuses == ({"passed"} if full else {"not attempted"}), (rep["notebook"], statuses)
    assert report["points"] == maximum()


def test_a_python_under_tmp_is_bound_into_the_private_tmp_not_covered_by_it(box):
    argv = sandbox.bwrap_argv(box, sandbox.Limits(), {})
    tmp_at = next(i for i, a in enumerate(argv) if a == "--tmpfs" and argv[i + 1] == "/tmp")
    binds = [i for i, a in enumerate(argv) if a == "--ro-bind"]
    assert binds and tmp_at < min(binds)      # a venv in /tmp/... (a CI clone) stays visible
