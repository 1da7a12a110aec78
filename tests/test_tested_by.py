"""ARCHITECTURE.md's 'tested by' column is true: every test file a row names exists and
reaches that row's module.

A test file reaches a module when it imports the module or a name from it (at any depth of
the file, in a function too), imports a name a package re-exports from it (the object's
``__module__`` says where it lives), or names the module's dotted or file path in its text
(a test that runs ``python -m ...`` or copies the file). The test files are parsed, never
imported.
"""
import ast
import importlib
import re
import types
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
ROW = re.compile(r"^\| `(lesson10/[^`]+\.py)` \|(.*)$", re.M)
TEST_NAME = re.compile(r"`([\w/]*test_\w+\.py)`")


def rows(text: str | None = None) -> list[tuple[str, list[str]]]:
    """(module, the test files of its third column) for every module row of the map."""
    if text is None:
        text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    found = []
    for module, rest in ROW.findall(text):
        cells = rest.rstrip().rstrip("|").split("|")
        found.append((module, TEST_NAME.findall(cells[-1]) if len(cells) >= 2 else []))
    return found


def dotted(module: str) -> str:
    """lesson10/sim/ring.py -> lesson10.sim.ring; a package's __init__.py -> the package."""
    parts = module.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _parsed(path: Path) -> tuple[str, tuple[tuple[str, tuple[str, ...]], ...]]:
    """A test file's text and its imports as (module, names) pairs; ``import a.b`` is
    (a.b, ()), ``from a import b, c`` is (a, (b, c))."""
    text = path.read_text(encoding="utf-8")
    imports: list[tuple[str, tuple[str, ...]]] = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            imports += [(alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imports.append((node.module, tuple(alias.name for alias in node.names)))
    return text, tuple(imports)


@cache
def _home(package: str, name: str) -> str | None:
    """The module where ``package.name`` is defined (a submodule: its own name)."""
    try:
        obj = getattr(importlib.import_module(package), name)
    except (ImportError, AttributeError):
        return None
    return getattr(obj, "__name__", None) if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None)


def _names_in_text(text: str, module: str) -> bool:
    name = dotted(module)
    follow = r"(?![\w.])" if module.endswith("/__init__.py") else r"(?!\w)"
    if module in text or re.search(r"(?<!\w)" + re.escape(name) + follow, text):
        return True
    # a package's __main__.py is what `-m package` runs
    return module.endswith("/__main__.py") and re.search(r"-m\W+" + re.escape(name.removesuffix(".__main__"))
                                                          + r"\b", text) is not None


def reaches(test: Path, module: str) -> bool:
    """Does the test file at ``test`` reach ``module`` (a path like lesson10/sim/ring.py)?"""
    text, imports = _parsed(test)
    name = dotted(module)
    if _names_in_text(text, module):
        return True
    for source, names in imports:
        if source == name or any(f"{source}.{n}" == name for n in names):
            return True
    # last, and only if nothing plainer did: names re-exported by a package of lesson10
    return any(_home(source, n) == name for source, names in imports
               if source.split(".")[0] == "lesson10" for n in names if n != "*")


def problems(table: list[tuple[str, list[str]]], tests: Path = TESTS) -> list[str]:
    """One line for each row whose 'tested by' column is empty, names a file that is not in
    ``tests``, or names a file that does not reach its module."""
    found = []
    for module, named in table:
        if not named:
            found.append(f"{module}: no test file in its 'tested by' column")
        for test in named:
            path = tests / test
            if not path.is_file():
                found.append(f"{module}: tests/{test} does not exist")
            elif not reaches(path, module):
                found.append(f"{module}: tests/{test} neither imports it nor names it")
    return found


def test_every_row_names_tests_that_reach_its_module():
    table = rows()
    assert len(table) >= 60
    bad = problems(table)
    assert not bad, "fix the 'tested by' column of ARCHITECTURE.md:\n" + "\n".join(bad)


def test_the_column_names_at_most_three_files_each():
    assert not [(m, t) for m, t in rows() if len(t) > 3 or len(set(t)) != len(t)]


def test_a_row_whose_test_does_not_reach_its_module_is_reported():
    # test_layouts.py is about layouts, not the ring attention of sim/
    assert reaches(TESTS / "test_layouts.py", "lesson10/layouts.py")
    bad = problems([("lesson10/sim/ring.py", ["test_layouts.py"])])
    assert bad == ["lesson10/sim/ring.py: tests/test_layouts.py neither imports it nor names it"]


def test_an_empty_column_and_a_missing_file_are_reported():
    text = ("| `lesson10/cost.py` | the closed forms |\n"
            "| `lesson10/layouts.py` | who holds what | `test_no_such_file.py` |\n")
    assert rows(text) == [("lesson10/cost.py", []), ("lesson10/layouts.py", ["test_no_such_file.py"])]
    assert problems(rows(text)) == ["lesson10/cost.py: no test file in its 'tested by' column",
                                    "lesson10/layouts.py: tests/test_no_such_file.py does not exist"]


def test_each_way_of_reaching_a_module_counts(tmp_path):
    cases = {
        "import lesson10.sim.ring as r\n": True,
        "def f():\n    from lesson10.sim.ring import ring_attention\n": True,
        "from lesson10.sim import ring\n": True,
        "from lesson10.sim import ring_attention\n": True,         # re-exported by sim/
        "CMD = ['python', '-m', 'lesson10.sim.ring']\n": True,
        "SRC = 'lesson10/sim/ring.py'\n": True,
        "from lesson10.sim import ulysses_attention\n": False,
        "X = 'lesson10.sim.ring_other'\n": False,
    }
    for i, (source, expected) in enumerate(cases.items()):
        path = tmp_path / f"test_case{i}.py"
        path.write_text(source, encoding="utf-8")
        assert reaches(path, "lesson10/sim/ring.py") is expected, source
