"""The ring's compute/communication timeline, drawn from a real run's timestamps.

Input: round records as :func:`lesson10.runs.timeline.record_ring_timeline` returns them
(``rank``, ``phase``, ``round``, ``compute_start/_end``, ``send_start/_end`` in seconds, the
transfer posted in round ``k`` carrying the K/V block of round ``k + 1``). One row per rank:
the block attention of each round in blue over its K/V transfer in aqua; where the two bars
overlap in time, the transfer hides behind the compute. A transfer's bar ends when the rank's
wait on it returned (after that round's compute, with overlap): the bytes arrived then or
earlier, so the bar is an upper bound of the transfer, and the gap after the blue bar is
what the compute did not hide.
"""
from __future__ import annotations

from matplotlib.figure import Figure

from .kit import COLORS

__all__ = ["draw_ring_timeline", "timeline_problems", "by_rank"]


def by_rank(events: list[dict], phase: str = "forward") -> dict[int, list[dict]]:
    """rank -> its round records of ``phase``, in recorded order."""
    out: dict[int, list[dict]] = {}
    for e in events:
        if e["phase"] == phase:
            out.setdefault(e["rank"], []).append(e)
    if not out:
        raise ValueError(f"no {phase!r} rounds among the {len(events)} records: record them "
                         f"with ring_options(timings=[...]) around the ring attention call")
    return out


def _round_problems(rank: int, rounds: list[dict], overlap: bool) -> list[str]:
    """What is wrong with one rank's rounds (see :func:`timeline_problems`)."""
    bad = []
    n = len(rounds)
    if [r["round"] for r in rounds] != list(range(n)):
        bad.append(f"rank {rank}: rounds {[r['round'] for r in rounds]}, not 0..{n - 1} in order")
    for k, r in enumerate(rounds):
        if not r["compute_start"] <= r["compute_end"]:
            bad.append(f"rank {rank} round {k}: the compute ends before it starts")
        if k and r["compute_start"] < rounds[k - 1]["compute_end"]:
            bad.append(f"rank {rank} round {k}: the compute starts before round {k - 1}'s ended")
        sent = r["send_start"] is not None
        if sent != (k < n - 1):
            bad.append(f"rank {rank} round {k}: " + ("a transfer in the last round" if sent
                                                     else "no transfer before the last round"))
        if not sent:
            continue
        if not r["send_start"] <= r["send_end"]:
            bad.append(f"rank {rank} round {k}: the transfer ends before it starts")
        hides = r["send_start"] < r["compute_end"] and r["compute_start"] < r["send_end"]
        if overlap and not hides:
            bad.append(f"rank {rank} round {k}: the transfer of round {k + 1}'s block does not "
                       f"overlap round {k}'s compute")
        if not overlap and r["send_end"] > r["compute_start"]:
            bad.append(f"rank {rank} round {k}: without overlap the transfer must end first")
    return bad


def timeline_problems(events: list[dict], overlap: bool = True, phase: str = "forward") -> list[str]:
    """Consistency of a recorded timeline, times not judged: every rank has rounds
    ``0..N_c-1`` in order, each interval ends after it starts, the compute of round ``k``
    starts after round ``k-1``'s, rounds ``0..N_c-2`` post a transfer and the last does not;
    with ``overlap`` the transfer posted in round ``k`` overlaps round ``k``'s compute, without
    it that transfer ends before the compute starts. Returns one line per problem ([] if none)."""
    ranks = by_rank(events, phase)
    bad = []
    if sorted(ranks) != list(range(len(ranks))):
        bad.append(f"ranks {sorted(ranks)}, not 0..{len(ranks) - 1}")
    if len({len(v) for v in ranks.values()}) != 1:
        bad.append(f"ranks recorded different round counts: { {r: len(v) for r, v in ranks.items()} }")
    for rank, rounds in sorted(ranks.items()):
        bad += _round_problems(rank, rounds, overlap)
    return bad


def draw_ring_timeline(events: list[dict], fig: Figure | None = None, phase: str = "forward",
                       title: str = "") -> Figure:
    """Per rank (a row) and per round: compute (blue, upper bar) and the K/V transfer it
    overlaps (aqua, lower bar), on one time axis in milliseconds."""
    ranks = by_rank(events, phase)
    fig = fig if fig is not None else Figure(figsize=(8, 0.9 + 0.7 * len(ranks)))
    fig.clear()
    fig.subplots_adjust(left=0.11, right=0.98, bottom=0.3, top=0.85)
    ax = fig.add_subplot(1, 1, 1)
    for row, (_rank, rounds) in enumerate(sorted(ranks.items())):
        y = len(ranks) - 1 - row
        for r in rounds:
            c0, c1 = 1e3 * r["compute_start"], 1e3 * r["compute_end"]
            ax.broken_barh([(c0, c1 - c0)], (y + 0.05, 0.4), color=COLORS["computed"],
                          edgecolor="white", linewidth=1)
            ax.text((c0 + c1) / 2, y + 0.25, str(r["round"]), ha="center", va="center",
                    color="white", fontsize=8)
            if r["send_start"] is not None:
                s0, s1 = 1e3 * r["send_start"], 1e3 * r["send_end"]
                ax.broken_barh([(s0, s1 - s0)], (y - 0.4, 0.4), color=COLORS["comm"],
                              edgecolor="white", linewidth=1)
    ax.set_yticks([len(ranks) - 1 - i + 0.05 for i in range(len(ranks))],
                  [f"rank {r}" for r in sorted(ranks)])
    ax.set_xlabel("time since the ranks left a barrier (ms)")
    ax.set_title(title or f"ring attention, {phase}: compute (blue, round number) over the "
                 f"transfer of the next round's K/V (aqua)", fontsize=9)
    return fig
