"""The teaching order of notebooks 01-05 (issue 31): the picture before the exercises, every
prediction written before its reveal, exercise texts a student reads in a minute, one note
on how the checks work, the time each notebook takes, and the lesson page's synthesis as
cells that compute."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ["01_sequence_parallel", "02_ring_attention", "03_load_balance", "04_ulysses",
             "05_moe_dispatch"]
#: words of the grader's specification, which belong in "How this is checked" only
GRADER_WORDS = re.compile(r"secret|substitut|\bchecks?\b|grader|offset|refuse|hidden case|watches",
                          re.I)
QUESTION = re.compile(r"^\*\*(Predict first|Quick check)", re.M)


def _cells(name: str, folder: str = "solutions") -> list[dict]:
    nb = json.loads((ROOT / folder / f"{name}.ipynb").read_text(encoding="utf-8"))
    return [{"type": c["cell_type"], "source": "".join(c["source"])} for c in nb["cells"]]


def _exercises(cells):
    """(cell index, text) of every exercise text; each must be a cell of its own."""
    out = []
    for i, c in enumerate(cells):
        if c["type"] == "markdown" and "### Exercise" in c["source"]:
            assert c["source"].startswith("### Exercise"), (i, "an exercise text is a cell of its own")
            out.append((i, c["source"]))
    return out


def _functions(cells):
    """The exercise functions in the order the notebook defines them."""
    out = []
    for c in cells:
        if c["type"] == "code" and "### BEGIN SOLUTION" in c["source"]:
            tree = ast.parse(c["source"])
            out.append(next(n.name for n in tree.body if isinstance(n, ast.FunctionDef)))
    return out


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_exercise_texts_are_short_and_free_of_grader_words(name):
    exercises = _exercises(_cells(name))
    assert len(exercises) >= 3, name
    for i, text in exercises:
        words = len(text.split())
        assert words <= 250, (name, i, words)
        assert not GRADER_WORDS.search(text), (name, i, GRADER_WORDS.search(text).group(0))
        assert "Example" in text, (name, i, "one small example")


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_one_note_says_how_the_checks_work_before_the_first_exercise(name):
    cells = _cells(name)
    notes = [i for i, c in enumerate(cells) if c["type"] == "markdown"
             and c["source"].startswith("### How this is checked")]
    assert len(notes) == 1, name
    assert notes[0] < _exercises(cells)[0][0]
    assert len(cells[notes[0]]["source"].split()) <= 350, "a short note"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_picture_comes_before_the_exercises(name):
    cells = _cells(name)
    first_figure = next(i for i, c in enumerate(cells)
                        if c["type"] == "code" and re.search(r"\bfigures\.\w+\(", c["source"]))
    assert first_figure < _exercises(cells)[0][0], name
    assert "**The picture.**" in cells[first_figure - 1]["source"], "the figure is introduced"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_every_prediction_is_written_before_its_reveal(name):
    cells = _cells(name)
    questions = [i for i, c in enumerate(cells) if c["type"] == "markdown" and QUESTION.search(c["source"])]
    assert len(questions) >= 4, name
    for i in questions:
        ask = cells[i + 1]
        assert ask["type"] == "code" and re.search(r"^my_prediction = None$", ask["source"], re.M), \
            (name, i, "the cell after the question takes the prediction")
        assert "predict.reveal" not in ask["source"]
        rest = cells[i + 2:]
        end = next((j for j, c in enumerate(rest) if c["type"] == "markdown" and QUESTION.search(c["source"])),
                   len(rest))
        assert any("predict.reveal(my_prediction" in c["source"] for c in rest[:end] if c["type"] == "code"), \
            (name, i, "a later cell compares the prediction with the truth")
    # and no reveal without its question
    reveals = [i for i, c in enumerate(cells) if c["type"] == "code" and "predict.reveal(" in c["source"]]
    assert len(reveals) == len(questions), name


def test_the_pages_predict_first_three_and_the_quick_check_are_predictions():
    cells = _cells("05_moe_dispatch")
    text = [c["source"] for c in cells]
    three = next(i for i, s in enumerate(text) if "predict-first question 3" in s)
    assert "my_prediction = None" in text[three + 1] and "moe_expert_flops" in text[three + 2]
    quick = next(i for i, s in enumerate(text) if s.startswith("**Quick check**") and "twice the mean load" in s)
    assert "my_prediction = None" in text[quick + 1] and "predict.reveal" in text[quick + 2]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_time_is_stated_at_the_top(name):
    top = _cells(name)[0]["source"]
    m = re.search(r"\*\*Time:\*\* about (\d+) minutes for a strong student, (\d+) for an average one", top)
    assert m and int(m.group(1)) < int(m.group(2)), name
    assert "exact integers" not in top and "hidden cases" not in top


LEVEL = re.compile(r"\n\n\*Level ([123]) of 3, about (\d+) minutes\.\*$")


def _levels(name):
    """(level of 3, minutes) that each exercise text states on its last line, in order."""
    out = []
    for i, text in _exercises(_cells(name)):
        m = LEVEL.search(text)
        assert m, (name, i, "an exercise text ends with its level and minutes")
        out.append((int(m.group(1)), int(m.group(2))))
    return out


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_each_notebook_states_its_ramp_easiest_first_hardest_last(name):
    """The difficulty order is stated in the texts (a level of 3 per exercise) and holds: the
    first exercise is of the notebook's lowest level, the last of its highest, and the
    notebook does climb."""
    levels = [lv for lv, _ in _levels(name)]
    assert levels[0] == min(levels) and levels[-1] == max(levels) and max(levels) > min(levels), \
        (name, levels)
    assert all(0 < minutes <= 20 for _, minutes in _levels(name)), name


GOING_FURTHER = "## Going further"
TIME = re.compile(r"\*\*Time:\*\* about (\d+) minutes for a strong student, (\d+) for an average "
                  r"one[^*]*?\*Going further\* part adds about (\d+) minutes")


def _parts(name):
    """(core cells, Going further cells): the optional part runs from its heading to the
    closing "Where you stand"."""
    cells = _cells(name)
    start = next(i for i, c in enumerate(cells) if c["type"] == "markdown"
                 and c["source"].startswith(GOING_FURTHER))
    end = next(i for i, c in enumerate(cells) if c["type"] == "markdown"
               and c["source"].startswith("## Where you stand"))
    assert start < end, name
    return cells[:start] + cells[end:], cells[start:end]


def _estimate(cells) -> float:
    """Average-student minutes: markdown at 200 words a minute, 1 per prediction, plus the
    minutes the exercises state (the rule the notebooks' tops quote)."""
    words = sum(len(c["source"].split()) for c in cells if c["type"] == "markdown")
    predictions = sum(c["type"] == "code" and "my_prediction = None" in c["source"] for c in cells)
    exercises = [LEVEL.search(c["source"]) for c in cells
                 if c["type"] == "markdown" and c["source"].startswith("### Exercise")]
    return words / 200 + predictions + sum(int(m.group(2)) for m in exercises)


def _stated(name):
    top = _cells(name)[0]["source"]
    m = TIME.search(top)
    assert m and "200 words a minute" in top, name
    return tuple(int(g) for g in m.groups())


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_stated_time_follows_the_stated_rule(name):
    """The top states the minutes of the exercises and what comes before them (strong and
    average student), and separately those of the optional *Going further* part."""
    strong, average, further = _stated(name)
    core, optional = _parts(name)
    assert _estimate(core) <= average <= _estimate(core) + 10, (name, average, _estimate(core))
    assert strong <= 0.7 * average, name
    assert _estimate(optional) - 3 <= further <= _estimate(optional) + 5, \
        (name, further, _estimate(optional))


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_going_further_holds_no_exercise_and_says_it_is_optional(name):
    core, optional = _parts(name)
    assert len(_exercises(core)) == len(_exercises(_cells(name)))
    assert not any("### BEGIN SOLUTION" in c["source"] or "checks.check_" in c["source"]
                   for c in optional), name
    head = optional[0]["source"]
    assert "optional" in head.lower() and "not graded" in head.lower(), name


def test_the_readme_states_the_course_time_the_notebooks_add_up_to():
    average = sum(_stated(name)[1] for name in NOTEBOOKS)
    further = sum(_stated(name)[2] for name in NOTEBOOKS)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"01.05 take about (\d+) minutes for an average student, plus about (\d+) "
                  r"minutes of \*Going further\*", readme)
    assert m, "the README states the course's time"
    assert (int(m.group(1)), int(m.group(2))) == (average, further)


def test_the_last_exercise_of_03_asks_for_the_layout_not_its_recipe():
    """Zig-zag is the notebook's point: the student finds which late chunk partners chunk r
    (and checks it with causal_work); neither the text nor the section before gives it."""
    cells = _cells("03_load_balance")
    i, text = _exercises(cells)[-1]
    assert "`zigzag_positions`" in text and "causal_work" in text
    for c in cells[:i + 1]:
        assert "2N_c - 1 - r" not in c["source"] and "2n - 1 - r" not in c["source"]


def test_each_notebook_starts_easy_and_ends_hard_where_the_order_allows():
    assert _functions(_cells("01_sequence_parallel")) == ["reduce_scatter", "all_gather", "sp_bytes", "sp_forward"]
    assert _functions(_cells("02_ring_attention")) == ["merge", "block_attention", "ring_attention"]
    assert _functions(_cells("03_load_balance")) == ["ring_time", "causal_work", "zigzag_positions"]
    assert _functions(_cells("04_ulysses"))[-1] == "ulysses_attention"
    assert _functions(_cells("05_moe_dispatch"))[-1] == "moe_stats"


def test_the_contradictions_of_the_review_are_gone():
    one = dict(_exercises(_cells("01_sequence_parallel")))
    collectives = [t for t in one.values() if "reduce-scatter along" in t or "all-gather along" in t]
    assert len(collectives) == 2 and all("new array even when $t = 1$" in t for t in collectives)
    ring = next(t for _, t in _exercises(_cells("02_ring_attention")) if "ring loop" in t)
    assert "skip" in ring and "standard" in ring and "one K block and one V block" in ring
    capacity = next(t for _, t in _exercises(_cells("05_moe_dispatch")) if "capacity_keep" in t)
    assert "Fraction(str(capacity_factor))" in capacity and "`Fraction(1.1)`" in capacity
    for name in NOTEBOOKS:
        note = next(c["source"] for c in _cells(name) if c["source"].startswith("### How this is checked"))
        assert "float array of whole numbers passes" in note


def _all(name):
    return "\n".join(c["source"] for c in _cells(name))


def test_the_synthesis_of_the_page_is_computed():
    one, two, five = _all("01_sequence_parallel"), _all("02_ring_attention"), _all("05_moe_dispatch")
    assert "Closing the 73 GB" in one and "cost.activation_bytes(s // cp" in one
    assert "Memory against sequence length" in two and "plt.show()" in two.split("Memory against")[1]
    for part in ("Dropless MoE", "Fine-grained experts", "Overlapping the all-to-all", "broken_barh",
                 "Putting the axes together", '"TP": 8, "CP": 16, "PP": 16, "DP": 8',
                 "forgetting the CP sum", ".all_reduce(local)", "Expert gradients",
                 "Where these methods are used", "The methods side by side"):
        assert part in five, part
    table = five.split("The methods side by side")[1]
    for method in ('"SP (TP 8)"', '"ring / CP"', '"all-gather CP"', '"Ulysses"', '"USP 8 x 2"', '"EP 8 (top-2)"'):
        assert method in table, method
    for fn in ('cost.comm_bytes("sp"', 'cost.comm_bytes("ring"', 'cost.comm_bytes("allgather"',
               'cost.comm_bytes("ulysses"', "cost.usp_bytes(", "cost.moe_a2a_bytes("):
        assert fn in table, fn


def test_the_local_confusions_are_fixed():
    five = _cells("05_moe_dispatch")
    text = [c["source"] for c in five]
    mixtral = next(i for i, s in enumerate(text) if s.startswith("**Predict first.** A layer shaped like Mixtral's"))
    assert "d_ff = 2, 8192, 4096, 8, 14_336" in text[mixtral + 2], "the question sits next to its code"
    assert any("**Router skew**" in s for s in text)
    assert any(s.startswith("**Why the CF = 1.25 curve rises to 1.25, then falls") for s in text)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_exercise_notebooks_keep_the_same_order(name):
    """notebooks/ is built from solutions/: the same cells, so the same teaching order."""
    sol, ex = _cells(name), _cells(name, "notebooks")
    assert [c["type"] for c in sol] == [c["type"] for c in ex]
    assert [c["source"] for c in sol if c["type"] == "markdown"] == \
        [c["source"] for c in ex if c["type"] == "markdown"]
