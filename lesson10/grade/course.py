"""What the course expects of a submission: which notebook it is, which exercises count,
which function each exercise judges, and which cells are check cells.

All of it comes from the course (:data:`lesson10.checks.EXERCISES` and the notebook id
that ``python -m lesson10 build`` writes into ``metadata["lesson10"]["notebook"]``),
never from what the submission contains.
"""
from __future__ import annotations

import ast
from pathlib import Path

from ..checks import EXERCISES

#: course notebooks that have no exercise (graded 0 of 0, not executed)
NOTEBOOKS_WITHOUT_EXERCISES = ("06_multiprocess",)

#: the function the judge calls for an exercise, where its name differs from the id
FUNCTION_NAMES = {"capacity": "capacity_keep", "aux_loss": "switch_aux_loss"}

#: what an exercise should use instead of the course's code (said when it calls some)
USE_INSTEAD = {
    "sp_forward": "use your reduce_scatter and all_gather and the op the check passes in",
    "ring_attention": "use the block_attention and merge you wrote and the group the check "
                      "passes in",
    "seq_to_heads": "split with NumPy and move the blocks with the group the check passes in",
    "heads_to_seq": "split with NumPy and move the blocks with the group the check passes in",
    "ulysses_attention": "use your seq_to_heads and heads_to_seq with the group, and the "
                         "attention kernel, that the check passes in",
    "causal_work": "count the visible pairs with NumPy",
}


def use_instead(exercise_id: str) -> str:
    return USE_INSTEAD.get(exercise_id, "write it with NumPy and the functions you wrote")



def course_notebooks() -> list[str]:
    ids = []
    for ex in EXERCISES.values():
        if ex.notebook not in ids:
            ids.append(ex.notebook)
    return ids + list(NOTEBOOKS_WITHOUT_EXERCISES)


def exercises(notebook_id: str) -> list:
    return [ex for ex in EXERCISES.values() if ex.notebook == notebook_id]


def function_name(exercise_id: str) -> str:
    """The name of the student's function: the exercise's own record of it when the checks
    keep one (``Exercise.function``), else :data:`FUNCTION_NAMES`, else the id."""
    recorded = getattr(EXERCISES.get(exercise_id), "function", "")
    return recorded or FUNCTION_NAMES.get(exercise_id, exercise_id)


def full_marks(notebook_id: str | None) -> int:
    """Points of a course notebook; of the whole course when the id is unknown."""
    chosen = exercises(notebook_id) if notebook_id else []
    if notebook_id is None:
        chosen = list(EXERCISES.values())
    return sum(ex.points for ex in chosen)


def identify(nb: dict, path: Path) -> tuple[str | None, str]:
    """``(notebook id or None, how it was found)``: the id ``build`` wrote into the
    metadata, else the course notebook whose id starts the file name."""
    known = course_notebooks()
    meta = nb.get("metadata", {}) if isinstance(nb, dict) else {}
    claimed = (meta.get("lesson10") or {}).get("notebook") if isinstance(meta.get("lesson10"),
                                                                          dict) else None
    if isinstance(claimed, str) and claimed in known:
        return claimed, "metadata"
    stem = path.stem
    for nid in sorted(known, key=len, reverse=True):
        if stem.startswith(nid):
            return nid, "file name"
    why = (f"metadata names {claimed!r}, not a course notebook" if claimed is not None else
           "no lesson10 notebook id in its metadata")
    return None, (f"{why}, and the file name {path.name!r} does not start with a course "
                  f"notebook id ({', '.join(known)})")


def language_problem(nb: dict) -> str | None:
    """Why this is not a Python notebook (its kernel), or None."""
    meta = nb.get("metadata", {})
    spec = meta.get("kernelspec") or {}
    lang = (spec.get("language") or (meta.get("language_info") or {}).get("name") or "python")
    name = spec.get("name") or "python3"
    if str(lang).lower() != "python" or not str(name).lower().startswith(("python", "py")):
        return f"not a Python notebook (kernel {name!r}, language {lang!r})"
    return None


def called_checks(nb: dict) -> set[str]:
    """Exercise ids whose ``check_<id>(...)`` is called in some code cell of ``nb``."""
    found = set()
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        try:
            tree = ast.parse("".join(src) if isinstance(src, list) else str(src))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                if name.startswith("check_"):
                    found.add(name[len("check_"):])
    return found


def code_cells(nb: dict) -> list[tuple[int, str]]:
    """``(cell index, source)`` of every non-empty code cell, check cells included: the
    sandbox runs them all, and each check call is where its exercise is judged."""
    out = []
    for i, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        src = "".join(src) if isinstance(src, list) else str(src)
        if src.strip():
            out.append((i, src))
    return out
