"""What a student sees when an answer is wrong, in a real kernel (nbclient), and what nbval
makes of a broken solution.

* Run All reaches the end of every exercise notebook with every exercise answered wrong:
  each check cell shows its verdict (what differs, where, a hint) without a traceback of
  course code, the cells that use a wrong function say that the course's reference stands
  in for it, and every figure cell still makes its figure. An answer that raises shows the
  traceback of the student's own code, pointing at their line.
* ``pytest --nbval-lax`` fails on a solution notebook whose solution is broken or missing
  (a stub), and passes the same notebook as an exercise notebook (a failed check is shown,
  not raised).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # a whole command end to end: make test-slow

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
STUB = 'raise NotImplementedError("your code here'

# the exercise function -> a wrong answer of the answer suites (an expression in a1, a4)
WRONG = {
    "reduce_scatter": "a1.rs_mean", "all_gather": "a1.ag_reversed", "sp_forward": "a1.sp_is_tp",
    "sp_bytes": "a1.bytes_one_over_t",
    "block_attention": None,                 # raises: written in the cell, see RAISES
    "merge": "a1.merge_no_shift", "ring_attention": "a1.make_ring(attend=a1.attn_row_mask)",
    "causal_work": "a1.work_strict", "ring_time": "a1.time_mean", "zigzag_positions": "a1.zz_n_plus_r",
    "seq_to_heads": "a4.s2h_wrong_index", "heads_to_seq": "a4.h2s_reversed_heads",
    "ulysses_attention": "a4.make_ulysses(pos='arange')", "ulysses_bytes": "a4.ub_no_gqa",
    "route_topk": "a4.route_softmax_all", "capacity_keep": "a4.make_capacity(reverse=True)",
    "moe_stats": "a4.make_moe_stats(combine=False)", "switch_aux_loss": "a4.aux_no_E",
}
# right answers in the unusual forms the checks accept (lists of lists, one stacked array,
# integers, a read-only broadcast view): the cells that use them must cope
RIGHT = {
    "reduce_scatter": "a1.rs_array", "all_gather": "a1.ag_broadcast", "sp_forward": "a1.sp_array",
    "sp_bytes": "a1.bytes_int_list", "block_attention": "a1.attn_python", "merge": "a1.merge_loops",
    "ring_attention": "a1.make_ring(mrg=a1.merge_loops, stack=True)", "causal_work": "a1.work_python",
    "ring_time": "a1.time_item", "zigzag_positions": "a1.zz_lists", "seq_to_heads": "a4.s2h_reshape",
    "heads_to_seq": "a4.h2s_reshape", "ulysses_attention": "a4.ulysses_positional",
    "ulysses_bytes": "a4.ub_integers", "route_topk": "a4.route_python",
    "capacity_keep": "a4.cap_rounded_counter", "moe_stats": "a4.moe_loops",
    "switch_aux_loss": "a4.aux_loops",
}
RAISES = '''def block_attention(q, k, v, q_pos, k_pos, causal=True):
    scores = q @ k.T                      # (sq, a, d) @ (d, a, sk): shapes do not match
    return scores, scores
'''
FIGURE = re.compile(r"\bfigures\.(?!draw_|plot_)\w+\(")   # the interactive ones (plot_*: into your axes)
COURSE_PATH = re.compile(r"lesson10[/\\](checks|sim|layouts|cost)|site-packages")


def _exercise_name(source: str) -> str | None:
    m = re.search(r"^def (\w+)\(", source, re.M)
    return m.group(1) if m and STUB in source else None


def _text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif out["output_type"] == "error":
            parts.append("\n".join(out["traceback"]))
        else:
            parts.append(str(out.get("data", {}).get("text/plain", "")))
    return "".join(parts)


def _run(nb, cwd: Path):
    env_before = os.environ.pop("LESSON10_STRICT_CHECKS", None)     # a student's kernel
    try:
        nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                                resources={"metadata": {"path": str(cwd)}}).execute()
    finally:
        if env_before is not None:
            os.environ["LESSON10_STRICT_CHECKS"] = env_before
    return nb


NOTEBOOKS = ["01_sequence_parallel", "02_ring_attention", "03_load_balance", "04_ulysses",
             "05_moe_dispatch"]


def _answered(name, table):
    nb = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    answered = {}
    for i, cell in enumerate(nb.cells):
        fn = _exercise_name(cell.source) if cell.cell_type == "code" else None
        if fn:
            answered[fn] = i
            cell.source = (RAISES if table[fn] is None else
                           f"import answers_01_03 as a1, answers_04_05 as a4\n{fn} = {table[fn]}\n")
    assert answered, name
    _run(nb, HERE)                                    # raises CellExecutionError if a cell raised
    checks = {}
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        text = _text(cell)
        assert not any(o["output_type"] == "error" for o in cell.outputs), (i, text[-2000:])
        m = re.match(r"checks\.check_(\w+)\((\w+)\)", cell.source.strip())
        if m:
            checks[m.group(2)] = text
        if FIGURE.search(cell.source):                 # the figure's widget was made
            assert any(o["output_type"] in ("display_data", "execute_result") and
                       "application/vnd.jupyter.widget-view+json" in o.get("data", {})
                       for o in cell.outputs), (i, text)
    assert set(checks) == set(answered), (checks.keys(), answered.keys())
    return nb, checks


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_run_all_reaches_the_end_with_every_answer_wrong(name):
    nb, checks = _answered(name, WRONG)
    for fn, text in checks.items():
        assert re.match(r"check_\w+ failed: ", text), (fn, text)
        assert "hint:" in text, (fn, text)
        assert not COURSE_PATH.search(text), (fn, text)
        if fn == "block_attention":                    # the student's traceback, their line
            assert "Traceback of your code" in text and "Cell In[" in text, text
            assert "scores = q @ k.T" in text, text
        else:
            assert "Traceback" not in text, (fn, text)
    uses = "".join(_text(c) for c in nb.cells if c.cell_type == "code" and "fallback" in c.source)
    if "fallback" in "".join(c.source for c in nb.cells if c.cell_type == "code"):
        assert "did not pass check_" in uses and "stands in" in uses, uses[-2000:]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_run_all_takes_right_answers_in_any_accepted_form(name):
    nb, checks = _answered(name, RIGHT)
    for fn, text in checks.items():
        assert re.match(r"check_\w+ passed \((\d+ points?|optional practice)\): ", text), (fn, text)
    assert "stands in" not in "".join(_text(c) for c in nb.cells if c.cell_type == "code")


def _mini_notebook(solution: str) -> dict:
    """An import cell, one exercise with ``solution`` in its solution region, its check cell
    and a cell that uses it."""
    def cell(src):
        return {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                "source": src}
    return {"cells": [cell("import numpy as np\nfrom lesson10 import checks, layouts"),
                      cell("def ring_time(work):\n    ### BEGIN SOLUTION\n"
                           f"    {solution}\n    ### END SOLUTION"),
                      cell("checks.check_ring_time(ring_time)"),
                      cell("t = checks.fallback(ring_time, layouts.ring_time)\n"
                           "print(t(np.array([[1.0, 2.0], [3.0, 0.5]])))")],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                        "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def test_nbval_fails_on_a_broken_solution_and_passes_it_as_an_exercise(tmp_path):
    """The repository's conftest.py makes a failed check raise in solutions/ only."""
    for folder, solution in (("solutions", "return np.asarray(work).mean(axis=1).sum()"),
                             ("notebooks", "return np.asarray(work).mean(axis=1).sum()"),
                             ("stub/solutions", "raise NotImplementedError"),
                             ("stub/notebooks", "raise NotImplementedError"),
                             ("good/solutions", "return np.asarray(work).max(axis=1).sum()")):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "nb.ipynb").write_text(json.dumps(_mini_notebook(solution)))
    shutil.copyfile(ROOT / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if k not in ("LESSON10_STRICT_CHECKS", "PYTEST_ADDOPTS")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                           "--nbval-lax", "notebooks", "solutions", "stub", "good/solutions", "-rf"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    failed = re.findall(r"^FAILED (\S+)", out, re.M)
    assert sorted(f.split("::")[0] for f in failed) == ["solutions/nb.ipynb", "stub/solutions/nb.ipynb"], \
        out[-3000:]
    assert "check_ring_time failed" in out and "hint:" in out and "not attempted" in out
    assert re.search(r"\b2 failed, 18 passed\b", out), out[-3000:]
