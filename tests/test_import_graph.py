"""The import graph of ``lesson10/``: no cycles, and imports run downwards only.

The graph is read from the source (no module is imported): every ``import`` and
``from ... import`` statement, at module level and inside functions alike, with relative
imports resolved. ``from pkg import name`` is an edge to ``pkg.name`` when that is a module
of the package, else to ``pkg`` itself. The layer rule is the one ARCHITECTURE.md states:
shared rules <- ``sim``, ``spmd``, ``figures``, ``checks`` <- ``runs``, ``bench``, ``course``;
``sim`` never imports torch; ``layouts``, ``cost`` and ``topology`` import neither ``sim``
nor ``spmd``; ``rules`` (the size and MoE rules those three, ``sim``, ``spmd``, ``runs`` and
``bench`` share) imports nothing of the package but ``errors``.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "lesson10"

SHARED = {"lesson10", "lesson10.layouts", "lesson10.cost", "lesson10.topology", "lesson10.errors",
          "lesson10.rules", "lesson10.scheme"}
MIDDLE = ("sim", "spmd", "figures", "checks")
TOP = ("runs", "bench", "course")
TOP_MODULES = {"lesson10.__main__", "lesson10.run"}    # the commands

# Cycles too large to untangle in one step, each a sorted tuple of its modules; the test
# fails if one of them disappears (remove it here) or a new one appears.
KNOWN_CYCLES: set[tuple[str, ...]] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _base(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a ``from`` statement names (relative levels resolved)."""
    if node.level == 0:
        return node.module or ""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    parts = package.split(".")
    if node.level > 1:
        parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module ``name`` imports (lesson10's own and third-party, by full dotted name)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _base(name, path, node)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in known else base)
    out.discard(name)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {name: imports_of(name, path, known) for name, path in mods.items()}


def internal(g: dict[str, set[str]]) -> dict[str, set[str]]:
    return {m: {d for d in deps if d in g} for m, deps in g.items()}


def cycles(g: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[tuple[str, ...]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(tuple(sorted(comp)))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return sorted(found)


def layer(module: str) -> int:
    """0: the shared rules; 1: sim, spmd, figures, checks; 2: runs, bench, course, commands."""
    if module in SHARED:
        return 0
    if module in TOP_MODULES:
        return 2
    top = module.split(".")[1]
    if top in MIDDLE:
        return 1
    if top in TOP:
        return 2
    raise AssertionError(f"{module} is in no layer: add it to ARCHITECTURE.md's rule and to this test")


def upward(g: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {d}" for m, deps in internal(g).items() for d in deps if layer(d) > layer(m))


def torch_in_sim(g: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {d}" for m, deps in g.items() if m.startswith("lesson10.sim")
                  for d in deps if d == "torch" or d.startswith("torch."))


def shared_into_methods(g: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {d}" for m, deps in internal(g).items() if m in SHARED
                  for d in deps if d.split(".")[1:2] in (["sim"], ["spmd"]))


# --- the package itself -------------------------------------------------------------------

@pytest.fixture(scope="module")
def g() -> dict[str, set[str]]:
    return graph()


def test_the_graph_sees_every_module_and_function_level_imports(g):
    assert len(g) == len(list(PACKAGE.rglob("*.py"))) > 50
    assert "lesson10.layouts" in g["lesson10"]          # `from . import cost, layouts, topology`
    assert "lesson10.runs.cli" in g["lesson10.run"]     # `from .runs.cli import main`
    assert "lesson10.bench.sim" in g["lesson10.bench"]  # inside main(): `from .sim import main`


def test_no_import_cycles(g):
    assert set(cycles(internal(g))) == KNOWN_CYCLES


def test_imports_run_downwards_only(g):
    assert upward(g) == []


def test_sim_never_imports_torch(g):
    assert torch_in_sim(g) == []


def test_the_shared_rules_import_neither_sim_nor_spmd(g):
    assert shared_into_methods(g) == []


def test_the_size_rules_import_nothing_of_the_package_but_errors(g):
    assert internal(g)["lesson10.rules"] <= {"lesson10.errors"}


# --- the rules reject what they should (a graph written out, not the package) -------------

def test_cycles_finds_a_two_and_a_three_module_cycle_and_nothing_else():
    fake = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}, "g": set()}
    assert cycles(fake) == [("a", "b"), ("c", "d", "e")]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_an_upward_import_is_named():
    fake = {"lesson10.sim.ring": {"lesson10.course.grade.cli", "lesson10.cost"},
            "lesson10.course.grade.cli": {"lesson10.sim.ring"}, "lesson10.cost": set()}
    assert upward(fake) == ["lesson10.sim.ring -> lesson10.course.grade.cli"]


def test_torch_in_sim_and_sim_in_the_shared_rules_are_named():
    fake = {"lesson10.sim.ring": {"torch.distributed", "numpy"}, "lesson10.cost": {"lesson10.spmd.ring"},
            "lesson10.spmd.ring": {"torch"}}
    assert torch_in_sim(fake) == ["lesson10.sim.ring -> torch.distributed"]
    assert shared_into_methods(fake) == ["lesson10.cost -> lesson10.spmd.ring"]


def test_relative_and_function_level_imports_are_resolved(tmp_path):
    pkg = tmp_path / "lesson10" / "checks"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .core import x\n")
    src = "def f():\n    from . import depends\n    from ..sim import ring\n    import numpy\n"
    (pkg / "core.py").write_text(src)
    known = {"lesson10.checks", "lesson10.checks.core", "lesson10.checks.depends", "lesson10.sim"}
    got = imports_of("lesson10.checks.core", pkg / "core.py", known)
    assert got == {"lesson10.checks.depends", "lesson10.sim", "numpy"}
    assert imports_of("lesson10.checks", pkg / "__init__.py", known) == {"lesson10.checks.core"}


# ---------------------------------------------------------------- no private names across modules
def private_imports(tree: ast.AST) -> list[str]:
    """``module.name`` for each ``_private`` name that a ``from lesson10... import`` (or a
    relative one) takes from another module (dunders are not private)."""
    return [f"{'.' * n.level}{n.module or ''}.{a.name}" for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and (n.level > 0 or (n.module or "").split(".")[0] == "lesson10")
            for a in n.names if a.name.startswith("_") and not a.name.startswith("__")]


def test_no_module_imports_a_private_name_of_another():
    found = {name: got for name, path in modules().items()
             if (got := private_imports(ast.parse(path.read_text(encoding="utf-8"))))}
    assert not found, f"make these public (a short docstring) in the module of their concept: {found}"


def test_the_private_import_rule_sees_one():
    assert private_imports(ast.parse("def f():\n    from ..layouts import _mask, visible\n")) == ["..layouts._mask"]
    assert private_imports(ast.parse("from lesson10.cost import __all__, comm_bytes\n")) == []
    assert private_imports(ast.parse("from numpy import _globals\n")) == []
