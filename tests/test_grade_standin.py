"""Exploration cells work in grading, exercises' references stay out: each notebook's
sandbox holds the real layouts, cost, topology and sim less what its exercises ask for
(lesson10/course/grade/withheld.py). Every solution notebook grades with no error in any
cell; a function that calls the withheld reference is refused while judged; the stand-ins
built from the student's functions agree with the course where they stand in."""
import inspect
import json
from pathlib import Path

import numpy as np
import pytest

from lesson10 import cost, layouts
from lesson10.course.grade import main, standin, withheld
from lesson10.rules import MoEConfig

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = sorted((ROOT / "solutions").glob("0[1-5]*.ipynb"))


@pytest.fixture(scope="module")
def boxes(tmp_path_factory):
    folder = tmp_path_factory.mktemp("standin")
    standin.write_all(folder)
    return folder


def _box_text(boxes: Path, notebook: str) -> str:
    return "\n".join(p.read_text() for p in (boxes / notebook).rglob("*.py"))


#: exercise -> the course functions its check takes the answer from
REFERENCES = {
    "01_sequence_parallel": ["lesson10.sim.comm.SimGroup.reduce_scatter",
                             "lesson10.sim.comm.SimGroup.all_gather", "lesson10.sim.sp.sp_forward",
                             "lesson10.cost.comm_bytes"],
    "02_ring_attention": ["lesson10.sim.attention.attention", "lesson10.sim.attention.merge",
                          "lesson10.sim.ring.ring_attention"],
    "03_load_balance": ["lesson10.layouts.shard_positions", "lesson10.layouts._token_work",
                        "lesson10.layouts.ring_time"],
    "04_ulysses": ["lesson10.sim.ulysses.seq_to_heads", "lesson10.sim.ulysses.heads_to_seq",
                   "lesson10.sim.ulysses.ulysses_attention", "lesson10.cost.comm_bytes"],
    "05_moe_dispatch": ["lesson10.sim.moe.route_topk", "lesson10.sim.capacity.keep_within_capacity",
                        "lesson10.cost.expert_capacity", "lesson10.rules.MoEConfig.capacity",
                        "lesson10.sim.moe.simulate_moe",
                        "lesson10.sim.moe.switch_aux_loss"],
}


def _resolve(name: str):
    import importlib
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)


def _body(fn) -> str:
    """The code of a function without its docstring, as ast.unparse writes it (the way the
    stand-in writes the real modules)."""
    import ast
    import textwrap
    node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    body = node.body[1:] if isinstance(node.body[0], ast.Expr) else node.body
    return "\n".join(ast.unparse(stmt) for stmt in body)


@pytest.mark.parametrize("notebook", sorted(REFERENCES))
def test_the_references_of_a_notebook_stay_out_of_its_sandbox(boxes, notebook):
    text = "\n".join(line.strip() for line in _box_text(boxes, notebook).splitlines())
    for name in REFERENCES[notebook]:
        assert name in withheld.WITHHELD[notebook], name
        code = "\n".join(line.strip() for line in _body(_resolve(name)).splitlines())
        assert code not in text, f"{name}: its code is in the sandbox of {notebook}"
        other = next(nb for nb in REFERENCES if nb != notebook and name not in withheld.WITHHELD[nb])
        other_text = "\n".join(line.strip() for line in _box_text(boxes, other).splitlines())
        assert code in other_text, f"{name}: the test does not find real code where it is shipped"


def test_what_no_exercise_of_the_notebook_asks_for_is_real(boxes):
    ulysses_box = (boxes / "04_ulysses" / "lesson10" / "layouts.py").read_text()
    assert "def shard_positions(" in ulysses_box              # 04's cell 24 needs it
    assert "def shard_positions(" not in (boxes / "03_load_balance" / "lesson10" /
                                          "layouts.py").read_text()
    general = (boxes / standin.GENERAL / "lesson10" / "layouts.py").read_text()
    assert "def " not in general                             # an unknown notebook: no code


def _adapters() -> dict:
    """The adapters, with the course's functions standing in for a student's."""
    student = {"ulysses_bytes": lambda s, h, n, g=1, e=2: cost.comm_bytes("ulysses", s, h, n, g, e),
               "zigzag_positions": lambda s, n: layouts.shard_positions(s, n, "zigzag"),
               "capacity_keep": None}
    from lesson10.sim.capacity import keep_within_capacity

    def capacity_keep(experts, E, cf):
        N, k = np.shape(experts)
        return keep_within_capacity(experts, E, cost.expert_capacity(N, E, k, cf))
    student["capacity_keep"] = capacity_keep

    def refuse(name):
        raise RuntimeError(name)
    from lesson10.course.grade import standin_runtime
    ns: dict = {"__name__": "standin_runtime_copy"}
    exec(compile(Path(standin_runtime.__file__).read_text(encoding="utf-8"), "standin_runtime.py",
                 "exec"), ns)
    ns.update({"_refuse": refuse, "_student": lambda name, what: student[name],
               "_has": lambda name: name in student})
    return ns


def test_the_adapters_agree_with_the_course():
    ns = _adapters()
    for method in ("ring", "allgather", "ulysses"):
        assert ns["_adapt_comm_bytes"](method, 4096, 512, 8, 2) == \
            pytest.approx(cost.comm_bytes(method, 4096, 512, 8, 2))
    for u, r in ((8, 2), (4, 4), (16, 1)):
        assert ns["_adapt_usp_bytes"](8192, 1024, u, r, 4) == \
            pytest.approx(cost.usp_bytes(8192, 1024, u, r, 4))
    for layout in ("contiguous", "zigzag", "striped"):
        got = ns["_adapt_shard_positions"](24, 3, layout)
        assert all(np.array_equal(a, b) for a, b in zip(got, layouts.shard_positions(24, 3, layout)))
    rng = np.random.default_rng(0)
    experts = rng.integers(0, 4, size=(30, 2))
    from lesson10.sim.capacity import keep_within_capacity
    for C in (1, 5, 9, 15, 60):
        assert np.array_equal(ns["_adapt_keep_within_capacity"](experts, 4, C),
                              keep_within_capacity(experts, 4, C))
    for cf in (0.5, 1.0, 1.25):
        assert ns["_adapt_expert_capacity"](30, 4, 2, cf) == min(cost.expert_capacity(30, 4, 2, cf), 60)
        assert ns["_adapt_moe_capacity"](MoEConfig(4, 2, cf), 30) == ns["_adapt_expert_capacity"](30, 4, 2, cf)


def test_a_function_that_calls_the_reference_is_refused_while_judged(tmp_path):
    nb = json.loads((ROOT / "solutions" / "04_ulysses.ipynb").read_text())
    for c in nb["cells"]:
        src = "".join(c["source"])
        if c["cell_type"] == "code" and src.startswith("def seq_to_heads("):
            c["source"] = ("def seq_to_heads(shards, group=None):\n"
                           "    return lesson10.sim.ulysses.seq_to_heads(shards, group)\n"
                           "import lesson10.sim.ulysses\n")
    (tmp_path / "04_ulysses.ipynb").write_text(json.dumps(nb))
    main([str(tmp_path / "04_ulysses.ipynb"), "--student", "x", "--seed", "1", "--no-results",
          "--output", str(tmp_path / "r.json"), "--timeout", "60"])
    rep = json.loads((tmp_path / "r.json").read_text())["notebooks"][0]
    got = {e["exercise"]: e for e in rep["exercises"]}
    assert got["seq_to_heads"]["status"] == "failed"
    assert "NotAvailable" in got["seq_to_heads"]["message"]
    assert got["heads_to_seq"]["status"] == "passed"


@pytest.mark.slow
def test_every_solution_notebook_grades_with_no_error_in_any_cell(tmp_path):
    status = main([*map(str, SOLUTIONS), "--student", "solutions", "--seed", "3", "-j", "2",
                   "--no-results", "--output", str(tmp_path / "r.json"),
                   "--save-executed", str(tmp_path / "executed"), "--timeout", "120"])
    doc = json.loads((tmp_path / "r.json").read_text())
    assert status == 0 and doc["students"][0]["points"] == doc["students"][0]["max_points"]
    for rep in doc["notebooks"]:
        assert rep["feedback"] == [], rep["feedback"]
    for path in SOLUTIONS:
        executed = json.loads((tmp_path / "executed" / "solutions" / path.name).read_text())
        errors = [(i, o["ename"], o["evalue"][:120]) for i, c in enumerate(executed["cells"])
                  for o in c.get("outputs", []) if o.get("output_type") == "error"]
        assert errors == [], f"{path.name}: {errors}"
        skipped = [i for i, c in enumerate(executed["cells"]) for o in c.get("outputs", [])
                   if "did not run" in str(o.get("text", ""))]
        assert skipped == [], f"{path.name}: cells {skipped} did not run"


def test_the_stand_ins_errors_keep_their_kind(tmp_path):
    """In the sandbox a course error is still its builtin kind and a Lesson10Error, so a
    student's ``except RuntimeError`` or ``except lesson10.Lesson10Error`` reads the same."""
    import subprocess
    import sys
    folder = standin.write(tmp_path / "box")
    code = ("import importlib, lesson10; l = importlib.import_module('lesson10.spmd.launch'); "
            "v = importlib.import_module('lesson10.runs.validate'); "
            "assert issubclass(l.RankError, (RuntimeError)) and issubclass(l.RankError, lesson10.Lesson10Error); "
            "assert issubclass(v.Refused, ValueError) and issubclass(v.Refused, lesson10.Lesson10Error); "
            f"assert lesson10.__file__.startswith({str(folder)!r}); print('ok')")
    out = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(folder)!r}); {code}"],
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr
