"""``python -m lesson10 bench figures``: how long one redraw of each interactive figure takes.

A redraw is what a student waits for after moving a control: the figure's draw function
into the figure the widget keeps, then the PNG its Image shows (``View.update``). Each
figure is moved through a few typical changes of its controls, round-robin, ``--reps``
times each after one warm-up (``moves``: what moving the controls back and forth costs);
then each change once more after the view forgot every structure it drew (``first visit``:
a structure not seen before: the ring and Ulysses figures move their axes there, the others
build their figure again; texts drawn before are pasted from the renderer's text cache, as in
a session). The table gives the median and the 90th percentile of the
moves, the machine's load (``os.getloadavg``, 1 minute) around each figure's run, and the
first-visit median; it writes ``benchmarks/results/figures.md`` (+ ``.csv``). The goal: a
median of at most 100 ms and a 90th percentile of at most 200 ms on the 2-core development
machine, with the test suite running beside it. Sliders redraw on release, so a drag costs
one redraw, not one per step. No torch, no Jupyter: the widgets are built headless.

``cold``: what a fresh figure costs, ``draw_<name>(**params)`` (a new Figure, no widget) then
``kit.png`` of it, in a warm process (one call of each setting first), for a few settings of
each figure (``COLD``), round-robin, ``--reps`` times each. Each call is timed with the kept
backgrounds of :mod:`lesson10.figures.fresh` (``cold``) and, interleaved so both see the same
load, without them (``cold, no cache``: every fresh figure drawn whole); the load beside is
the 1-minute load around that part of the run. Goal: a cold median of at most 100 ms.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

from lesson10.bench.paths import RESULTS_DIR

TARGET_MEDIAN_MS, TARGET_P90_MS = 100, 200

Move = dict[str, object]

#: figure -> (constructor keyword arguments, control changes to time, round-robin)
MOVES: dict[str, tuple[dict[str, object], list[Move]]] = {
    "ring_rounds": ({}, [dict(round=1), dict(round=2), dict(round=3), dict(layout="zigzag", round=0),
                         dict(round=1), dict(n=8, s=64, round=0), dict(n=4, s=16, layout="contiguous", round=0)]),
    "sp_strip": ({}, [dict(t=2), dict(sp=True), dict(t=8), dict(t=16), dict(sp=False, t=4)]),
    "block_size": ({}, [dict(c=1024), dict(c=60_000), dict(g=4), dict(causal=True), dict(F=500e12),
                        dict(link="NVLink", g=1, causal=False, F=None), dict(link="InfiniBand", c=16_384)]),
    "ulysses_grid": ({}, [dict(state="heads", arrived=True), dict(rank=2), dict(kv_heads=2),
                          dict(rank=3), dict(state="sequence", rank=0, kv_heads=8)]),
    "moe_capacity": ({}, [dict(skew=1.0), dict(skew=3.0), dict(capacity_factor=None), dict(skew=6.0),
                          dict(capacity_factor=1.25, skew=0.0)]),
}


#: figure -> draw keyword arguments of the fresh figures timed by :func:`cold`, round-robin
COLD: dict[str, list[dict[str, object]]] = {
    "ring_rounds": [dict(round=1), dict(round=3), dict(layout="zigzag", round=2)],
    "sp_strip": [dict(t=8, sp=True), dict(t=2), dict(t=4, sp=True)],
    "block_size": [dict(c=4096), dict(c=60_000, g=4), dict(causal=True)],
    "ulysses_grid": [dict(), dict(state="heads", rank=2), dict(kv_heads=2, rank=3)],
    "moe_capacity": [dict(skew=3.0), dict(skew=3.25), dict(skew=3.0, capacity_factor=None)],
}


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def _time(view, change) -> float:
    t0 = time.perf_counter()
    ok = view.update(**change)
    ms = (time.perf_counter() - t0) * 1e3
    if not ok:
        raise RuntimeError(f"{change} does not draw: {view.message.value}")
    return ms


def measure(name: str, reps: int) -> dict:
    """Milliseconds of each timed redraw of figure ``name`` (``moves``, ``first``) and the
    load before and after (``load``)."""
    from lesson10 import figures
    kwargs, moves = MOVES[name]
    view = getattr(figures, name)(**kwargs).view
    load = [_load()]
    for change in moves:                       # warm-up: fonts, caches
        view.update(**change)
    out = [_time(view, change) for _ in range(reps) for change in moves]
    first = []
    for change in moves:
        view.forget()
        first.append(_time(view, change))
    load.append(_load())
    return {"moves": out, "first": first, "load": load}


def cold(name: str, reps: int) -> dict:
    """Milliseconds of each fresh figure of ``name`` (``draw_<name>(**params)`` then
    ``kit.png``) with the kept backgrounds (``on``) and without (``off``), and the load."""
    from lesson10 import figures
    from lesson10.figures import fresh, kit
    draw = getattr(figures, f"draw_{name}")

    def once(params) -> float:
        t0 = time.perf_counter()
        kit.png(draw(**params))
        return (time.perf_counter() - t0) * 1e3

    was = fresh.ENABLED
    out: dict[bool, list[float]] = {True: [], False: []}
    load = [_load()]
    try:
        for params in COLD[name]:               # warm-up: fonts, texts, kept backgrounds
            fresh.ENABLED = True
            once(params)
        for _ in range(reps):
            for params in COLD[name]:
                for enabled in (True, False):
                    fresh.ENABLED = enabled
                    out[enabled].append(once(params))
    finally:
        fresh.ENABLED = was
    load.append(_load())
    return {"on": out[True], "off": out[False], "load": load}


def percentile(values, q: float) -> float:
    """The ``q``-quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def table(rows, load_start: float) -> tuple[str, str]:
    """The markdown report and the CSV of ``rows`` = [(name, measure(...) and cold(...)), ...]."""
    calls = len(rows[0][1]["on"]) if rows else 0
    lines = ["# Figures: one redraw (draw + PNG) after a control moves, and a fresh figure", "",
             f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
             f"load {load_start:.1f} at the start (1-minute `os.getloadavg`; the machine is shared, "
             f"so each row gives the load around its run). Goal: median <= {TARGET_MEDIAN_MS} ms and "
             f"p90 <= {TARGET_P90_MS} ms over the moves. *First visit*: the same changes after the view "
             f"forgot every structure it drew (a structure not seen before), for reference. *Cold*: a "
             f"fresh figure, `draw_*(fig=None, ...)` then `kit.png`, median over {calls} calls with the kept "
             f"backgrounds of `lesson10.figures.fresh` and, interleaved, without them (*no cache*: drawn "
             f"whole); goal: cold median <= {TARGET_MEDIAN_MS} ms.", "",
             "| figure | redraws | median (ms) | p90 (ms) | load | within goal | first visit median (ms) "
             "| cold median (ms) | cold, no cache (ms) | cold load | cold within goal |",
             "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---|"]
    csv = ["figure,redraws,median_ms,p90_ms,load_start,load_end,first_visit_median_ms,"
           "cold_median_ms,cold_no_cache_median_ms,cold_load_start,cold_load_end"]
    for name, m in rows:
        med, p90, first = statistics.median(m["moves"]), percentile(m["moves"], 0.9), statistics.median(m["first"])
        ok = med <= TARGET_MEDIAN_MS and p90 <= TARGET_P90_MS
        lo, hi = m["load"]
        on, off = statistics.median(m["on"]), statistics.median(m["off"])
        clo, chi = m["cold_load"]
        lines.append(f"| {name} | {len(m['moves'])} | {med:.0f} | {p90:.0f} | {lo:.1f}–{hi:.1f} | "
                     f"{'yes' if ok else 'no'} | {first:.0f} | {on:.0f} | {off:.0f} | {clo:.1f}–{chi:.1f} | "
                     f"{'yes' if on <= TARGET_MEDIAN_MS else 'no'} |")
        csv.append(f"{name},{len(m['moves'])},{med:.1f},{p90:.1f},{lo:.2f},{hi:.2f},{first:.1f},"
                   f"{on:.1f},{off:.1f},{clo:.2f},{chi:.2f}")
    return "\n".join(lines) + "\n", "\n".join(csv) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m lesson10 bench figures",
                                description="median and 90th percentile redraw time of each interactive figure")
    p.add_argument("--reps", type=int, default=5, help="rounds of every control change")
    p.add_argument("--out", default=str(RESULTS_DIR), help="folder for the table")
    p.add_argument("--only", nargs="*", choices=sorted(MOVES), default=None)
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be at least 1")
    os.environ.setdefault("MPLBACKEND", "Agg")
    load_start = _load()
    rows = []
    for name in args.only or list(MOVES):
        m = cold(name, args.reps)
        rows.append((name, {**measure(name, args.reps), "on": m["on"], "off": m["off"], "cold_load": m["load"]}))
    text, csv = table(rows, load_start)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "figures.md").write_text(text, encoding="utf-8")
    (out / "figures.csv").write_text(csv, encoding="utf-8")
    return 0
