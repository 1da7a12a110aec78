"""Reading a submitted notebook: nbformat's own reader and validator, inside limits.

Every notebook of a batch is read by :func:`read` before anything is planned or run, and
whatever is wrong with a file is that file's refusal, in one sentence: never an exception
that stops the batch. In order:

* the file's size (:data:`MAX_NOTEBOOK_BYTES`, saved outputs included) and its encoding
  (UTF-8);
* the nesting of its JSON (:data:`MAX_JSON_DEPTH`), measured on the bytes before they are
  parsed, so metadata nested 100,000 deep costs no recursion;
* the JSON itself; then its saved outputs are dropped (the grader runs the code and never
  reads them: a notebook with 120 MB of figures is graded), and what is left, its code, text
  and metadata, must fit :data:`MAX_CODE_BYTES`;
* nbformat's validator (``nbformat.validate``) on what it holds: a
  ``source`` list holding a number, ``"metadata": []``, ``"kernelspec": "python3"`` are
  invalid notebooks; then ``nbformat.reads`` (any nbformat 4 minor, older ones converted);
* the number of cells and each cell's size (:data:`MAX_CELLS`, :data:`MAX_CELL_CHARS`), and
  the depth of the expressions in each code cell (:data:`MAX_EXPR_DEPTH`): as written, as
  Jupyter runs it (IPython's transformation), and with magic prefixes taken off (the code a
  ``%%time`` runs), so the check-cell scan never meets an expression Python cannot parse.
"""
from __future__ import annotations

import ast
import json
import os
import re
import warnings
from pathlib import Path

from ...errors import Lesson10Error
from .submission_files import FileRefused, read_regular

#: the largest notebook file read, saved outputs included (they are dropped on read)
MAX_NOTEBOOK_BYTES = 256 * 2**20
#: the largest notebook without its saved outputs: its code, text and metadata
MAX_CODE_BYTES = 64 * 2**20
#: how deep the JSON of a notebook may nest (a notebook needs about 10 levels)
MAX_JSON_DEPTH = 100
#: characters of one cell's source, and cells of one notebook
MAX_CELL_CHARS, MAX_CELLS = 1_000_000, 10_000
#: how deep the syntax tree of a code cell may nest (hand-written code stays under 100)
MAX_EXPR_DEPTH = 500

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)    # a JSON string, escapes included
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_MAGIC = re.compile(r"(?m)^([ \t]*)(?:%%?[A-Za-z_]\w*|!)[ \t]*")


class NotebookRefused(Lesson10Error, ValueError):
    """The file is refused as a notebook; the message is the sentence its student reads."""


def read(path: Path, content: bytes | None = None):
    """``(notebook, None)`` or ``(None, why)``: the file at ``path`` (its bytes ``content``
    when they were read already), read and validated as a notebook. ``why`` is one sentence;
    nothing is raised."""
    try:
        if content is None:
            size = os.stat(path, follow_symlinks=False).st_size
            if size > MAX_NOTEBOOK_BYTES:
                raise NotebookRefused(_too_big(size))
            content = read_regular(Path(path), MAX_NOTEBOOK_BYTES)
        return parse(content), None
    except (NotebookRefused, FileRefused) as exc:
        return None, f"cannot read the notebook: {exc}"
    except OSError as exc:
        return None, f"cannot read the notebook: {exc.strerror or exc}"
    except Exception as exc:  # noqa: BLE001 - any file at all is that file's problem only
        return None, f"cannot read the notebook: {type(exc).__name__}: {str(exc)[:200]}"


def _too_big(size: int) -> str:
    return (f"the file is {size / 2**20:.0f} MB, over the grader's limit of "
            f"{MAX_NOTEBOOK_BYTES // 2**20} MB; clear its outputs (Edit > Clear All Outputs) "
            f"and hand it in again")


def json_depth(data: bytes) -> int:
    """How deep the JSON text ``data`` nests (``[]`` and ``{}`` outside strings), counted
    without parsing it."""
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    depth = deepest = 0
    for byte in brackets:
        depth += 1 if byte in (0x5B, 0x7B) else -1
        deepest = max(deepest, depth)
    return deepest


def _json(data: bytes) -> dict:
    """The JSON object of a notebook file's bytes (size, encoding and nesting checked first);
    raises :class:`NotebookRefused`."""
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise NotebookRefused(_too_big(len(data)))
    try:
        text = data.decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError:
        raise NotebookRefused("it is not UTF-8 text (a notebook is JSON in UTF-8); save it "
                              "again from Jupyter") from None
    depth = json_depth(data)
    if depth > MAX_JSON_DEPTH:
        raise NotebookRefused(f"its JSON nests {depth} levels deep, over the grader's limit of "
                              f"{MAX_JSON_DEPTH} (a notebook needs about 10); save it again "
                              f"from Jupyter without what nests so deep")
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise NotebookRefused(f"it is not JSON ({exc}); a notebook is a JSON file: save it "
                              f"again from Jupyter") from None
    if not isinstance(raw, dict) or "nbformat" not in raw:
        raise NotebookRefused("it is JSON but no notebook (no 'nbformat' version field); "
                              "save it again from Jupyter")
    return raw


def _drop_outputs(raw: dict) -> bool:
    """Empty the saved outputs of every code cell of the notebook JSON ``raw`` (nbformat 4,
    or 3's worksheets), in place; whether there were any."""
    cells = raw.get("cells")
    if not isinstance(cells, list):
        sheets = raw.get("worksheets")
        cells = [c for ws in sheets if isinstance(ws, dict) and isinstance(ws.get("cells"), list)
                 for c in ws["cells"]] if isinstance(sheets, list) else []
    dropped = False
    for cell in cells:
        if isinstance(cell, dict) and cell.get("cell_type") == "code" and cell.get("outputs"):
            cell["outputs"], dropped = [], True
    return dropped


def slim(data: bytes) -> bytes:
    """``data``, a notebook file's bytes, as the grader keeps them: without the saved
    outputs (JSON text again), or as they are when there are none or they are no notebook
    (:func:`parse` then says why). A class of notebooks full of figures costs only its code."""
    try:
        raw = _json(data)
    except Exception:  # noqa: BLE001 - the reader refuses it later, with its reason
        return data
    return json.dumps(raw, indent=1).encode() + b"\n" if _drop_outputs(raw) else data


def parse(data: bytes):
    """The notebook (an ``nbformat.NotebookNode``, version 4) in the bytes ``data``, its
    saved outputs dropped; raises :class:`NotebookRefused` with the sentence that says what
    is wrong and what to do."""
    import nbformat
    raw = _json(data)
    _drop_outputs(raw)
    text = json.dumps(raw)
    if len(text) > MAX_CODE_BYTES:
        raise NotebookRefused(f"without its saved outputs it still holds {len(text) / 2**20:.0f} "
                              f"MB of code, text and metadata, over the grader's limit of "
                              f"{MAX_CODE_BYTES // 2**20} MB; keep data in files beside the "
                              f"notebook, not in its cells")
    cells = raw.get("cells")
    if isinstance(cells, list) and len(cells) > MAX_CELLS:
        raise NotebookRefused(f"it has {len(cells):,} cells, over the grader's limit of "
                              f"{MAX_CELLS:,}; hand in the course's notebook with your code")
    caught: dict = {}
    with warnings.catch_warnings():           # cells without ids: normal in old files
        warnings.simplefilter("ignore")
        try:
            nbformat.validate(raw)
        except nbformat.ValidationError as exc:
            raise NotebookRefused(_invalid(exc)) from None
        nb = nbformat.reads(text, as_version=4, capture_validation_error=caught)
    if caught.get("ValidationError") is not None:
        raise NotebookRefused(_invalid(caught["ValidationError"]))
    for i, cell in enumerate(nb.cells):
        check_cell(i, cell)
    return nb


def _invalid(exc: Exception) -> str:
    where = "/".join(map(str, getattr(exc, "absolute_path", None) or []))
    first = (str(getattr(exc, "message", "") or exc).strip().splitlines() or ["?"])[0]
    if len(first) > 120:                  # the message quotes the value: a cell's whole source
        first = f"a value of the wrong type ({getattr(exc, 'validator', 'schema')})"
    at = f" at {where}" if where else ""
    return (f"it is not a valid notebook (nbformat's validator{at}: {first}); open it in "
            f"Jupyter and save it again, or hand in the course's notebook with your code")


def check_cell(index: int, cell) -> None:
    """Refuse (:class:`NotebookRefused`) a cell over the size or expression-depth limits."""
    src = cell.get("source", "")
    if len(src) > MAX_CELL_CHARS:
        raise NotebookRefused(f"cell {index} holds {len(src):,} characters, over the grader's "
                              f"limit of {MAX_CELL_CHARS:,}; keep data in a file beside the "
                              f"notebook, not in a cell")
    if cell.get("cell_type") != "code":
        return
    depth = expression_depth(src)
    if depth == 0:              # not Python as written: magics, shell lines (Jupyter's way)
        depth = max(expression_depth(_as_python(src)), expression_depth(_MAGIC.sub(r"\1", src)))
    if depth > MAX_EXPR_DEPTH:
        how = "too deep for Python to parse" if depth == _TOO_DEEP else \
            f"more than {MAX_EXPR_DEPTH} levels deep"
        raise NotebookRefused(f"cell {index} holds an expression nested {how} (the grader's "
                              f"limit is {MAX_EXPR_DEPTH}); write it as a loop or split it up")


_TOO_DEEP = 1 << 30


def expression_depth(src: str) -> int:
    """How deep the syntax tree of ``src`` nests (0: no Python, e.g. a shell line), measured
    without recursion; ``_TOO_DEEP`` when Python's parser itself gives up."""
    try:
        tree = ast.parse(src)
    except (SyntaxError, ValueError):
        return 0
    except (RecursionError, MemoryError):
        return _TOO_DEEP
    deepest = 0
    stack: list[tuple[ast.AST, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_EXPR_DEPTH:
            break
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def _as_python(src: str) -> str:
    """``src`` as Jupyter runs it (IPython's input transformation), else ``src``."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
        return TransformerManager().transform_cell(src)
    except Exception:  # noqa: BLE001 - what IPython cannot transform is measured as written
        return src
