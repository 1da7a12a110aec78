"""Red team of the grader's edges (issue 23): the student's files that shadow the runner's
own modules, bytes on the runner's socket, at-fork hooks, a forged ``getrusage``, packages the
grader reaches through ``PYTHONPATH``. Every case is graded in one batch under ``-j 1`` and
under ``-j 2``: honest work keeps full marks, faults cost only the cell that made them, no
case is a grader error."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field

import pytest
from redteam import build as B
from redteam import clock

from lesson10.course.grade import sandbox

pytestmark = pytest.mark.redteam   # graded in whole batches: make test-redteam

NB01, NB03 = "01_sequence_parallel", "03_load_balance"
FIRST = "causal_work"          # the first check cell of notebook 03
needs_bwrap = pytest.mark.skipif(sandbox.probe() is not None, reason=f"no sandbox: {sandbox.probe()}")

_FRAME = '''import json, os, struct, sys
_MAIN = int(sys.argv[1])             # the runner's socket to the judge
def _raw(header, length=None):
    os.write(_MAIN, struct.pack(">Q", len(header) if length is None else length) + header)
'''
GARBAGE = {
    "deep_nesting": '_raw(b"[" * 100000 + b"]" * 100000)',
    "deep_nesting_in_msg": '_raw(b\'{"msg": \' + b"[" * 100000 + b"]" * 100000 + b\', "blobs": []}\')',
    "list_for_object": '_raw(json.dumps({"msg": [{"op": "done"}], "blobs": []}).encode())',
    "msg_list_top": '_raw(json.dumps([{"op": "finished"}]).encode())',
    "wrong_types": ('_raw(json.dumps({"msg": {"op": "done", "index": [1], "outputs": 5, '
                    '"error": 7}, "blobs": []}).encode())'),
    "huge_length": '_raw(b"{}", length=2**62)',
    "inf_blob_size": '_raw(b\'{"msg": {"op": "cell"}, "blobs": [1e400]}\')',
    "random_bytes": 'os.write(_MAIN, os.urandom(5000))',
    "check_with_odd_types": ('_raw(json.dumps({"msg": {"op": "check", "exercise": [1], "cell": {}, '
                             '"callable": "yes", "name": None}, "blobs": []}).encode())'),
}
ATFORK = {
    "before": "os.register_at_fork(before=lambda: time.sleep(3600))",
    "after_in_child": "os.register_at_fork(after_in_child=lambda: time.sleep(3600))",
    "after_in_parent": "os.register_at_fork(after_in_parent=lambda: time.sleep(3600))",
    "all_three_stubborn": ("def _stubborn():\n    while True:\n        try:\n"
                           "            time.sleep(3600)\n        except BaseException:\n"
                           "            pass\n"
                           "os.register_at_fork(before=_stubborn, after_in_child=_stubborn, "
                           "after_in_parent=_stubborn)"),
    "through_posix": "import posix\nposix.register_at_fork(after_in_child=lambda: os._exit(0))",
}
SHADOWS = {
    "IPython.py": "raise RuntimeError('a student IPython')\n",
    "lesson10.py": "raise RuntimeError('a student lesson10')\n",
    "traitlets.py": "raise RuntimeError('a student traitlets')\n",
    "_lesson10_wire.py": "raise RuntimeError('a student wire')\n",
    "json.py": "raise RuntimeError('a student json')\n",
}


@dataclass
class Case:
    name: str
    make: object
    files: dict = field(default_factory=dict)
    cpu_positive: bool = False
    nb: str = NB03


def _nb(nb_id=NB03, defs=None, **insert):
    def make():
        nb = B.reduced(nb_id)
        for fn, body in (defs or {}).items():
            nb = B.replace_def(nb, fn, B.header(nb_id, fn) + "\n" + body)
        for where, src in insert.items():
            nb = B.insert(nb, src, **({where: True} if where == "after_imports"
                                      else {where.split("__")[0]: where.split("__")[1]}))
        return nb
    return make


CASES = [Case(f"garbage_{k}", _nb(**{f"after_check__{FIRST}": _FRAME + v})) for k, v in GARBAGE.items()]
CASES += [Case(f"atfork_{k}", _nb(after_imports="import os, time\n" + v)) for k, v in ATFORK.items()]
CASES += [Case(f"shadow_{name[:-3]}", _nb(), files={name: text}) for name, text in SHADOWS.items()]
CASES += [Case("shadows_all_at_once", _nb(), files=dict(SHADOWS)),
          Case("forged_getrusage", _nb(after_imports=(
              "import resource\n_r = resource.getrusage(resource.RUSAGE_SELF)\n"
              "resource.getrusage = lambda who: _r._replace(ru_utime=1e9, ru_stime=1e9)\n"
              "x = sum(i * i for i in range(2_000_000))")), cpu_positive=True),
          Case("module_from_pythonpath", _nb(after_imports=(
              "import l10_edges_extra\nassert l10_edges_extra.TWO == 2\n"
              "import matplotlib.pyplot as plt")))]
# the served op called from threads of the student's own: each call gets its own reply
_THREADED = ("    from concurrent.futures import ThreadPoolExecutor\n"
             "    shards = reduce_scatter(partials)\n"
             "    with ThreadPoolExecutor(len(shards)) as pool:\n"
             "        local = list(pool.map(op, shards))\n"
             "    return all_gather(local)\n")
_EARLIER_POOL = ("    shards = reduce_scatter(partials)\n"
                 "    local = list(_POOL.map(op, shards))\n"
                 "    return all_gather(local)\n")
CASES += [Case("op_from_a_thread_pool", _nb(NB01, {"sp_forward": _THREADED}), nb=NB01),
          Case("op_from_an_earlier_cells_pool", _nb(NB01, {"sp_forward": _EARLIER_POOL},
               after_imports="from concurrent.futures import ThreadPoolExecutor\n"
                             "_POOL = ThreadPoolExecutor(8)\nlist(_POOL.map(abs, range(8)))"),
               nb=NB01)]


@pytest.fixture(scope="module", params=[1, 2], ids=["j1", "j2"])
def graded(request, tmp_path_factory):
    if sandbox.probe() is not None:
        pytest.skip(f"no sandbox: {sandbox.probe()}")
    tmp = tmp_path_factory.mktemp(f"edges-j{request.param}")
    extra = tmp / "extra"                       # a folder only PYTHONPATH reaches
    extra.mkdir()
    (extra / "l10_edges_extra.py").write_text("TWO = 2\n")
    paths = {}
    for c in CASES:
        paths[c.name] = B.write(tmp / "subs" / c.name, f"{c.nb}.ipynb", c.make())
        for fname, text in c.files.items():
            (tmp / "subs" / c.name / fname).write_text(text)
    env = dict(os.environ, MPLBACKEND="Agg",
               # the checkout on PYTHONPATH too (where lesson10 is not installed): never bound
               PYTHONPATH=os.pathsep.join([str(extra), str(B.ROOT)] + [p for p in os.environ.get(
                   "PYTHONPATH", "").split(os.pathsep) if p]))
    cmd = [sys.executable, "-m", "lesson10", "grade", *map(str, paths.values()), "--json",
           "-j", str(request.param), *clock.limits(cell=10, exercise=5, notebook=90),
           "--memory", "1", "--timings"]       # limits that follow the machine (redteam.clock)
    proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True,
                          timeout=clock.scaled(900))
    assert proc.stdout, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    return {"rc": proc.returncode, "by": dict(zip(paths, report["notebooks"])),
            "stderr": proc.stderr}


def _why(rep) -> str:
    return json.dumps({k: rep.get(k) for k in ("points", "max_points", "ok", "error", "feedback")},
                      indent=1)[:3000] + "\n" + "\n".join(
        f"  {e['exercise']}: {e['status']} {e['message'][:200]!r}" for e in rep["exercises"])


@needs_bwrap
@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_edge_case_keeps_full_marks_and_is_no_grader_error(graded, name):
    rep = graded["by"][name]
    why = _why(rep)
    case = next(c for c in CASES if c.name == name)
    assert rep["ok"] and rep["error"] is None, why
    assert rep["max_points"] == sum(ex.points for ex in B.exercises(case.nb)), why
    assert rep["points"] == rep["max_points"], why
    if case.cpu_positive:                 # the kernel's count, not the forged one
        assert 0.05 < rep["sandbox_cpu_seconds"] < 600, why


@needs_bwrap
def test_the_batch_exits_1_at_most(graded):
    assert graded["rc"] in (0, 1), graded["stderr"][-3000:]
