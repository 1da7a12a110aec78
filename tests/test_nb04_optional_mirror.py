"""Notebook 04's optional ``heads_to_seq`` costs a student nothing: left as the stub, the cell
after its check writes it from the student's own ``seq_to_heads`` (the same exchange with the
first two axes swapped), so ``ulysses_attention``, which calls it, can still pass; a written
``heads_to_seq`` is kept as it is."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from lesson10 import checks
from lesson10.checks.feedback import CheckFailed

ROOT = Path(__file__).resolve().parents[1]
MIRROR = "nb04-h2s-mirror"


def _cells(tree: str) -> dict:
    nb = json.loads((ROOT / tree / "04_ulysses.ipynb").read_text(encoding="utf-8"))
    return {c.get("id"): "".join(c["source"]) for c in nb["cells"]}


def _namespace(heads_to_seq_from: str, seq_to_heads_from: str = "solutions") -> dict:
    """Notebook 04 run up to its Ulysses exercise: the imports, ``seq_to_heads`` and
    ``heads_to_seq`` from the trees named, the mirror cell, the solved ``ulysses_attention``."""
    sol, ns = _cells("solutions"), {}
    for source in (sol["nb04-002"], _cells(seq_to_heads_from)["nb04-004"],
                   _cells(heads_to_seq_from)["nb04-007"], sol[MIRROR], sol["nb04-014"]):
        exec(compile(source, "<notebook 04>", "exec"), ns)
    return ns


def test_the_mirror_cell_sits_right_after_the_check_of_heads_to_seq_in_both_trees():
    for tree in ("solutions", "notebooks"):
        ids = list(_cells(tree))
        assert ids[ids.index("nb04-008") + 1] == MIRROR, tree


def test_a_skipped_heads_to_seq_is_written_from_seq_to_heads_and_ulysses_passes(monkeypatch, capsys):
    monkeypatch.setenv("LESSON10_STRICT_CHECKS", "1")          # a failed check raises
    ns = _namespace(heads_to_seq_from="notebooks")
    assert "written from your seq_to_heads" in capsys.readouterr().out
    checks.check_heads_to_seq(ns["heads_to_seq"])
    checks.check_ulysses_attention(ns["ulysses_attention"])


def test_a_written_heads_to_seq_is_kept(capsys):
    ns = _namespace(heads_to_seq_from="solutions")
    assert ns["heads_to_seq"].__code__.co_filename == "<notebook 04>"
    assert "NotImplementedError" not in ns["heads_to_seq"].__code__.co_names
    assert "written from your seq_to_heads" not in capsys.readouterr().out


def test_the_mirror_is_only_as_right_as_the_students_seq_to_heads(monkeypatch):
    """With seq_to_heads still the stub too, the mirror is no answer: its check says so."""
    monkeypatch.setenv("LESSON10_STRICT_CHECKS", "1")
    ns = _namespace(heads_to_seq_from="notebooks", seq_to_heads_from="notebooks")
    with pytest.raises((NotImplementedError, CheckFailed)):
        checks.check_heads_to_seq(ns["heads_to_seq"])
