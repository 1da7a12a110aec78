"""The ring's per-round timeline (lesson10.runs.timeline, lesson10.figures.timeline): a real
run on 2 gloo ranks records consistent events, with and without overlap, and the consistency
check rejects broken ones. No time is asserted, only the order of the events."""
from __future__ import annotations

import copy

import pytest
from matplotlib.figure import Figure

from lesson10.figures.timeline import by_rank, draw_ring_timeline, timeline_problems
from lesson10.runs.timeline import TIMES, ring_timelines
from lesson10.spmd.launch import launch

N = 2
CASES = [dict(s=64, a=2, d=8, backward=True), dict(s=64, a=2, d=8, overlap=False),
         dict(s=64, a=2, d=8, layout="contiguous")]


@pytest.fixture(scope="module")
def runs():
    """Per case: every rank's round records, rank by rank (one launch for all cases)."""
    per_rank = launch(ring_timelines, N, CASES, timeout=600, quiet=True)
    return [[r for rank in per_rank for r in rank[i]] for i in range(len(CASES))]


def test_a_real_run_records_every_rank_and_round_in_order(runs):
    for case, events in zip(CASES, runs):
        phases = ("forward", "backward") if case.get("backward") else ("forward",)
        assert {e["phase"] for e in events} == set(phases)
        for phase in phases:
            ranks = by_rank(events, phase)
            assert sorted(ranks) == list(range(N))
            for rounds in ranks.values():
                assert [r["round"] for r in rounds] == list(range(N))
                assert rounds[-1]["send_start"] is None and rounds[0]["send_start"] is not None
            assert timeline_problems(events, case.get("overlap", True), phase) == [], (case, phase)


def test_with_overlap_the_next_blocks_transfer_spans_the_compute(runs):
    """The transfer posted in round k (round k+1's block) overlaps round k's compute with
    overlap on; with it off, that transfer ends before the compute starts."""
    on, off = runs[0], runs[1]
    for e in by_rank(on)[0][:-1] + by_rank(on)[1][:-1]:
        assert e["send_start"] <= e["compute_start"] < e["compute_end"] <= e["send_end"]
    for e in by_rank(off)[0][:-1] + by_rank(off)[1][:-1]:
        assert e["send_end"] <= e["compute_start"]
    assert timeline_problems(off, overlap=True)          # no overlap is seen as none
    assert timeline_problems(on, overlap=False)


def _broken(events, how):
    ev = copy.deepcopy(events)
    rank0 = [e for e in ev if e["rank"] == 0 and e["phase"] == "forward"]
    if how == "rounds swapped":
        rank0[0]["round"], rank0[1]["round"] = 1, 0
    elif how == "interval reversed":
        rank0[0]["compute_start"], rank0[0]["compute_end"] = rank0[0]["compute_end"] + 1, 0.0
    elif how == "no transfer":
        rank0[0]["send_start"] = rank0[0]["send_end"] = None
    elif how == "transfer in the last round":
        rank0[-1]["send_start"], rank0[-1]["send_end"] = rank0[-1]["compute_start"], rank0[-1]["compute_end"]
    elif how == "transfer after the compute":
        rank0[0]["send_start"] = rank0[0]["compute_end"] + 1.0
        rank0[0]["send_end"] = rank0[0]["send_start"] + 1.0
    elif how == "a rank missing":
        ev = [e for e in ev if e["rank"] != 0]
    elif how == "a round missing":
        ev.remove(rank0[-1])
    return ev


@pytest.mark.parametrize("how", ["rounds swapped", "interval reversed", "no transfer",
                                 "transfer in the last round", "transfer after the compute",
                                 "a rank missing", "a round missing"])
def test_the_consistency_check_rejects_broken_timelines(runs, how):
    assert timeline_problems(runs[0]) == []
    assert timeline_problems(_broken(runs[0], how)), how


def test_the_timeline_draws_and_refuses_an_empty_record(runs):
    fig = draw_ring_timeline(runs[2], Figure())
    ax = fig.axes[0]
    bars = [c for c in ax.collections]
    # one compute bar per rank and round, one transfer bar per rank and round but the last
    assert len(bars) == N * N + N * (N - 1)
    with pytest.raises(ValueError, match="ring_options"):
        draw_ring_timeline([e for e in runs[2] if e["phase"] == "backward"])


def test_times_are_relative_to_the_shared_barrier(runs):
    for e in runs[0]:
        for key in TIMES:
            assert e[key] is None or e[key] >= 0.0
