"""ARCHITECTURE.md is the map of lesson10/: every module is on it once, and nothing else."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def listed() -> list[str]:
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    return re.findall(r"^\| `(lesson10/[^`]+\.py)` \|", text, re.M)


def modules() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in (ROOT / "lesson10").rglob("*.py")
            if "__pycache__" not in p.parts}


def test_every_module_is_on_the_map_once():
    names = listed()
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
    missing = sorted(modules() - set(names))
    assert not missing, f"add a line for each to ARCHITECTURE.md: {missing}"


def test_nothing_on_the_map_is_gone():
    gone = sorted(set(listed()) - modules())
    assert not gone, f"ARCHITECTURE.md lists modules that do not exist: {gone}"


def test_the_map_catches_a_module_it_does_not_list(tmp_path):
    # the parser reads table rows only: a row removed is a module missing
    names = set(listed())
    assert "lesson10/spmd/ring.py" in names and len(names) >= 60


# ---------------------------------------------------------------- the size rules of CONTRIBUTING
import ast  # noqa: E402

MAX_FUNCTION_LINES = 60         # modules have no line cap: ruff's C901 keeps functions simple


def _trees():
    for path in sorted((ROOT / "lesson10").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        yield path.relative_to(ROOT).as_posix(), text, ast.parse(text)


def long_functions(tree) -> list[tuple[str, int]]:
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]


def test_no_function_over_60_lines():
    long = {rel: found for rel, _, tree in _trees() if (found := long_functions(tree))}
    assert not long, f"split these functions (at most {MAX_FUNCTION_LINES} lines): {long}"


def test_the_function_rule_sees_a_long_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(ast.parse(f"def f():\n{body}\n")) == [("f", MAX_FUNCTION_LINES + 1)]
    assert long_functions(ast.parse("def g():\n    return 1\n")) == []


def _imported(nodes) -> list[str]:
    names = [a.name for n in nodes if isinstance(n, ast.Import) for a in n.names]
    return names + [n.module or "" for n in nodes if isinstance(n, ast.ImportFrom)]


def test_sim_and_the_shared_rules_never_import_torch():
    """sim/: no torch anywhere; layouts, cost, topology, rules: not at import time (topology reads
    torch.distributed's world lazily, when a job is up)."""
    for rel, _, tree in _trees():
        if rel.startswith("lesson10/sim/"):
            names = _imported(ast.walk(tree))
        elif rel in ("lesson10/layouts.py", "lesson10/cost.py", "lesson10/topology.py",
                     "lesson10/rules.py"):
            names = _imported(tree.body)
        else:
            continue
        assert not [m for m in names if m.split(".")[0] == "torch" or "spmd" in m], rel


def test_the_tooling_benchmarks_are_not_in_the_package(tmp_path):
    """`bench grade|class|figures` time the course's own tools: they live in the repository's
    benchmarks/tooling/, which the wheel leaves out; without a checkout the command says so."""
    import pytest

    from lesson10 import bench
    package = Path(bench.__file__).resolve().parent
    assert not [m for m in bench.TOOLING.values() if (package / f"{m}.py").exists()]
    assert bench.tooling("class").__name__ == "benchmarks.tooling.classroom"
    with pytest.raises(SystemExit, match="lives in the course repository"):
        bench.tooling("grade", root=tmp_path)


def test_every_error_of_the_package_has_one_base_and_its_own_name():
    """Each error class a module of lesson10 defines is a Lesson10Error (and keeps its builtin
    kind); no two share a name, so a traceback names one class."""
    import importlib
    import inspect

    from lesson10.errors import Lesson10Error
    seen: dict[str, str] = {}
    # the judge's control flow and the student's own errors are not the package's errors
    internal = {"Lost", "RemoteError", "Failure", "Timeout", "Closed", "Unprotected",
                "Unbindable", "StudentError", "Errors"}
    # copied into the sandbox as top-level modules, or run as a script with the standard
    # library only (build --check): no package to import the base from
    verbatim = {"lesson10/course/grade/wire", "lesson10/course/grade/runner", "lesson10/checks/returns",
                "lesson10/course/build"}
    # the sandbox's runtime: its CheckFailed and NotAvailable stand for the package's own there
    mirror = ROOT / "lesson10" / "course" / "grade" / "standin_runtime.py"
    for path in sorted((ROOT / "lesson10").rglob("*.py")):
        if path == mirror:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = [n.name for n in tree.body if isinstance(n, ast.ClassDef)
                 and any(getattr(b, "id", getattr(b, "attr", "")).endswith(("Error", "Exception", "Refused",
                                                                                 "Failed", "Timeout"))
                         for b in n.bases)]
        if not names:
            continue
        rel = path.relative_to(ROOT).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        if "torch" not in path.read_text(encoding="utf-8") or importlib.util.find_spec("torch"):
            module = importlib.import_module(".".join(parts))
        else:                                                         # pragma: no cover
            continue
        for name in names:
            assert name not in seen, f"{name} is defined in {seen[name]} and in {rel}"
            seen[name] = str(rel)
            cls = getattr(module, name)
            if name not in internal and str(rel) not in verbatim:
                assert issubclass(cls, Lesson10Error), f"{rel}.{name} is no Lesson10Error"
                assert inspect.getmro(cls)[1:] != (Lesson10Error, Exception, BaseException, object) \
                    or name == "Lesson10Error", f"{rel}.{name} lost its builtin kind"
    assert {"Refused", "FileRefused", "PlanError", "RingPlanError", "CheckFailed"} <= set(seen)


# ---------------------------------------------------------------- the grader's map
def test_the_grader_s_two_sentence_map_names_real_code():
    """Every `module.name` the map of the grader names is a real function, class or method
    of lesson10.course.grade (so the map is rewritten when the code moves)."""
    import importlib
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    para = text[text.index("The grader in two sentences"):text.index("| module | what it holds |",
                                                                   text.index("The grader in two"))]
    assert para.count(". ") + para.strip().endswith(".") <= 4         # two sentences and a note
    names = re.findall(r"`(\w+(?:\.\w+)+)`", para)
    assert len(names) >= 6, names
    for name in names:
        module, *attrs = name.split(".")
        obj = importlib.import_module(f"lesson10.course.grade.{module}")
        for attr in attrs:
            obj = getattr(obj, attr)
        assert callable(obj), name
    for module in re.findall(r"the `(\w+)`", para):             # the runner: sandbox-only imports
        assert (ROOT / "lesson10" / "course" / "grade" / f"{module}.py").is_file(), module
