"""Notebook 06's two exercises (issue 31): each check rejects the known-wrong answers of
tests/answers_06.py with the hint that names the mistake, and accepts the solutions.

One launch of 3 ranks runs every answer (the ranks import tests/answers_06.py as the student's
module); the judges then read the reports here. The ring needs 3 ranks: on 2 the next and the
previous rank are the same, so a ring sent the wrong way would pass."""
from __future__ import annotations

import linecache
import os

import pytest

pytest.importorskip("torch")

import answers_06 as A

from lesson10.checks import CheckFailed
from lesson10.checks import nb06_multiprocess as nb06

RING = {"ring_shift": None, "ring_shift_group_peer": None, "ring_shift_wrong_way": "direction",
        "ring_shift_no_wait": "no_wait", "ring_shift_group_ranks_as_peers": "global",
        "ring_shift_into_x": "input", "ring_shift_send_only": "pair", "ring_shift_stub": "stub",
        "ring_shift_fails_on_rank_0": "raised"}
SP = {"GatherFromSP": None, "GatherAllReduceBackward": "all_reduce", "GatherFullGradient": "grad_count",
      "GatherNoSum": "no_sum", "GatherWrongChunk": "other_chunk", "GatherOneGradient": "grad_count",
      "GatherBatchDim": "out_shape", "GatherStub": "stub", "GatherFailsOnRank0": "raised"}


@pytest.fixture(scope="module")
def reports():
    from lesson10.spmd.launch import launch
    jobs = [("ring", A.__file__, name) for name in RING] + [("sp", A.__file__, name) for name in SP]
    outs = launch(A.judge_on_ranks, 3, jobs, backend="gloo", timeout=nb06.launch_timeout(120), quiet=True)
    return {name: [o[i] for o in outs] for i, (_, _, name) in enumerate(jobs)}


def _first_problem(per_rank, ring: bool):
    reps = [r for cases in per_rank for r in cases if r is not None] if ring else per_rank
    return next((r["problem"] for r in reps if r["problem"] is not None), None)


@pytest.mark.parametrize("name", sorted(RING) + sorted(SP))
def test_each_answer_gets_its_verdict(reports, name):
    """The solutions pass; each wrong answer fails with the hint of its mistake."""
    ring = name in RING
    expected = RING[name] if ring else SP[name]
    judge, hints = (nb06.judge_ring_shift, nb06._RING_HINTS) if ring else (nb06.judge_gather, nb06._SP_HINTS)
    assert _first_problem(reports[name], ring=ring) == expected
    if expected is None:
        text = judge(reports[name])
        assert "passes on 3 ranks" in text
        assert ring or ("forward: all_gather" in text and "backward: reduce_scatter" in text)
    elif expected == "stub":
        with pytest.raises(NotImplementedError):
            judge(reports[name])
    else:
        with pytest.raises(CheckFailed) as info:
            judge(reports[name])
        assert f"hint: {hints[expected]}" in str(info.value)


def test_an_all_reduce_backward_is_named_with_its_bytes(reports):
    """The values of an all-reduce backward are right: only the bytes tell it apart."""
    rep = next(r for r in reports["GatherAllReduceBackward"] if r["problem"])
    assert "the values are right" in rep["what"] and "all_reduce of" in rep["what"]
    good = reports["GatherFromSP"][0]["ops"]
    assert "reduce_scatter of" in good and "all_reduce" not in good


@pytest.mark.parametrize("name", ["ring_shift_fails_on_rank_0", "GatherFailsOnRank0"])
def test_a_rank_that_raises_alone_does_not_leave_the_others_waiting(reports, name):
    """It makes the right calls it still owes, so its neighbours finish with right values (and
    the launch returns)."""
    first = [rep[0] if isinstance(rep, list) else rep for rep in reports[name]]
    assert [r["problem"] for r in first] == ["raised", None, None]
    assert "ValueError: only rank 0 fails" in first[0]["what"]


def test_a_forgotten_wait_leaves_the_received_tensor_empty(reports):
    rep = reports["ring_shift_no_wait"][0][0]
    assert rep["what"] == "2 of the 2 requests were never waited for"


def _cell(text: str, number: int):
    """Run ``text`` as IPython runs a cell: its source in linecache under a made-up file name."""
    filename = f"<nb06-test-cell-{number}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    scope: dict = {}
    exec(compile(text, filename, "exec"), scope)
    return scope


def test_module_source_takes_a_cells_imports_and_definition_only():
    cell = ("import math\nfrom functools import reduce\n\n"
            "class Twice:\n    @staticmethod\n    def forward(ctx, x):\n        return 2 * x\n\n"
            "def helper():\n    return math.pi\n\nprint('a call the ranks must not run')\n")
    scope = _cell(cell, 1)
    src = nb06.module_source(scope["Twice"])
    assert "import math" in src and "from functools import reduce" in src and "import torch" in src
    assert "class Twice" in src and "def helper" not in src and "print(" not in src
    assert "def helper():" in nb06.module_source(scope["helper"])


def test_module_source_refuses_a_definition_not_at_the_top_of_its_cell():
    scope = _cell("def outer():\n    def ring_shift(x):\n        return x\n    return ring_shift\n", 2)
    with pytest.raises(ValueError, match="not at the top level"):
        nb06.module_source(scope["outer"]())


def test_a_stub_is_not_attempted_without_starting_ranks():
    scope = _cell('def ring_shift(x, group=None):\n    raise NotImplementedError("your code here: '
                  'replace this line")\n', 3)
    with pytest.raises(CheckFailed, match="still raises NotImplementedError"):
        nb06.check_ring_shift(scope["ring_shift"])


@pytest.mark.parametrize("load, cores, factor", [(0.0, 2, 3.0), (1.0, 2, 3.0), (8.0, 2, 9.0), (4.0, 16, 3.0)])
def test_launch_timeout_grows_with_the_load_and_never_falls_below_three_times(monkeypatch, load, cores, factor):
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    assert nb06.launch_timeout(60) == pytest.approx(60 * factor)


def test_ranks_that_hang_or_die_end_in_a_verdict(monkeypatch):
    """A launch that timed out or lost a rank is a failed check with a hint, not a traceback."""
    import importlib
    launch_module = importlib.import_module("lesson10.spmd.launch")   # the module (spmd's launch is the function)
    scope = _cell("def ring_shift(x, group=None):\n    return x\n", 4)

    def hangs(*args, timeout, **kwargs):
        raise launch_module.LaunchTimeout(timeout, [1, 2])

    def dies(*args, **kwargs):
        raise launch_module.RankError(2, "ProcessDied", "rank 2 exited (exit code 1)\n")

    monkeypatch.setattr(launch_module, "launch", hangs)
    with pytest.raises(CheckFailed, match="did not finish within .* s") as info:
        nb06.check_ring_shift(scope["ring_shift"])
    assert "hint: a rank waits for a message no rank sends" in str(info.value)
    monkeypatch.setattr(launch_module, "launch", dies)
    with pytest.raises(CheckFailed, match="rank 2: the rank stopped: ProcessDied"):
        nb06.check_ring_shift(scope["ring_shift"])


@pytest.mark.parametrize("load, timings, says", [
    (0.4, [[0.100, 0.104, 0.110]], ""),                            # quiet: 2 cores, 10 % spread
    (1.6, [[0.100, 0.104, 0.110]], "load 1.6 on 2 core(s)"),       # other work on the cores
    (0.0, [[0.100, 0.104, 0.110], [0.090, 0.200, 0.100]], "repeated timings 110% apart"),
    (3.0, [[0.1, 0.3]], "load 3.0 on 2 core(s); repeated timings 67% apart"),
    (0.0, [[], [0.1]], ""),                                        # nothing to compare
])
def test_busy_reason_names_the_load_and_the_spread_of_repeated_timings(monkeypatch, load, timings, says):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert nb06.busy_reason(load, *timings) == says
    monkeypatch.setattr(os, "getloadavg", lambda: (load, 0.0, 0.0), raising=False)
    assert nb06.busy_reason(None, *timings) == says              # the load read now
