"""Notebook 06 says what it runs: the methods it launches, how long it takes, the block sizes
of its c* sweep, and why a timing may contradict the lesson (issue 16)."""
import inspect
import json
import re
from pathlib import Path

from lesson10.bench.cstar import cstar_sweep

NB = Path(__file__).resolve().parent.parent / "solutions" / "06_multiprocess.ipynb"


def _cells():
    return ["".join(c["source"]) for c in json.loads(NB.read_text(encoding="utf-8"))["cells"]]


def test_intro_names_every_method_it_runs_and_a_measured_duration():
    cells = _cells()
    intro, code = cells[0], "\n".join(cells[1:])
    assert "six methods" in intro and "four methods" not in intro
    for method in ("ring", "ulysses", "moe", "allgather", "usp"):
        assert method in code.lower(), method
    assert "under a minute" not in intro
    low, high = map(int, re.search(r"(\d+) to (\d+) seconds", intro).groups())
    assert 0 < low < high
    assert any("time.perf_counter() - t_start" in c for c in cells)   # and it prints its own


def test_timing_section_says_when_the_machine_is_busy_or_zigzag_loses():
    timing = next(c for c in _cells() if "time_attention" in c and "launch(" in c)
    assert "getloadavg" in timing and "busy" in timing and "ratio < 1" in timing


def test_cstar_sweep_sizes_are_the_ones_the_text_explains():
    factors = inspect.signature(cstar_sweep).parameters["factors"].default
    text = next(c for c in _cells() if "The sweep runs the ring at block sizes" in c)
    named = re.findall(r"c\^\\ast/(\d+)|(\d*)c\^\\ast", text.split("**Predict first.**")[0])
    said = sorted({1 / int(a) if a else (int(b) if b else 1) for a, b in named})
    assert said == sorted(factors), (said, factors)


def test_the_exercise_copy_runs_the_same_code():
    """make test runs notebook 06 once, from solutions/ (it has no exercises): the copy in
    notebooks/ must hold the same code cells, or it would go untested there."""
    def code(path):
        nb = json.loads(path.read_text(encoding="utf-8"))
        return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    exercise = NB.parent.parent / "notebooks" / NB.name
    assert code(exercise) == code(NB) and len(code(NB)) > 5
