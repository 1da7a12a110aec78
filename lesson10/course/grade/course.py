"""What the course expects of a submission: which notebook it is, which exercises count,
which function each exercise judges, and which cells are check cells.

All of it comes from the course (:data:`lesson10.checks.EXERCISES` and the notebook id
that ``python -m lesson10 build`` writes into ``metadata["lesson10"]["notebook"]``),
never from what the submission contains.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from ...checks import EXERCISES
from ...checks.exercises import maximum

#: course notebooks with no graded exercise (graded 0 of 0, not executed); notebook 06's two
#: exercises start real ranks and are checked in Jupyter only (lesson10/checks/nb06_multiprocess.py)
NOTEBOOKS_WITHOUT_EXERCISES = ("06_multiprocess",)


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
    keep one (``Exercise.function``), else the id."""
    recorded = getattr(EXERCISES.get(exercise_id), "function", "")
    return recorded or exercise_id


def full_marks(notebook_id: str | None) -> int:
    """Points of a course notebook; of the whole course when the id is unknown (the course
    file's: :func:`lesson10.checks.exercises.maximum`)."""
    return maximum(notebook_id)


#: what copying a notebook adds to its name: Colab's "Save a copy in Drive" ("Copy of X", and
#: its translations), Jupyter's "Duplicate" ("X-Copy1"), a browser's second download ("X (1)"),
#: the macOS Finder ("X copy", "X copy 2")
_COPY_PREFIX = re.compile(r"^(?:(?:copy of|copia de|copie de|c\u00f3pia de|kopie von|kopie van|"
                          r"kopia av|kopio:|copia di)\s+)+", re.IGNORECASE)
_COPY_SUFFIX = re.compile(r"(?:-copy\d*|\s*\(\d+\)|\s+copy(?:\s+\d+)?)+$", re.IGNORECASE)


def copy_base(name: str) -> str:
    """The name a copy was made from, without its ``.ipynb``: ``"Copy of 01_x (1).ipynb"``
    and ``"01_x-Copy2.ipynb"`` are copies of ``"01_x"``."""
    stem = name[:-len(".ipynb")] if name.lower().endswith(".ipynb") else name
    stem = _COPY_PREFIX.sub("", stem.strip())
    return _COPY_SUFFIX.sub("", stem).strip()


def is_copy_name(name: str) -> bool:
    """Whether the file name carries a copy's decoration (see :func:`copy_base`)."""
    stem = name[:-len(".ipynb")] if name.lower().endswith(".ipynb") else name
    return copy_base(name) != stem.strip()


def identify(nb: dict, path: Path) -> tuple[str | None, str]:
    """``(notebook id or None, how it was found)``: the id ``build`` wrote into the
    metadata, else the course notebook whose id starts the file name, once a copy's
    decoration is taken off it (``Copy of 01_sequence_parallel.ipynb``,
    ``01_sequence_parallel-Copy1.ipynb``: see :func:`copy_base`), else the one course
    notebook id the name contains (``alice_4711_03_load_balance.ipynb``)."""
    known = course_notebooks()
    meta = nb.get("metadata", {}) if isinstance(nb, dict) else {}
    claimed = (meta.get("lesson10") or {}).get("notebook") if isinstance(meta.get("lesson10"),
                                                                          dict) else None
    if isinstance(claimed, str) and claimed in known:
        return claimed, "metadata"
    for stem in dict.fromkeys((path.stem, copy_base(path.name))):
        for nid in sorted(known, key=len, reverse=True):
            if stem.startswith(nid):
                return nid, "file name"
    inside = [nid for nid in known if nid in copy_base(path.name)]
    if len(inside) == 1:                   # an LMS download: "alice_12345_03_load_balance"
        return inside[0], "file name"
    why = (f"metadata names {claimed!r}, not a course notebook" if claimed is not None else
           "no lesson10 notebook id in its metadata")
    return None, (f"{why}, and the file name {path.name!r} does not start with a course "
                  f"notebook id ({', '.join(known)})")


def _text(value) -> str:
    """A metadata field as text ("" for a missing one, or one of another type)."""
    return value.strip() if isinstance(value, str) else ""


def kernel_language(nb) -> tuple[str, str]:
    """``(language, kernel name)`` a notebook was saved with: the language from
    ``metadata.language_info.name``, else ``metadata.kernelspec.language`` (lower case; ""
    when neither says), and the kernel's name for messages. Fields of the wrong type
    count as missing."""
    def field(d, key) -> dict:
        value = d.get(key) if isinstance(d, dict) else None
        return value if isinstance(value, dict) else {}
    meta = field(nb, "metadata")
    spec, info = field(meta, "kernelspec"), field(meta, "language_info")
    lang = _text(info.get("name")) or _text(spec.get("language"))
    name = _text(spec.get("name")) or _text(spec.get("display_name"))
    return lang.lower(), name


#: kernel names of other languages, for a notebook whose metadata names no language
_OTHER_KERNELS = (("ir", "r"), ("julia", "julia"), ("ijulia", "julia"), ("javascript", "javascript"),
                  ("ijavascript", "javascript"), ("bash", "bash"), ("xcpp", "c++"),
                  ("evcxr", "rust"), ("gophernotes", "go"), ("scala", "scala"), ("java", "java"),
                  (".net-", ".net"), ("octave", "octave"), ("matlab", "matlab"))


def language_problem(nb: dict) -> str | None:
    """Why this is not a Python notebook, or None. The kernel's language decides, never its
    name: a conda kernel (``conda-env-ml-py``), xeus-python (``xpython``), pyenv or venv
    kernels are Python; a notebook that names no language is taken as Python (the grader
    runs it as Python and judges what it does)."""
    lang, name = kernel_language(nb)
    if not lang:                    # no language said: only a kernel known for another one
        lang = next((other for prefix, other in _OTHER_KERNELS
                     if name.lower().startswith(prefix)), "")
    if lang in ("", "python", "python3", "ipython", "ipython3"):
        return None
    kernel = f"kernel {name!r}, " if name else ""
    return (f"not a Python notebook ({kernel}language {lang!r}): it was saved from a "
            f"{lang} kernel; open it with a Python 3 kernel, run it, save it, and hand it in "
            f"again")


#: magics that run their text as Python in the kernel (``%%time``, ``%timeit x``, ...): a
#: check call inside one is a check call
RUNS_CODE = ("time", "timeit", "capture", "prun", "debug")


def _as_python(src: str) -> str:
    """``src`` as Jupyter runs it: IPython's own input transformation (magics and shell
    lines become calls), or ``src`` itself when IPython is not there."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:
        return src
    try:
        return TransformerManager().transform_cell(src)
    except Exception:  # noqa: BLE001 - what IPython cannot transform runs as it is
        return src


def _magic_code(node: ast.Call) -> str | None:
    """The code a ``run_cell_magic`` / ``run_line_magic`` call runs, for :data:`RUNS_CODE`."""
    f = node.func
    kind = f.attr if isinstance(f, ast.Attribute) else ""
    at = {"run_cell_magic": 2, "run_line_magic": 1}.get(kind)
    if at is None or len(node.args) <= at:
        return None
    name, code = node.args[0], node.args[at]
    if isinstance(name, ast.Constant) and name.value in RUNS_CODE and \
            isinstance(code, ast.Constant) and isinstance(code.value, str):
        return code.value
    return None


def _checks_in(src: str, depth: int = 0) -> set[str]:
    """Exercise ids whose ``check_<id>(...)`` the code ``src`` calls, magics included."""
    try:
        tree = ast.parse(_as_python(src))
    except (SyntaxError, ValueError):
        return set()
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if name.startswith("check_"):
            found.add(name[len("check_"):])
        inner = _magic_code(node) if depth < 4 else None
        if inner is not None:
            found |= _checks_in(inner, depth + 1)
    return found


def called_checks(nb: dict) -> set[str]:
    """Exercise ids whose ``check_<id>(...)`` is called in some code cell of ``nb``, read as
    Jupyter runs the cell (a check cell with ``%%time``, ``%%capture`` or a ``!`` shell
    line is a check cell)."""
    found: set[str] = set()
    for cell in nb.get("cells", []):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        found |= _checks_in("".join(map(str, src)) if isinstance(src, list) else str(src))
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


def _is_not_implemented(node: ast.Raise) -> bool:
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError" or \
        isinstance(exc, ast.Attribute) and exc.attr == "NotImplementedError"


def _blocks(node):
    """The statement lists inside ``node`` (a function's body, both sides of an ``if``,
    the handlers of a ``try``, the cases of a ``match`` ...)."""
    for field in ("body", "orelse", "finalbody"):
        inner = getattr(node, field, None)
        if isinstance(inner, list):
            yield inner
    for part in list(getattr(node, "handlers", [])) + list(getattr(node, "cases", [])):
        yield part.body


def _live_raises(body: list) -> int:
    """``raise NotImplementedError`` statements of a block that can run: a block's
    statements after its ``return``, ``raise``, ``break`` or ``continue`` are dead."""
    count = 0
    for node in body:
        if isinstance(node, ast.Raise):
            return count + int(_is_not_implemented(node))
        count += sum(_live_raises(inner) for inner in _blocks(node))
        if isinstance(node, (ast.Return, ast.Break, ast.Continue)):
            return count
    return count


def unwritten(nb) -> int:
    """How many exercises of ``nb`` are left unwritten, for the copy rule: the
    ``raise NotImplementedError`` statements its code cells can still execute (read as
    Python, :func:`ast`): a stub kept as a comment, or as dead code after a ``return``,
    does not count. A cell that is not Python counts its ``raise NotImplementedError``
    words."""
    count = 0
    cells = nb.get("cells", []) if isinstance(nb, dict) else []
    for cell in cells if isinstance(cells, list) else []:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        src = "".join(map(str, src)) if isinstance(src, list) else str(src)
        try:
            tree = ast.parse(_as_python(src))
        except (SyntaxError, ValueError):
            count += len(re.findall(r"raise\s+NotImplementedError", src))
            continue
        count += _live_raises(tree.body)
    return count
