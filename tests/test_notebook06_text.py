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


def test_each_timing_section_reads_the_load_first_and_says_when_the_machine_is_busy():
    """Issue 47: on a busy machine zig-zag came out 0.91x, its timeline bars unequal and the
    exposed floor 7-11 ms: each timing cell reads the load before its launch and, when
    busy_reason names something, says so instead of drawing a conclusion."""
    cells = _cells()
    timed = [c for c in cells if re.search(r"launch\((time_attention|ring_timelines|cstar_sweep)", c)]
    assert len(timed) == 3
    for cell in timed:
        assert cell.index("getloadavg") < cell.index("launch(") < cell.index("busy_reason(load")
        assert re.search(r"if busy:\n\s+print\(f\"the machine is busy \(\{busy\}\)", cell)
    zigzag = timed[0]
    assert "compute alone" in zigzag and "model" in zigzag and 'r["times"]' in zigzag
    assert "a millisecond or so" not in "".join(cells)


def test_the_zigzag_text_says_what_is_measured_against_the_model():
    text = next(c for c in _cells() if "We time causal ring attention" in c)
    assert "**wall clock**" in text and "**compute alone**" in text and "model" in text
    assert "busy machine" in text


def test_each_prediction_is_written_down_and_revealed():
    """Issue 47: 06 asked 12 questions with nothing to commit them to; the few it keeps each
    take a prediction (my_prediction = None) and a later cell reveals it."""
    cells = json.loads(NB.read_text(encoding="utf-8"))["cells"]
    cells = [(c["cell_type"], "".join(c["source"])) for c in cells]
    asked = [i for i, (kind, text) in enumerate(cells) if kind == "markdown" and "**Predict first" in text]
    assert 3 <= len(asked) <= 6
    for n, i in enumerate(asked):
        kind, text = cells[i + 1]
        assert kind == "code" and re.search(r"^my_prediction = None$", text, re.M), i
        upto = asked[n + 1] if n + 1 < len(asked) else len(cells)
        assert any("predict.reveal(my_prediction" in t for k, t in cells[i + 2:upto] if k == "code"), i
    assert sum("predict.reveal(" in t for _, t in cells) == len(asked)


def test_how_this_is_checked_is_short_and_states_the_deadlock_limit():
    from lesson10.checks.nb06_progress import STALL_SECONDS
    note = next(c for c in _cells() if c.startswith("**How this is checked.**"))
    assert len(note.split()) <= 120
    assert f"no progress for {STALL_SECONDS:.0f} s" in " ".join(note.split())


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


def test_printed_tables_are_at_most_100_characters_wide(capsys):
    """Issue 47: 06's tables were 150-370 characters wide. The notebook's show() puts the
    columns of a wider table in parts, each led by the first column, and nothing is lost."""
    setup = next(c for c in _cells() if "def show(" in c)
    scope: dict = {}
    exec(setup[setup.index("def show("):setup.index("t_start")].replace("textwrap.", "__import__('textwrap')."),
         scope)
    header = ["case"] + [f"column {j}" for j in range(12)]
    rows = [["random, CF = 1.25"] + [f"[{j}, {j + 1}, {j + 2}]" for j in range(12)], ["x"] * 13]
    scope["show"](header, rows)
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 100 and sum(line.startswith("-") for line in lines) >= 2
    for j in range(12):
        assert sum(bool(re.search(rf"column {j}\b", line)) for line in lines) == 1
        assert any(rows[0][j + 1] in line for line in lines)
    scope["show"](["a", "b"], [[1, 2]])                          # a narrow one stays one table
    assert capsys.readouterr().out.splitlines() == ["a  b", "-  -", "1  2"]
    scope["say"]("word " * 60)
    assert max(map(len, capsys.readouterr().out.splitlines())) <= 100
