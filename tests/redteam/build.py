"""Submissions made from the course's notebooks: cut to their exercises, edited, renamed.

Every function returns a new notebook (a plain ``dict`` in nbformat 4) and leaves its
input alone, so cases can be built from one another.
"""
from __future__ import annotations

import ast
import builtins
import copy
import functools
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PY3 = {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
       "language_info": {"name": "python"}}
_CHECK = re.compile(r"^\s*checks\.check_(\w+)\(", re.M)


# ------------------------------------------------------------------ reading
@functools.cache
def _read(folder: str, nb_id: str) -> str:
    return (ROOT / folder / f"{nb_id}.ipynb").read_text(encoding="utf-8")


def load(nb_id: str, blank: bool = False) -> dict:
    """The course notebook (``blank``: the exercise notebook, else the solution)."""
    return json.loads(_read("notebooks" if blank else "solutions", nb_id))


def source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def code(src: str) -> dict:
    return {"cell_type": "code", "metadata": {}, "source": src, "outputs": [],
            "execution_count": None}


def exercises(nb_id: str) -> list:
    """The course's exercises of ``nb_id`` (the real package, on this side), in order."""
    from lesson10.checks import EXERCISES
    return [ex for ex in EXERCISES.values() if ex.notebook == nb_id]


def function_of(ex_id: str) -> str:
    from lesson10.checks import EXERCISES
    return EXERCISES[ex_id].function


def exercise_of_function(fn: str) -> str:
    from lesson10.checks import EXERCISES
    return next(ex.id for ex in EXERCISES.values() if ex.function == fn)


def checked(src: str) -> list[str]:
    """The exercises whose check a cell calls (at the start of a line)."""
    return _CHECK.findall(src)


def defines(src: str, name: str) -> bool:
    """The cell binds ``name`` at top level (def, class, assignment, import)."""
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return False
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name
                                                for t in node.targets):
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                (a.asname or a.name).split(".")[0] == name for a in node.names):
            return True
    return False


def _is_imports(src: str) -> bool:
    return "from lesson10 import" in src


def imports_cell(nb_id: str) -> str:
    return next(source(c) for c in load(nb_id)["cells"]
                if c["cell_type"] == "code" and _is_imports(source(c)))


def solution_def(nb_id: str, fn: str) -> str:
    """The solution's cell that defines the exercise function ``fn``."""
    return next(source(c) for c in load(nb_id)["cells"]
                if c["cell_type"] == "code" and defines(source(c), fn))


def header(nb_id: str, fn: str) -> str:
    """The ``def fn(...):`` line(s) of the solution, whatever the contract's signature is."""
    src = solution_def(nb_id, fn)
    node = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == fn)
    lines = src.splitlines()
    return "\n".join(lines[node.lineno - 1:node.body[0].lineno - 1])


def params(nb_id: str, fn: str) -> list[str]:
    node = ast.parse(header(nb_id, fn) + "\n    pass").body[0]
    a = node.args
    return [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]


def imported_names(nb_id: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(imports_cell(nb_id))):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _free_names(expr: ast.AST) -> set[str]:
    bound = set()
    for node in ast.walk(expr):
        if isinstance(node, ast.Lambda):
            a = node.args
            bound |= {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
            bound |= {x.arg for x in (a.vararg, a.kwarg) if x}
    return {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)} - bound - set(dir(builtins))


def fallback_references(nb_id: str) -> dict[str, str]:
    """``{function: reference expression}`` from the solution's ``checks.fallback(fn, ref)``
    calls: the course reference a notebook cell itself uses while an exercise is a stub.
    Only references made of names the imports cell binds (they work in any cell)."""
    known, out = imported_names(nb_id), {}
    for cell in load(nb_id)["cells"]:
        src = source(cell)
        if cell["cell_type"] != "code" or "fallback(" not in src:
            continue
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr == "fallback" and len(node.args) == 2 and \
                    isinstance(node.args[0], ast.Name) and _free_names(node.args[1]) <= known:
                out.setdefault(node.args[0].id, ast.get_source_segment(src, node.args[1]))
    return out


def solution_function(nb_id: str, fn: str):
    """The solution's ``fn``, compiled here with the real package (to make answer tables)."""
    ns: dict = {}
    exec(compile(imports_cell(nb_id), "<imports>", "exec"), ns)
    for ex in exercises(nb_id):
        exec(compile(solution_def(nb_id, ex.function), f"<{ex.function}>", "exec"), ns)
        if ex.function == fn:
            return ns[fn]
    raise KeyError(fn)


# ------------------------------------------------------------------ making notebooks
def notebook(cells: list[dict], nb_id: str | None) -> dict:
    meta = copy.deepcopy(PY3)
    if nb_id:
        meta["lesson10"] = {"notebook": nb_id}
    return {"cells": cells, "metadata": meta, "nbformat": 4, "nbformat_minor": 5}


def reduced(nb_id: str, blank: bool = False) -> dict:
    """The notebook cut to its imports cell, the exercise functions' cells and the check
    cells (the grader runs it in a second or two), with the course's notebook id."""
    fns = [ex.function for ex in exercises(nb_id)]
    first = imports_cell(nb_id) if not blank else next(
        source(c) for c in load(nb_id, True)["cells"] if _is_imports(source(c)))
    cells = []
    for cell in load(nb_id, blank)["cells"]:
        src = source(cell)
        if cell["cell_type"] == "code" and (src == first or checked(src)
                                            or any(defines(src, f) for f in fns)):
            cells.append(code(src))
    return notebook(cells, nb_id)


def full(nb_id: str, blank: bool = False) -> dict:
    """The whole course notebook (markdown, exploration, figures), with its id."""
    nb = load(nb_id, blank)
    nb["metadata"].setdefault("lesson10", {"notebook": nb_id})
    return nb


def _index(nb: dict, *, after_imports=False, before_check=None, after_check=None,
           before_def=None, after_def=None, at_end=False) -> int:
    cells = nb["cells"]
    srcs = [source(c) if c["cell_type"] == "code" else "" for c in cells]
    if at_end:
        return len(cells)
    if after_imports:
        return next(i for i, s in enumerate(srcs) if _is_imports(s)) + 1     # the first one
    if before_check or after_check:
        ex = before_check or after_check
        i = next(i for i, s in enumerate(srcs) if ex in checked(s))
        return i if before_check else i + 1
    fn = before_def or after_def
    i = next(i for i, s in enumerate(srcs) if defines(s, fn))
    return i if before_def else i + 1


def insert(nb: dict, *srcs: str, **where) -> dict:
    """Cells inserted at one place: ``after_imports``, ``before_check=ex``,
    ``after_check=ex``, ``before_def=fn``, ``after_def=fn`` or ``at_end``."""
    nb = copy.deepcopy(nb)
    i = _index(nb, **where)
    nb["cells"][i:i] = [code(s) for s in srcs]
    return nb


def replace_def(nb: dict, fn: str, new_src: str) -> dict:
    """The cell that defines ``fn`` gets ``new_src`` instead."""
    nb = copy.deepcopy(nb)
    cells = [c for c in nb["cells"] if c["cell_type"] == "code" and defines(source(c), fn)]
    assert cells, f"no cell defines {fn}"
    for c in cells:
        c["source"] = new_src
    return nb


def replace_check(nb: dict, ex: str, new_src: str) -> dict:
    nb = copy.deepcopy(nb)
    for c in nb["cells"]:
        if c["cell_type"] == "code" and ex in checked(source(c)):
            c["source"] = new_src
    return nb


def drop_checks(nb: dict, exs=None) -> dict:
    """Without the check cells (of ``exs``, default all)."""
    nb = copy.deepcopy(nb)
    nb["cells"] = [c for c in nb["cells"] if not (
        c["cell_type"] == "code" and checked(source(c))
        and (exs is None or set(checked(source(c))) & set(exs)))]
    return nb


def repeat_checks(nb: dict, times: int) -> dict:
    """Every check cell run ``times`` times (consecutive copies)."""
    nb = copy.deepcopy(nb)
    cells = []
    for c in nb["cells"]:
        cells += [copy.deepcopy(c) for _ in range(times)] if checked(source(c)) else [c]
    nb["cells"] = cells
    return nb


def with_metadata(nb: dict, **meta) -> dict:
    """``lesson10=None`` drops the notebook id; other keys replace metadata entries."""
    nb = copy.deepcopy(nb)
    for key, value in meta.items():
        if value is None:
            nb["metadata"].pop(key, None)
        else:
            nb["metadata"][key] = value
    return nb


def write(folder: Path, name: str, nb) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(nb if isinstance(nb, str) else json.dumps(nb, indent=1), encoding="utf-8")
    return path
