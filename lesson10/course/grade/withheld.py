"""What each course notebook's sandbox withholds of the course's code.

A notebook is graded with the real ``layouts``, ``cost``, ``topology``, ``rules`` and ``sim``
(so its display-only cells run: layouts, closed forms, size rules, the simulation's helpers),
less the names listed here for that notebook: the references of its exercises (what
``lesson10.checks.EXERCISES`` asks for) and whatever computes one of them in a line or two.
Their source is not in the sandbox. Each stands in as a stub that, in a display-only cell,
calls the student's own function of that exercise (the name on the right: the notebook's
``ring_attention`` for ``sim.ring_attention``, or an adapter of :mod:`.standin_runtime` (``_adapt_*``) that builds
the call from the student's functions), and while an exercise is judged refuses
(``NotAvailable``). A name on the right of ``None``: no student function stands in (the
cell gets NotAvailable). ``figures`` stay placeholders (refused while judged); ``spmd``,
``runs``, ``bench`` and ``course`` stay stubs.

Why each name: the check of the exercise imports it as its reference, or it gives the
answer with no more than a call (``cost.comm_bytes("ulysses", ...)`` is ``ulysses_bytes``;
``SimGroup.reduce_scatter`` is ``reduce_scatter``; ``layouts.shard_positions(s, n,
"zigzag")`` is ``zigzag_positions``; ``sim.ring_attention(..., return_stats=True).work`` and
``_kept_per_source`` and ``simulate_moe``'s accounting give ``moe_stats``; the two-level
bytes of ``sim.nodes.node_bytes`` are not the flat all-to-all's, so it is shipped). That
nothing else shipped gives an answer is a tested property, not this list:
``tests/test_sandbox_answers.py`` calls everything a sandbox ships on the exercises' cases.
"""
from __future__ import annotations

import ast

from ...checks.refused import REAL, WITHHELD, is_real

# WITHHELD (notebook -> {qualified name as defined: the student's function, "adapter:NAME"
# or None}, gathered from the exercise records' ``withholds``) and REAL (the modules shipped
# as real code, the rest being stubs) are one table with the check cell, which refuses the
# same calls: :mod:`lesson10.checks.refused`
__all__ = ["REAL", "WITHHELD", "is_real", "real_module"]


_IMPORT = "from lesson10 import _standin as _lesson10_standin"


def _stub(name: str, public: str, spec, kind: str):
    call = {"function": "withheld", "method": "withheld_method", "static": "withheld"}[kind]
    text = f"{name} = _lesson10_standin.{call}({public!r}, {spec!r})"
    if kind == "static":
        text = f"{name} = staticmethod(_lesson10_standin.withheld({public!r}, {spec!r}))"
    return ast.parse(text).body[0]


def _class(node: ast.ClassDef, module: str, table: dict) -> ast.ClassDef:
    body = []
    for item in node.body:
        q = f"{module}.{node.name}.{getattr(item, 'name', '')}"
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and q in table:
            static = any(isinstance(d, ast.Name) and d.id == "staticmethod"
                         for d in item.decorator_list)
            body.append(_stub(item.name, q, table[q], "static" if static else "method"))
        else:
            body.append(item)
    node.body = body
    return node


def real_module(module: str, tree: ast.Module, notebook: str, alias: dict) -> str:
    """The source of ``module`` for the sandbox of ``notebook``: the real code, with each
    withheld function (or method) replaced by its stand-in (see the module's docstring)."""
    table = WITHHELD.get(notebook, {})
    body: list[ast.stmt] = []
    for node in tree.body:
        q = f"{module}.{getattr(node, 'name', '')}"
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and q in table:
            body.append(_stub(node.name, alias.get(q, q), table[q], "function"))
        elif isinstance(node, ast.ClassDef):
            body.append(_class(node, module, table))
        else:
            body.append(node)
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None),
                                                           ast.Constant):
        body.pop(0)          # the module's docstring may speak of what is withheld
    at = 0
    for i, node in enumerate(body):
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            at = i + 1
    head = ast.parse(f'"""{module} while grading {notebook}: the course\'s code, less what '
                     f'the exercises ask for."""').body
    body[at:at] = [ast.parse(_IMPORT).body[0]]
    body[:0] = head
    return ast.unparse(ast.Module(body=body, type_ignores=[])) + "\n"
