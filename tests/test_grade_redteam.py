"""Red team: one submission per trick and per fault, each with its exact score.

Every submission is built here from the solution or exercise notebooks. They are graded in
two batches (module-scoped: one grader run each, short time limits), by a
subprocess whose ``lesson10`` is a temporary copy of the package: a submission that edits
"the installed package" edits that copy, never this repository.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NB03 = "03_load_balance"
PY3 = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
       "language_info": {"name": "python"}}
_DEFS = ("def zigzag_positions", "def causal_work", "def ring_time")


def _load(folder: str, name: str) -> dict:
    return json.loads((ROOT / folder / f"{name}.ipynb").read_text(encoding="utf-8"))


def _src(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _code(source: str) -> dict:
    return {"cell_type": "code", "metadata": {}, "source": source, "outputs": [],
            "execution_count": None}


def nb03(*, blank=False, replace=None, before=(), after=(), checks=True, meta=NB03) -> dict:
    """Notebook 03 cut to its imports, the three exercises and their check cells;
    ``replace`` maps a function name to the source of its cell."""
    nb = _load("notebooks" if blank else "solutions", NB03)
    cells = []
    for cell in nb["cells"]:
        src = _src(cell)
        if cell["cell_type"] != "code":
            continue
        is_check = src.startswith("checks.check_")
        if "from lesson10 import" in src or any(d in src for d in _DEFS) or (checks and is_check):
            for name, new in (replace or {}).items():
                if f"def {name}(" in src:
                    src = new
            cells.append(_code(src))
    cells = [_code(s) for s in before] + cells[:1] + [_code(s) for s in after] + cells[1:]
    metadata = dict(PY3)
    if meta:
        metadata["lesson10"] = {"notebook": meta}
    return {"cells": cells, "metadata": metadata, "nbformat": 4, "nbformat_minor": 5}


def solved(name: str, replace=None, reduced=False) -> dict:
    """A solution notebook; ``reduced``: only its imports, function definitions and check
    cells (quicker to run)."""
    nb = _load("solutions", name)
    cells = []
    for i, cell in enumerate(nb["cells"]):
        src = _src(cell)
        if reduced and (cell["cell_type"] != "code" or i > 2 and "def " not in src
                        and not src.startswith("checks.check_")):
            continue
        for fn, new in (replace or {}).items():
            if cell["cell_type"] == "code" and f"def {fn}(" in src:
                cell["source"] = new
        cells.append(cell)
    nb["cells"] = cells
    return nb


# ------------------------------------------------------------------ the submissions
TRICKS = {
    # calling the course's reference, directly, through a lambda, a fallback, a copy
    "ref_direct": (nb03(replace={"ring_time": "def ring_time(work):\n    return layouts.ring_time(work)"}),
                   3, 4, "ring_time", "calls the course's reference implementation"),
    "ref_lambda": (nb03(replace={"ring_time": "_rt = lambda w: layouts.ring_time(w)\n"
                                              "def ring_time(work):\n    return _rt(work)"}),
                   3, 4, "ring_time", "calls the course's reference implementation"),
    "ref_fallback": (nb03(replace={"ring_time": "def _stub(work):\n    raise NotImplementedError\n"
                                                "ring_time = checks.fallback(_stub, layouts.ring_time)"}),
                     3, 4, "ring_time", "calls the course's reference implementation"),
    "ref_try_except": (nb03(replace={"zigzag_positions":
                                     "def zigzag_positions(s, n):\n    try:\n        raise NotImplementedError\n"
                                     "    except NotImplementedError:\n"
                                     "        return layouts.shard_positions(s, n, 'zigzag')"}),
                       3, 4, "zigzag_positions", "calls the course's reference implementation"),
    "ref_code_copy": (nb03(replace={"ring_time":
                                    "import types\n_c = layouts.ring_time.__code__.replace(co_filename='mine.py')\n"
                                    "ring_time = types.FunctionType(_c, vars(layouts))"}),
                      3, 4, "ring_time", "a copy of the course's ring_time"),
    # the source read from an installed copy, compiled as if it were the grader's own file
    "ref_source_exec": (nb03(replace={"ring_time":
                                      "import lesson10, pathlib\n_dir = pathlib.Path(lesson10.__file__).parent\n"
                                      f"_src = pathlib.Path({str(ROOT / 'lesson10' / 'layouts.py')!r}).read_text()\n"
                                      "_ns = {}\nexec(compile(_src, str(_dir / 'grade' / 'mine.py'), 'exec'), _ns)\n"
                                      "ring_time = _ns['ring_time']"}),
                        3, 4, "ring_time", "a copy of the course's ring_time"),
    "ref_profiler_off": (nb03(replace={"ring_time":
                                       "import sys\ndef ring_time(work):\n    sys.setprofile(None)\n"
                                       "    return layouts.ring_time(work)"}),
                         3, 4, "ring_time", "setprofile"),
    "ref_in_thread": (nb03(replace={"ring_time":
                                    "import threading\ndef ring_time(work):\n    box = []\n"
                                    "    t = threading.Thread(target=lambda: box.append(layouts.ring_time(work)))\n"
                                    "    t.start(); t.join()\n    return box[0]"}),
                      3, 4, "ring_time", "thread"),
    "ref_ulysses": (solved("04_ulysses", {"ulysses_attention":
                                          "def ulysses_attention(q_shards, k_shards, v_shards, positions, causal=True):\n"
                                          "    return ref_ulysses_attention(q_shards, k_shards, v_shards, positions, causal)"},
                          reduced=True),
                    3, 5, "ulysses_attention", "calls the course's reference implementation"),
    "patch_the_guard": (nb03(replace={"ring_time":
                                      "import lesson10.grade.guard as _g\n"
                                      "_g.Guard.stop = lambda self: None\n"
                                      "def ring_time(work):\n    return layouts.ring_time(work)"}),
                        0, 4, "ring_time", "changes the grader's own code"),
    "thread_from_a_cell": (nb03(replace={"ring_time":
                                         "import queue, threading\n_q, _a = queue.Queue(), queue.Queue()\n"
                                         "def _serve():\n    while True:\n        _a.put(layouts.ring_time(_q.get()))\n"
                                         "threading.Thread(target=_serve, daemon=True).start()\n"
                                         "def ring_time(work):\n    _q.put(work)\n    return _a.get()"}),
                           0, 4, "ring_time", "thread(s) started by the notebook"),
    "trace_function": (nb03(replace={"ring_time":
                                     "import sys\n_box = {}\n"
                                     "def _tracer(frame, event, arg):\n"
                                     "    if event == 'call' and frame.f_code.co_name == 'ring_time':\n"
                                     "        _box['v'] = layouts.ring_time(frame.f_locals['work'])\n"
                                     "    return None\n"
                                     "sys.settrace(_tracer)\n"
                                     "def ring_time(work):\n    return _box.get('v', -1)"}),
                       3, 4, "ring_time", "ring time"),
    "forged_reply": (nb03(replace={"ring_time":
                                   "import os, sys\nfrom lesson10.grade import wire\n"
                                   "def ring_time(work):\n    value = layouts.ring_time(work)\n"
                                   "    tree, blobs = wire.encode([value, [[work], {}]])\n"
                                   "    conn = wire.Conn(int(sys.argv[1]), int(sys.argv[2]))\n"
                                   "    conn.send({'op': 'result', 'value': tree, 'violation': None}, blobs)\n"
                                   "    os._exit(0)"}),
                     3, 4, "ring_time", "out of turn"),
    # the old grader trusted the kernel's own report
    "grade_file": (nb03(blank=True, after=[
        "import json, os\nfor ex, pts in (('zigzag_positions', 1), ('causal_work', 2), ('ring_time', 1)):\n"
        "    for path in (os.environ.get('LESSON10_GRADE_FILE'), 'outcomes.jsonl'):\n"
        "        if path:\n            with open(path, 'a') as f:\n"
        "                f.write(json.dumps({'exercise': ex, 'passed': True, 'points': pts, "
        "'max_points': pts, 'status': 'passed', 'message': ''}) + '\\n')"]),
        0, 4, "ring_time", "not attempted"),
    "replace_checks": (nb03(blank=True, after=[
        "import lesson10.checks.core as core\n_real = core._record\n"
        "core._record = lambda ex, passed, status, message='': _real(ex, True, 'passed', message)\n"
        "checks._record = core._record\n"
        "for name in dir(checks):\n    if name.startswith('check_'):\n"
        "        setattr(checks, name, lambda fn, **kw: print('passed'))"]),
        0, 4, "ring_time", "not attempted"),
    "getframe": (nb03(replace={"ring_time":
                               "import sys\ndef ring_time(work):\n    f = sys._getframe(1)\n    while f is not None:\n"
                               "        for key in ('ref_time', 'target'):\n            if key in f.f_locals:\n"
                               "                v = f.f_locals[key]\n                return v(work) if callable(v) else v\n"
                               "        f = f.f_back\n    raise LookupError('no answer in sight')"}),
                 3, 4, "ring_time", "sys._getframe"),
    "pinned_seed": (nb03(replace={"ring_time":
                                  "_real_rng = np.random.default_rng\n"
                                  "np.random.default_rng = lambda *a, **k: _real_rng(0)\n"
                                  "_rng = np.random.default_rng()\n"
                                  "_cases = [_rng.integers(0, 20, size=(int(n), int(n))) for n in _rng.integers(3, 7, size=4)]\n"
                                  "_table = {w.tobytes(): layouts.ring_time(w) for w in _cases}\n"
                                  "def ring_time(work):\n    return _table.get(np.asarray(work).tobytes(), -1)"}),
                    3, 4, "ring_time", "ring time differs"),
}
TRICKS["pinned_seed"][0]["cells"].append(_code("checks.check_ring_time(ring_time, seed=0)"))

_HANG = "def ring_time(work):\n    while True:\n        pass"
_KILL = "import os, signal\ndef causal_work(positions):\n    os.kill(os.getpid(), signal.SIGKILL)"
FAULTS = {
    "hang_function": (nb03(replace={"ring_time": _HANG}), 3, 4, "ring_time", "time limit"),
    "hang_cell": (nb03(after=["while True:\n    pass"]), 4, 4, None, None),
    "exit_cell": (nb03(after=["import os\nos._exit(3)"]), 4, 4, None, None),
    "sigkill_function": (nb03(replace={"causal_work": _KILL}), 2, 4, "causal_work", "died"),
    "forged_fatal": (nb03(after=["import os, sys\nfrom lesson10.grade import wire\n"
                                 "wire.Conn(int(sys.argv[1]), int(sys.argv[2])).send({'op': 'fatal', 'message': 'x'})\n"
                                 "os._exit(0)"]), 4, 4, None, None),
    "alloc_2gb": (nb03(after=["import numpy as np\nbig = np.ones(2**28)\nbig[::4096] = 2"]), 4, 4, None, None),
    "renamed_with_id": (nb03(), 4, 4, None, None),
    "renamed_no_id": (nb03(meta=None), 0, 24, "(unknown notebook)", "cannot tell which course notebook"),
    "no_checks_blank": (nb03(blank=True, checks=False), 0, 4, "ring_time", "not attempted"),
    "no_checks_solved": (nb03(checks=False), 0, 4, "ring_time", "check removed"),
    "other_content": (dict(solved("01_sequence_parallel", reduced=True),
                           metadata=dict(PY3, lesson10={"notebook": NB03})), 0, 4, "ring_time", "no function named"),
    "julia": (dict(nb03(), metadata={"kernelspec": {"name": "julia-1.10", "language": "julia",
                                                    "display_name": "Julia"}}), 0, 4, "ring_time", "not a Python"),
}
FILE_NAMES = {"renamed_with_id": "homework.ipynb", "renamed_no_id": "homework.ipynb",
              "no_checks_blank": "mine.ipynb", "ref_ulysses": "04_ulysses.ipynb"}

EVIL = ("\nfrom .core import EXERCISES as _E, Exercise as _X\nfor _k, _e in list(_E.items()):\n"
        "    _E[_k] = _X(_e.id, _e.notebook, _e.points, _e.title, lambda fn, rng: 'pwned')\n# PWNED\n")


def _edit_package_cell(install: Path) -> str:
    return (f"import lesson10, os, pathlib, shutil\nEVIL = {EVIL!r}\n"
            f"for root in (pathlib.Path(lesson10.__file__).parent, pathlib.Path({str(install)!r})):\n"
            "    f = root / 'checks' / 'nb03_load_balance.py'\n    try:\n"
            "        for d in (root, root / 'checks'):\n            os.chmod(d, 0o755)\n"
            "        os.chmod(f, 0o644)\n        f.write_text(f.read_text() + EVIL)\n"
            "        shutil.rmtree(root / 'checks' / '__pycache__', ignore_errors=True)\n"
            "    except OSError as exc:\n        print(exc)")


def _install(tmp: Path) -> Path:
    """A copy of the package for the grader subprocess (PYTHONPATH)."""
    dst = tmp / "install"
    shutil.copytree(ROOT / "lesson10", dst / "lesson10",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dst


def _grade(tmp: Path, install: Path, paths, *extra, jobs=2) -> tuple[int, dict, str]:
    env = dict(os.environ, PYTHONPATH=str(install), MPLBACKEND="Agg")
    env.pop("LESSON10_GRADE_FILE", None)
    proc = subprocess.run([sys.executable, "-m", "lesson10", "grade", *map(str, paths), "--json",
                           "-j", str(jobs), *extra], cwd=tmp, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def _write(folder: Path, name: str, nb) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(nb if isinstance(nb, str) else json.dumps(nb, indent=1), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """All tricks and judge-side faults, the five solutions, in one grader run."""
    tmp = tmp_path_factory.mktemp("redteam")
    install = _install(tmp)
    subs, paths = tmp / "subs", {}
    for name in ("01_sequence_parallel", "02_ring_attention", "04_ulysses", "05_moe_dispatch"):
        paths[name] = _write(subs / f"sol_{name[:2]}", f"{name}.ipynb", solved(name))
    paths["honest"] = _write(subs / "honest", f"{NB03}.ipynb", nb03())
    for name, (nb, *_rest) in {**TRICKS, **FAULTS}.items():
        paths[name] = _write(subs / name, FILE_NAMES.get(name, f"{NB03}.ipynb"), nb)
    paths["invalid_json"] = _write(subs / "invalid_json", f"{NB03}.ipynb", '{"cells": [oops')
    paths["edit_package"] = _write(subs / "edit_package", f"{NB03}.ipynb",
                                   nb03(blank=True, after=[_edit_package_cell(install / "lesson10")]))
    paths["victim"] = _write(subs / "victim", f"{NB03}.ipynb", nb03(blank=True))
    paths["overwrite_others"] = _write(subs / "overwrite_others", f"{NB03}.ipynb", nb03(after=[
        f"import pathlib\nfor p in pathlib.Path({str(subs)!r}).glob('*/*.ipynb'):\n"
        f"    if 'overwrite_others' not in str(p):\n        p.write_text('{{}}')"]))
    pid_file = tmp / "daemon.pid"
    paths["daemon"] = _write(subs / "daemon", f"{NB03}.ipynb", nb03(after=[
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        f"        open({str(pid_file)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
        "        time.sleep(600)\n    os._exit(0)"]))
    first = ["edit_package", "overwrite_others"]
    order = first + [k for k in paths if k not in first + ["victim"]] + ["victim"]
    status, report, _ = _grade(tmp, install, [paths[k] for k in order], "--no-execute",
                            "--timeout", "5", "--exercise-timeout", "6", "--memory", "1",
                            "--notebook-timeout", "90", "--csv", str(tmp / "class.csv"),
                               jobs=4)         # 4: the hang cases mostly wait
    by_name = {key: rep for key, rep in zip(order, report["notebooks"])}
    return {"status": status, "report": report, "by": by_name, "install": install, "tmp": tmp,
            "daemons": [int(p) for p in pid_file.read_text().split()]}


def _check(rep, points, max_points, exercise, text):
    assert (rep["points"], rep["max_points"]) == (points, max_points), json.dumps(rep, indent=1)[:3000]
    if exercise:
        entry = next(e for e in rep["exercises"] if e["exercise"] == exercise)
        assert not entry["passed"]
        assert text in entry["message"] or text in entry["status"], entry


def test_solutions_keep_full_marks(batch):
    for key, full in (("01_sequence_parallel", 5), ("02_ring_attention", 4), ("honest", 4),
                      ("04_ulysses", 5), ("05_moe_dispatch", 6)):
        rep = batch["by"][key]
        assert rep["ok"] and (rep["points"], rep["max_points"]) == (full, full), rep
        assert all(e["status"] == "passed" for e in rep["exercises"])


@pytest.mark.parametrize("name", sorted(TRICKS))
def test_trick_gains_nothing(batch, name):
    _nb, points, max_points, exercise, text = TRICKS[name]
    _check(batch["by"][name], points, max_points, exercise, text)


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_fault_costs_only_what_it_breaks(batch, name):
    _nb, points, max_points, exercise, text = FAULTS[name]
    _check(batch["by"][name], points, max_points, exercise, text)


def test_a_cell_that_kills_or_hangs_the_worker_is_skipped(batch):
    for key in ("hang_cell", "exit_cell"):
        notes = " ".join(batch["by"][key]["feedback"])
        assert "skipped" in notes, notes


def test_invalid_json_scores_zero_and_the_batch_goes_on(batch):
    rep = batch["by"]["invalid_json"]
    assert rep["ok"] and (rep["points"], rep["max_points"]) == (0, 4)
    assert {e["status"] for e in rep["exercises"]} == {"unreadable"}
    assert batch["by"]["victim"]["max_points"] == 4          # graded after it


def test_editing_the_package_on_disk_changes_no_grade(batch):
    # the attack reached the disk copy that the grader was started from ...
    assert "# PWNED" in (batch["install"] / "lesson10" / "checks" / "nb03_load_balance.py").read_text()
    # ... and neither its author nor a later student gained a point
    for key in ("edit_package", "victim"):
        rep = batch["by"][key]
        assert (rep["points"], rep["max_points"]) == (0, 4), rep
        assert {e["status"] for e in rep["exercises"]} == {"not attempted"}


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()          # a zombie is dead
    except OSError:
        return False


def test_a_daemon_that_left_its_process_group_is_killed(batch):
    rep = batch["by"]["daemon"]
    assert (rep["points"], rep["max_points"]) == (4, 4), rep
    assert batch["daemons"] and not any(_running(pid) for pid in batch["daemons"])
    assert any("left running were killed" in line for line in rep["feedback"])


def test_a_submission_cannot_change_the_others(batch):
    # it overwrote every other notebook on disk, after the grader had read them all
    assert (batch["tmp"] / "subs" / "honest" / f"{NB03}.ipynb").read_text() == "{}"
    for key in ("overwrite_others", "honest"):
        rep = batch["by"][key]
        assert (rep["points"], rep["max_points"]) == (4, 4), rep


def test_batch_exit_status_and_class_csv(batch):
    assert batch["status"] == 1                                # points lost, grader fine
    rows = (batch["tmp"] / "class.csv").read_text().splitlines()
    head = rows[0].split(",")
    assert head[0] == "student" and head[-2:] == ["total", "max"]
    assert head[1:-2][:4] == ["reduce_scatter", "all_gather", "sp_forward", "sp_bytes"]
    table = {r.split(",")[0]: r.split(",") for r in rows[1:]}
    assert set(table) >= {"honest", "ref_direct", "victim", "sol_01"}
    assert table["ref_direct"][-2:] == ["3", "24"]             # one max for every student
    assert table["honest"][head.index("ring_time")] == "1"
    assert table["ref_direct"][head.index("ring_time")] == "0"


# ------------------------------------------------------------------ faults while executing
@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """Faults that hit the notebook run (the feedback), with execution on."""
    tmp = tmp_path_factory.mktemp("executed")
    install = _install(tmp)
    subs = tmp / "subs"
    cases = {
        "output_100mb": nb03(after=["print('x' * 100_000_000)"]),
        "stderr": nb03(after=["import sys, os\nfor _ in range(1000):\n    sys.stderr.write('e' * 1000 + '\\n')\n"
                              "os.write(2, b'raw stderr\\n')"]),
        "kernel_exit": nb03(after=["import os\nos._exit(1)"]),
    }
    paths = {k: _write(subs / k, f"{NB03}.ipynb", nb) for k, nb in cases.items()}
    status, report, err = _grade(tmp, install, list(paths.values()), "--timeout", "30",
                                 "--exercise-timeout", "10", "--memory", "2")
    return status, dict(zip(paths, report["notebooks"])), err


def test_faults_while_executing_cost_no_points(executed):
    status, by, err = executed
    assert "raw stderr" not in err and "e" * 1000 not in err and len(err) < 10_000
    for key, rep in by.items():
        assert rep["ok"] and (rep["points"], rep["max_points"]) == (4, 4), (key, rep)
    assert status == 0
    assert any("kernel died" in line for line in by["kernel_exit"]["feedback"])
    assert len(json.dumps(by["output_100mb"])) < 100_000
