"""Notebook 06 says what it runs: the methods it launches, how long it takes, the block sizes
of its c* sweep, and why a timing may contradict the lesson (issue 16); its two exercises, its
launches' time limits and its numbers said as the code computes them (issue 31)."""
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
    assert "under a minute" not in intro and "no exercises" not in intro
    assert "Two exercises" in intro and "checked in Jupyter only" in intro
    said = re.search(r"Running it took (\d+) to (\d+) minutes .*?\(measured: (\d+) s at load [\d.]+ to "
                     r"[\d.]+ and (\d+) s at load", intro, re.S)
    assert said, intro
    low, high, fast, slow = map(int, said.groups())
    assert 0 < low < high < 30 and abs(fast / 60 - low) < 1 and abs(slow / 60 - high) < 1   # the same times
    assert any("time.perf_counter() - t_start" in c for c in cells)   # and it prints its own


def test_every_launch_has_a_limit_that_follows_the_machine():
    """Under load the 60 s default stopped USP and the c* sweep (issue 31): each launch of the
    notebook passes launch_timeout(...), which grows with the load."""
    code = "\n".join(c for c in _cells() if "launch(" in c)
    calls = re.findall(r"(?<![\w.])launch\((?!my_worker|\.\.\.)", code)   # my_worker: refused before any start
    assert len(calls) >= 12
    assert code.count("timeout=launch_timeout(") == len(calls)


def test_the_text_says_the_numbers_the_code_uses():
    cells = _cells()
    timing = next(c for c in cells if "time_attention" in c and "launch(" in c)
    reps = int(re.search(r"SEQ, REPS = \d+, (\d+)", timing).group(1))
    text = next(c for c in cells if "We time causal ring attention" in c)
    assert f"the median of {reps} timed" in text and "median of 3" not in "".join(text.split())
    nodes = next(c for c in cells if "The flat all-to-all sends one copy per" in c)
    assert "about as many" not in nodes and "8,960" in nodes and "9,984" in nodes
    assert any("assert flat_limited >= flat" in c for c in cells)    # the cell checks the claim


def test_two_exercises_each_with_a_check_cell_that_launches_ranks():
    cells = _cells()
    for name, check in (("def ring_shift(", "check_ring_shift(ring_shift)"),
                        ("class GatherFromSP(torch.autograd.Function)", "check_gather_from_sp(GatherFromSP)")):
        at = next(i for i, c in enumerate(cells) if name in c)
        assert "### BEGIN SOLUTION" in cells[at] and "dist." in cells[at]
        assert check in cells[at + 1]
        assert len(cells[at - 1].split()) <= 250                       # the exercise text


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
    """make test runs notebook 06 once, from solutions/: the copy in notebooks/ must hold the
    same code cells but for the exercises' stubs, or it would go untested there."""
    from lesson10.course.build import strip_solutions

    def code(path, strip=False):
        nb = json.loads(path.read_text(encoding="utf-8"))
        cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
        return [strip_solutions(c) if strip else c for c in cells]
    exercise = NB.parent.parent / "notebooks" / NB.name
    assert code(exercise) == code(NB, strip=True) and len(code(NB)) > 5
    assert code(exercise) != code(NB)                     # the exercises are stubs there
