"""Mutation test of the checks: every solution in solutions/*.ipynb (the code between
``### BEGIN SOLUTION`` and ``### END SOLUTION``) is mutated one small change at a time
(``<`` <-> ``<=``, ``max`` <-> ``min``, ``+ 1`` dropped, an axis swapped, a sign dropped,
a keyword such as ``minlength`` or ``kind="stable"`` dropped, ...) and every mutant is run
through its check. At least 95 % of the mutants must be rejected ("killed").

A mutant that computes the same thing as the solution cannot be killed; those are listed in
EQUIVALENT with the reason, and the test also fails if a listed one stops surviving (so the
list stays true)."""
from __future__ import annotations

import ast
import copy
import json
import signal
import threading
from pathlib import Path

import numpy as np
import pytest

from lesson10 import checks
from lesson10.checks import CheckFailed
from lesson10.checks.core import StudentError
from lesson10.checks.returns import ReturnRefused

pytestmark = pytest.mark.slow   # a whole command end to end: make test-slow

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ["01_sequence_parallel", "02_ring_attention", "03_load_balance", "04_ulysses",
             "05_moe_dispatch"]
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
KILL_RATE = 0.95

# mutant id -> why it computes the same thing as the solution
EQUIVALENT = {
    "causal_work: drop dtype=: np.zeros((n, n), dtype=int) (line 2)":
        "W as floats holding the same counts; the spec asks for the counts, not a dtype",
    "causal_work: .zeros->.ones: np.zeros (line 2)":
        "every entry of W is assigned in the loop, so its initial value never shows",
    "capacity: drop dtype=: np.zeros(E, dtype=int) (line 5)":
        "arrival counters as floats compare with C the same way",
    "capacity: .zeros->.ones: np.zeros (line 6)":
        "every entry of keep is assigned in the loop, so its initial value never shows",
    "route_topk: drop kind=: np.argsort(-logits, axis=1, kind='stable') (line 1)":
        "the lesson defines no order among exactly equal logits: any order of ties passes",
}


# --------------------------------------------------------------------------- solutions
def _cells(name):
    nb = json.loads((ROOT / "solutions" / f"{name}.ipynb").read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            yield "".join(cell["source"])


def _solutions():
    """(notebook, setup code, [(function name, cell source)]) per notebook: the setup is
    the notebook's import cell."""
    out = []
    for name in NOTEBOOKS:
        cells = list(_cells(name))
        setup = next(c for c in cells if "from lesson10 import" in c)
        sols = []
        for c in cells:
            if BEGIN in c:
                tree = ast.parse(c)
                fn = next(n.name for n in tree.body if isinstance(n, ast.FunctionDef))
                sols.append((fn, c))
        out.append((name, setup, sols))
    return out


def _exercise_of(function):
    found = [ex.id for ex in checks.EXERCISES.values() if ex.function == function]
    assert len(found) == 1, function
    return found[0]


# --------------------------------------------------------------------------- mutations
_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
        ast.NotEq: ast.Eq}
_BIN = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
        ast.FloorDiv: ast.Mult}
_NAMES = {"max": "min", "min": "max", "maximum": "minimum", "minimum": "maximum",
          "argmax": "argmin", "argmin": "argmax", "isfinite": "isinf", "any": "all", "all": "any",
          "ones": "zeros", "zeros": "ones", "sum": "mean", "mean": "sum"}
_KEEP_CALLS = {"range", "len", "int", "float", "list", "tuple", "enumerate", "zip", "sorted", "set",
               "reversed", "print"}
_DROP_KW = {"kind", "minlength", "keepdims", "side", "dtype"}


def _operator_mutations(node):
    out = []
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP:
        new = _CMP[type(node.ops[0])]
        out.append((f"{type(node.ops[0]).__name__}->{new.__name__}",
                    lambda n, new=new: ast.Compare(n.left, [new()], n.comparators)))
    if isinstance(node, ast.BinOp):
        if isinstance(node.right, ast.Constant) and node.right.value == 1 and \
                isinstance(node.op, (ast.Add, ast.Sub)):
            out.append(("drop +-1", lambda n: n.left))
        if type(node.op) in _BIN:
            new = _BIN[type(node.op)]
            out.append((f"{type(node.op).__name__}->{new.__name__}",
                        lambda n, new=new: ast.BinOp(n.left, new(), n.right)))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        out.append(("drop -", lambda n: n.operand))
    return out


def _name_mutations(node):
    out = []
    if isinstance(node, ast.Name) and node.id in _NAMES:
        out.append((f"{node.id}->{_NAMES[node.id]}", lambda n: ast.Name(_NAMES[n.id], n.ctx)))
    if isinstance(node, ast.Attribute) and node.attr in _NAMES:
        out.append((f".{node.attr}->.{_NAMES[node.attr]}",
                    lambda n: ast.Attribute(n.value, _NAMES[n.attr], n.ctx)))
    if isinstance(node, ast.keyword) and node.arg == "axis" and isinstance(node.value, (ast.Constant, ast.UnaryOp)):
        val = ast.literal_eval(node.value)
        for new in {0: (1,), 1: (0,), -1: (0,), 2: (1,)}.get(val, ()):
            out.append((f"axis {val}->{new}",
                        lambda n, new=new: ast.keyword("axis", ast.Constant(new))))
    return out


def _call_mutations(node):
    out = []
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 1 \
            and not node.keywords and node.func.id not in _KEEP_CALLS:
        out.append((f"drop the call {node.func.id}(...)", lambda n: n.args[0]))
    if isinstance(node, ast.Call):
        for i, kw in enumerate(node.keywords):
            if kw.arg in _DROP_KW:
                out.append((f"drop {kw.arg}=",
                            lambda n, i=i: ast.Call(n.func, n.args, n.keywords[:i] + n.keywords[i + 1:])))
    if isinstance(node, ast.Slice):
        if node.lower is not None:
            out.append(("drop the slice start", lambda n: ast.Slice(None, n.upper, n.step)))
        if node.upper is not None:
            out.append(("drop the slice end", lambda n: ast.Slice(n.lower, None, n.step)))
    return out


def _constant_mutations(node):
    out = []
    if isinstance(node, ast.Constant) and type(node.value) is int and node.value in (0, 1, 2):
        new = {0: 1, 1: 0, 2: 1}[node.value]
        out.append((f"{node.value}->{new}", lambda n, new=new: ast.Constant(new)))
    if isinstance(node, ast.Constant) and type(node.value) is bool:
        out.append((f"{node.value}->{not node.value}", lambda n: ast.Constant(not n.value)))
    return out


def _mutations(node):
    """(label, replacement builder) for one node; the builder gets a deep copy of the node."""
    return [m for rule in (_operator_mutations, _name_mutations, _call_mutations, _constant_mutations)
            for m in rule(node)]


class _Replace(ast.NodeTransformer):
    def __init__(self, target, build):
        self.target, self.build = target, build

    def generic_visit(self, node):
        node = super().generic_visit(node)
        if getattr(node, "_mut_id", None) == self.target:
            return self.build(node)
        return node


def _mutants(source):
    """(label, mutated source) for every mutation of a node inside the solution markers."""
    lines = source.splitlines()
    lo = next(i for i, l in enumerate(lines) if BEGIN in l) + 1
    hi = next(i for i, l in enumerate(lines) if END in l) + 1
    tree = ast.parse(source)
    nodes = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", None)
        if isinstance(node, ast.keyword):
            line = node.value.lineno
        if line is not None and lo < line < hi:
            node._mut_id = len(nodes)
            nodes.append(node)
    out = []
    for node in nodes:
        for label, build in _mutations(node):
            mutated = _Replace(node._mut_id, build).visit(copy.deepcopy(tree))
            ast.fix_missing_locations(mutated)
            where = ast.unparse(node).splitlines()[0][:60]
            out.append((f"{label}: {where} (line {node.lineno - lo})", ast.unparse(mutated)))
    return out


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout


def _killed(exercise, fn) -> bool:
    """Does the check reject this function (under the seed of the check cell)?"""
    body = checks.EXERCISES[exercise].body
    guard = threading.current_thread() is threading.main_thread()   # signals: main thread only
    if guard:
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(20)
    try:
        with np.errstate(all="ignore"):
            body(fn, np.random.default_rng(checks.core.seed_of(exercise)))
        return False
    except (CheckFailed, StudentError, ReturnRefused, _Timeout):   # refused: killed
        return True
    finally:
        if guard:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)


def _run_all():
    results = []                 # (exercise, label, killed)
    for name, setup, sols in _solutions():
        ns = {"__name__": f"solution_{name}"}
        exec(compile(setup, f"{name}:setup", "exec"), ns)
        for _, src in sols:
            exec(compile(src, f"{name}:solution", "exec"), ns)
        for fn_name, src in sols:
            exercise = _exercise_of(fn_name)
            assert not _killed(exercise, ns[fn_name]), f"the solution of {exercise} fails its check"
            for label, mutated in _mutants(src):
                mns = dict(ns)
                try:
                    exec(compile(mutated, f"{name}:mutant", "exec"), mns)
                except Exception:  # noqa: BLE001 - a mutant that does not even compile/define: killed
                    results.append((exercise, label, True))
                    continue
                results.append((exercise, label, _killed(exercise, mns[fn_name])))
    return results


@pytest.fixture(scope="module")
def results():
    return _run_all()


def test_every_exercise_is_mutated(results):
    assert {ex for ex, _, _ in results} == set(checks.EXERCISES)
    assert len(results) >= 150


def test_mutants_are_killed(results, capsys):
    survivors = [f"{ex}: {label}" for ex, label, killed in results if not killed]
    unexplained = [s for s in survivors if s not in EQUIVALENT]
    counted = [r for r in results if f"{r[0]}: {r[1]}" not in EQUIVALENT]
    killed = sum(k for _, _, k in counted)
    rate = killed / len(counted)
    with capsys.disabled():
        print(f"\nmutants: {len(results)}, equivalent (listed): {len(results) - len(counted)}, "
              f"killed {killed} of {len(counted)} = {rate:.1%}")
        for s in unexplained:
            print("  survived:", s)
    assert rate >= KILL_RATE, unexplained


def test_listed_equivalent_mutants_exist_and_survive(results):
    survivors = {f"{ex}: {label}" for ex, label, killed in results if not killed}
    assert set(EQUIVALENT) <= survivors
