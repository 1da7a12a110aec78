"""The stand-in ``lesson10`` that a submission imports inside the sandbox.

It has the package's module tree and public names, and none of its code: every
function and class of the course is a stub that raises :class:`NotAvailable` when it is
called (``figures.*`` print a placeholder instead), literal constants keep their
values, and ``checks.check_<exercise>(fn)`` hands ``fn`` to the judge (the runner's
hook, :mod:`.runner`). So a notebook's imports and its display-only cells still run,
while nothing of the course is there to call, copy or read.

It is written from the package's *source text* (the ``ast`` of each module), so making
it imports nothing of the package, torch-using ``spmd`` included. The folder it fills
also holds the files of the grader that run in the sandbox: the runner
(``_lesson10_runner.py``), the wire (``_lesson10_wire.py``) and the return rule the check
cell applies too (``_lesson10_returns.py``, from ``checks/returns.py``); none is course code.

A two-line example: the real ``lesson10/sim/ring.py`` defines ``ring_attention`` and
``lesson10/sim/__init__.py`` re-exports it; the stand-in's ``sim/ring.py`` then says
``ring_attention = _s.reference("lesson10.sim.ring_attention")`` and its
``sim/__init__.py`` keeps the line ``from .ring import ring_attention``.
"""
from __future__ import annotations

import ast
import os
import shutil
from pathlib import Path

import lesson10

from .withheld import WITHHELD, is_real, real_module

#: modules of the package that are written specially (the rest become stubs)
_SKIP_DIRS = {"__pycache__", "grade"}


def _module_name(rel: Path) -> str:
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["lesson10"] + parts)


def _public_aliases(files: dict[Path, ast.Module]) -> dict[str, str]:
    """``lesson10.sim.ring.ring_attention -> lesson10.sim.ring_attention``: the name a
    package's ``__init__`` re-exports a function under (the one a student imports)."""
    alias = {}
    for rel, tree in files.items():
        if rel.name != "__init__.py":
            continue
        pkg = _module_name(rel)
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                for a in node.names:
                    alias[f"{pkg}.{node.module}.{a.name}"] = f"{pkg}.{a.asname or a.name}"
    return alias


def _is_exception(node: ast.ClassDef) -> str | None:
    """The bases of an exception class's stand-in (its builtin exception bases, after
    :class:`lesson10.errors.Lesson10Error` when it has that one), or None for another class."""
    import builtins
    names = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
    kept = [n for n in names if n == "Lesson10Error" or (
        isinstance(getattr(builtins, n, None), type) and issubclass(getattr(builtins, n), BaseException))]
    if kept and kept != ["Lesson10Error"]:
        return ", ".join(kept)
    if any(n.endswith(("Error", "Exception", "Failed")) for n in names):
        return "Exception"
    return None


def _stub_module(rel: Path, tree: ast.Module, alias: dict[str, str]) -> str:
    module = _module_name(rel)
    figures = module == "lesson10.figures"
    lines = [f'"""Stand-in for {module}: the course\'s names, none of its code."""',
             "from lesson10 import _standin as _s", ""]

    def walk(body):
        for node in body:
            if isinstance(node, ast.ImportFrom) and node.level >= 1:
                lines.append("try:\n    " + ast.unparse(node) + "\nexcept ImportError:\n    pass")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = alias.get(f"{module}.{node.name}", f"{module}.{node.name}")
                kind = "figure" if figures and not node.name.startswith("_") else "reference"
                lines.append(f"{node.name} = _s.{kind}({name!r})")
            elif isinstance(node, ast.ClassDef):
                base = _is_exception(node)
                if base:
                    lines.append(f"class {node.name}({base}):\n    pass")
                else:
                    name = alias.get(f"{module}.{node.name}", f"{module}.{node.name}")
                    lines.append(f"{node.name} = _s.reference_class({name!r})")
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
                try:
                    value = ast.literal_eval(node.value)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    continue
                for name in names:
                    lines.append(f"{name} = {value!r}")
            elif isinstance(node, (ast.If, ast.Try)):
                walk(node.body)

    walk(tree.body)
    lines += ["", "__getattr__ = _s.module_getattr(__name__)", ""]
    return "\n".join(lines)


def _checks_module() -> str:
    """The sandbox's ``lesson10/checks/__init__.py``: the exercises' table and one
    ``check_<exercise>`` each, all from :mod:`.standin_runtime` (its ``_standin`` there)."""
    from ...checks import EXERCISES
    info = {ex.id: {"id": ex.id, "notebook": ex.notebook, "points": ex.points,
                    "title": ex.title, "function": ex.function} for ex in EXERCISES.values()}
    lines = ['"""Stand-in of lesson10.checks inside the grader\'s sandbox: each check_<exercise>(fn) '
             'hands fn to the judge,', "which runs the course\'s check on hidden cases and prints its "
             'verdict here."""',
             "from .._standin import OUTCOMES, CheckFailed, NotAvailable, fallback, summary",
             "from .._standin import check_stub as _check",
             "from .._standin import module_getattr as _getattr", "",
             f"EXERCISES = {info!r}",
             "#: the runner sets this to its judge function: hook(exercise, fn) -> outcome dict",
             "hook = None",
             *(f"check_{ex} = _check({ex!r})" for ex in EXERCISES), "",
             "__getattr__ = _getattr(__name__)", ""]
    return "\n".join(lines)


#: the folder of :func:`write_all` whose stand-in has no course code at all
GENERAL = "general"


def folder_for(notebook: str | None) -> str:
    """The folder of :func:`write_all` for a course notebook (GENERAL for None)."""
    return notebook if notebook is not None and notebook in WITHHELD else GENERAL


def write_all(folder: Path, source: Path | None = None) -> Path:
    """The stand-ins of every course notebook, ``folder/<notebook id>``, and the general one
    (``folder/general``, no course code at all: for a notebook the grader cannot name)."""
    write(Path(folder) / GENERAL, source)
    for notebook in WITHHELD:
        write(Path(folder) / notebook, source, notebook=notebook)
    return Path(folder)


def write(folder: Path, source: Path | None = None, notebook: str | None = None) -> Path:
    """Fill ``folder`` with the stand-in package and the sandbox's two grader files;
    returns ``folder`` (the directory to put first on the sandbox's ``sys.path``). With
    ``notebook``, the modules of :data:`.withheld.REAL` are the real code less what that
    notebook withholds (:mod:`.withheld`)."""
    source = Path(source or Path(lesson10.__file__).parent)
    folder = Path(folder)
    files: dict[Path, ast.Module] = {}
    for path in sorted(source.rglob("*.py")):
        rel = path.relative_to(source)
        if _SKIP_DIRS & set(rel.parts[:-1]):
            continue
        files[rel] = ast.parse(path.read_text(encoding="utf-8"), str(rel))
    alias = _public_aliases(files)
    pkg = folder / "lesson10"
    for rel, tree in files.items():
        target = pkg / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if rel.as_posix() == "checks/__init__.py":
            text = _checks_module()
        elif notebook is not None and is_real(rel.as_posix()):
            text = real_module(_module_name(rel), tree, notebook, alias)
        else:
            text = _stub_module(rel, tree, alias)
        target.write_text(text, encoding="utf-8")
    (pkg / "course" / "grade").mkdir(parents=True, exist_ok=True)
    (pkg / "course" / "grade" / "__init__.py").write_text(
        '"""The grader is not in the sandbox."""\n', encoding="utf-8")
    here = Path(__file__).parent
    shutil.copyfile(here / "standin_runtime.py", pkg / "_standin.py")
    shutil.copyfile(here / "wire.py", folder / "_lesson10_wire.py")
    shutil.copyfile(here / "runner.py", folder / "_lesson10_runner.py")
    shutil.copyfile(here.parent.parent / "checks" / "returns.py", folder / "_lesson10_returns.py")
    for path in folder.rglob("*"):
        os.chmod(path, 0o555 if path.is_dir() else 0o444)
    os.chmod(folder, 0o555)
    return folder
