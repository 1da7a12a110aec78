"""``python -m lesson10 bench figures``: how long one redraw of each interactive figure takes.

A redraw is what a student waits for after moving a control: the figure's draw function
into the figure the widget keeps, then the PNG its Image shows (``_View.update``). Each
figure is moved through a few typical changes of its controls, round-robin, ``--reps``
times each after one warm-up; the table gives the median and the 90th percentile per
figure and writes ``benchmarks/results/figures.md`` (+ ``.csv``). The target is a median of
at most 150 ms on the 2-core development machine. Sliders redraw on release, so a drag
costs one redraw, not one per step. No torch, no Jupyter: the widgets are built headless.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

from . import RESULTS_DIR

TARGET_MS = 150

#: figure -> (constructor keyword arguments, control changes to time, round-robin)
MOVES = {
    "ring_rounds": ({}, [dict(round=1), dict(round=2), dict(layout="zigzag", round=0),
                         dict(n=8, s=64, round=0), dict(n=4, s=16, layout="contiguous", round=0)]),
    "sp_strip": ({}, [dict(t=2), dict(sp=True), dict(t=8), dict(sp=False, t=4)]),
    "block_size": ({}, [dict(c=1024), dict(c=60_000), dict(g=4), dict(causal=True),
                        dict(link="NVLink", g=1, causal=False)]),
    "ulysses_grid": ({}, [dict(state="heads", arrived=True), dict(rank=2), dict(kv_heads=2),
                          dict(state="sequence", rank=0, kv_heads=8)]),
    "moe_capacity": ({}, [dict(skew=1.0), dict(skew=3.0), dict(capacity_factor=None),
                          dict(capacity_factor=1.25, skew=0.0)]),
}


def measure(name: str, reps: int) -> list[float]:
    """Milliseconds of each timed redraw of figure ``name``."""
    from .. import figures
    kwargs, moves = MOVES[name]
    view = getattr(figures, name)(**kwargs).view
    for change in moves:                       # warm-up: fonts, caches
        view.update(**change)
    out = []
    for _ in range(reps):
        for change in moves:
            t0 = time.perf_counter()
            assert view.update(**change), (name, change, view.message.value)
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lesson10 bench figures",
                                description="median redraw time of each interactive figure")
    p.add_argument("--reps", type=int, default=5, help="rounds of every control change")
    p.add_argument("--out", default=str(RESULTS_DIR), help="folder for the table")
    p.add_argument("--only", nargs="*", choices=sorted(MOVES), default=None)
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be at least 1")
    os.environ.setdefault("MPLBACKEND", "Agg")
    rows = []
    for name in args.only or list(MOVES):
        times = sorted(measure(name, args.reps))
        p90 = times[min(len(times) - 1, int(round(0.9 * (len(times) - 1))))]
        rows.append((name, len(times), statistics.median(times), p90))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = ["# Figures: one redraw (draw + PNG) after a control moves", "",
             f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
             f"load {load:.1f} at the start; target: median <= {TARGET_MS} ms.", "",
             "| figure | redraws | median (ms) | p90 (ms) | within target |",
             "|---|---:|---:|---:|---|"]
    csv = ["figure,redraws,median_ms,p90_ms"]
    for name, n, med, p90 in rows:
        lines.append(f"| {name} | {n} | {med:.0f} | {p90:.0f} | {'yes' if med <= TARGET_MS else 'no'} |")
        csv.append(f"{name},{n},{med:.1f},{p90:.1f}")
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "figures.md").write_text(text, encoding="utf-8")
    (out / "figures.csv").write_text("\n".join(csv) + "\n", encoding="utf-8")
    return 0
