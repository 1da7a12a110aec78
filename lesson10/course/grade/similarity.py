"""Similarity flags: answers that are the package's own code, or another student's.

The course package holds the reference code of every exercise (the simulation, the
checks' references), and a student can install it and print it
(``inspect.getsource``). The grader's sandbox keeps the package away from the graded run,
but not from the student's own machine, so an answer pasted from it is correct code. These
flags find such answers for a person to look at; they never change a point.

Each answer is the student's function of an exercise (its last ``def`` in the notebook),
normalised: parsed into an AST, every variable, argument and function name replaced by
one placeholder, every string's text too (a reworded message), docstrings dropped
(comments and layout are gone with the parse). Two
kinds of flag:

* **package source**: the answer's whole body is the body of a function of the package,
  or a run of statements of it (at least :data:`MIN_NODES` AST nodes together) stands in
  a function of the package, names aside;
* **same answer**: two students' answers to one exercise are one normalised body (of at
  least :data:`MIN_PAIR_NODES` nodes), listed as pairs.

What they do not catch: code rewritten beyond names (reordered, other calls), answers
shorter than the thresholds (a short correct answer is often everyone's), and copies
between students of different exercises.
"""
from __future__ import annotations

import ast
import functools
import itertools
import json
from pathlib import Path

import lesson10

from ...checks import EXERCISES
from . import course

#: nodes a run of statements must have to be flagged as the package's
MIN_NODES = 40
#: nodes two students' identical answers must have to be flagged as a pair
MIN_PAIR_NODES = 30
#: the longest notebook file read (bytes), the most pairs listed per exercise
MAX_BYTES, MAX_PAIRS = 5_000_000, 50


class _Strip(ast.NodeTransformer):
    """Names and texts to ``_`` (a message reworded is the same code), docstrings and
    annotations dropped."""

    def visit_Name(self, node):
        return ast.Name(id="_", ctx=node.ctx)

    def visit_arg(self, node):
        return ast.arg(arg="_", annotation=None)

    def _body(self, node):
        body = node.body
        first = body[0].value if body and isinstance(body[0], ast.Expr) else None
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            node.body = body[1:] or [ast.Pass()]
        return node

    def visit_FunctionDef(self, node):
        node = self._body(node)
        node.name, node.returns, node.decorator_list = "_", None, []
        self.generic_visit(node)
        return node

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        node = self._body(node)
        node.name = "_"
        self.generic_visit(node)
        return node

    def visit_Constant(self, node):
        return ast.Constant(value="_") if isinstance(node.value, str) else node

    def visit_Expr(self, node):
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return None
        self.generic_visit(node)
        return node


def _size(node) -> int:
    return sum(1 for _ in ast.walk(node))


def _key(stmts) -> str:
    return "\n".join(ast.dump(s, annotate_fields=False) for s in stmts)


def _blocks(stmts):
    """Every statement list of ``stmts`` (itself and the bodies nested in it)."""
    yield stmts
    for s in stmts:
        for name in ("body", "orelse", "finalbody"):
            inner = getattr(s, name, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                yield from _blocks(inner)
        for h in getattr(s, "handlers", []) or []:
            yield from _blocks(h.body)


def _runs(body):
    """``(key, nodes)`` of each shortest run of consecutive statements, in any statement
    list of ``body``, with at least :data:`MIN_NODES` nodes."""
    for stmts in _blocks(body):
        sizes = [_size(s) for s in stmts]
        for i in range(len(stmts)):
            total = 0
            for j in range(i, len(stmts)):
                total += sizes[j]
                if total >= MIN_NODES:
                    yield _key(stmts[i:j + 1]), total
                    break


def normalised(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list:
    """The body of ``fn`` with names and docstrings stripped."""
    stripped = _Strip().visit(ast.parse(ast.unparse(fn)).body[0])
    return stripped.body


@functools.lru_cache(maxsize=1)
def package_index() -> tuple[dict, dict]:
    """``(bodies, runs)`` of the package's functions: normalised body -> where, and run of
    statements -> where (``lesson10.sim.attention.merge``)."""
    root = Path(lesson10.__file__).resolve().parent
    bodies: dict[str, str] = {}
    runs: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        mod = "lesson10." + ".".join(path.relative_to(root).with_suffix("").parts)
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError, RecursionError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                where = f"{mod}.{node.name}"
                body = normalised(node)
                bodies.setdefault(_key(body), where)
                for k, _ in _runs(body):
                    runs.setdefault(k, where)
    return bodies, runs


def _cells(path: str) -> list[str]:
    p = Path(path)
    if not p.is_file() or p.stat().st_size > MAX_BYTES:
        return []
    nb = json.loads(p.read_bytes().decode("utf-8"))
    return [src for _, src in course.code_cells(nb)] if isinstance(nb, dict) else []


def _parse(src: str):
    try:
        return ast.parse(src)
    except SyntaxError:                # magics and shell lines: left out
        keep = "\n".join(line for line in src.splitlines()
                         if not line.lstrip().startswith(("%", "!")))
        return ast.parse(keep)


def answers(path: str) -> dict[str, ast.FunctionDef]:
    """exercise -> the student's function (its last ``def``) in the notebook at ``path``."""
    names = {course.function_name(ex.id): ex.id for ex in EXERCISES.values()}
    out: dict = {}
    for src in _cells(path):
        try:
            tree = _parse(src)
        except (SyntaxError, ValueError, RecursionError):
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in names:
                out[names[node.name]] = node
    return out


def _stub(body) -> bool:
    return any(isinstance(n, ast.Raise) and "NotImplementedError" in ast.dump(n)
               for s in body for n in ast.walk(s))


def _source_flag(student: str, ex: str, path: str, body, bodies, runs) -> dict | None:
    whole = bodies.get(_key(body))
    if whole is not None and _size(ast.Module(body=body, type_ignores=[])) >= MIN_NODES:
        return {"student": student, "exercise": ex, "notebook": path, "matches": whole,
                "what": "the whole function body, names aside"}
    for k, nodes in _runs(body):
        if k in runs:
            return {"student": student, "exercise": ex, "notebook": path, "matches": runs[k],
                    "what": f"a run of statements ({nodes} AST nodes), names aside"}
    return None


def flags(rows: list[dict]) -> dict:
    """``{"source": [...], "pairs": [...], "unread": [...]}`` of a class's rows (see the
    module's docstring); a file that cannot be read is listed in ``unread``, never raised."""
    bodies, runs = package_index()
    source, unread = [], []
    same: dict[tuple, list] = {}
    for row in rows:
        for path in row.get("notebooks", {}).values():
            try:
                found = answers(path)
            except Exception as exc:  # noqa: BLE001 - a flag never costs a class its report
                unread.append({"student": row["student"], "notebook": path,
                               "why": f"{type(exc).__name__}"})
                continue
            for ex, fn in found.items():
                try:
                    body = normalised(fn)
                except (RecursionError, ValueError):
                    continue
                if _stub(body):
                    continue
                flag = _source_flag(row["student"], ex, path, body, bodies, runs)
                if flag:
                    source.append(flag)
                nodes = _size(ast.Module(body=body, type_ignores=[]))
                if nodes >= MIN_PAIR_NODES:
                    same.setdefault((ex, _key(body)), []).append(row["student"])
    pairs = []
    for (ex, _), who in sorted(same.items()):
        for a, b in itertools.islice(itertools.combinations(sorted(set(who)), 2), MAX_PAIRS):
            pairs.append({"exercise": ex, "students": [a, b]})
    return {"source": source, "pairs": pairs, "unread": unread}
