"""The timing harness every benchmark shares: interleaved reps, the slowest rank, the
single-process baseline measured in the same launch, and the markdown tables.

A benchmark worker runs inside every rank (started by :func:`lesson10.spmd.launch`) and
hands :func:`interleaved` a ``step(cfg, state) -> seconds`` per config. Reps are
interleaved (rep 1 of every config, then rep 2, ...), so a change in the load of a
shared machine hits every config alike; each rep's time is that of the slowest rank,
because a parallel step ends when its last rank does. Results: medians.
"""
from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ..spmd.device import current_device, synchronize
from .paths import RESULTS_DIR

__all__ = ["RESULTS_DIR", "slowest", "timed", "interleaved", "one_process", "median",
           "md_table", "ms", "ratio", "machine_note", "write_table", "moe_tokens"]

def slowest(seconds: float) -> float:
    """The largest of every rank's ``seconds`` (one all-reduce)."""
    t = torch.tensor([seconds], dtype=torch.float64, device=current_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def timed(fn) -> float:
    """Run ``fn()`` on every rank after a barrier; the slowest rank's seconds."""
    dist.barrier()
    synchronize()
    t0 = time.perf_counter()
    fn()
    synchronize()
    return slowest(time.perf_counter() - t0)


def interleaved(configs: list, step, reps: int = 5, warmup: int = 1):
    """``step(cfg, state) -> seconds or None`` run ``warmup + reps`` times per config,
    interleaved. Returns ``(times, states)``: the timed seconds per config (after the
    warm-up; ``None`` answers are not timings) and each config's ``state`` dict."""
    states: list[dict] = [{} for _ in configs]
    times: list[list] = [[] for _ in configs]
    for i in range(warmup + reps):
        for j, cfg in enumerate(configs):
            t = step(cfg, states[j])
            if i >= warmup and t is not None:
                times[j].append(t)
    return times, states


def one_process(threads: int, fn, *args) -> float:
    """The single-process baseline inside a launch: rank 0 alone runs ``fn(*args) ->
    seconds`` with ``threads`` torch threads while the others wait; every rank returns it."""
    dist.barrier()
    t = 0.0
    if dist.get_rank() == 0:
        old = torch.get_num_threads()
        torch.set_num_threads(int(threads))
        try:
            t = fn(*args)
        finally:
            torch.set_num_threads(old)
    return slowest(t)


def median(times: list):
    return statistics.median(times) if times else None


def md_table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def ms(x) -> str:
    return f"{1e3 * x:.1f}"


def ratio(vals) -> float:
    """max / mean (1.0 for an all-zero list): the load imbalance."""
    m = sum(vals) / len(vals)
    return max(vals) / m if m > 0 else 1.0


def machine_note() -> str:
    return (f"cores on this machine: {os.cpu_count()}; torch {torch.__version__}; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


def write_table(md: Path, lines: list[str]) -> None:
    """Write a benchmark's markdown to ``md`` and print it."""
    md.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {md}")


def run_configs(worker, n: int, configs: list, args) -> list:
    """Rank 0's rows of ``worker(configs, args.reps)`` on ``n`` one-thread ranks (the shared
    launch of every benchmark: ``--backend`` and ``--timeout`` from ``args``)."""
    from ..spmd.launch import launch
    return launch(worker, n, configs, args.reps, backend=args.backend, timeout=args.timeout,
                  threads=1, quiet=True)[0]


def stacked_parts(labels: list[str], rows: list[dict], parts, figsize=(6, 3.2)):
    """``(fig, ax)``: one bar per row, stacked, each of ``parts`` in ms (``row["parts"]``,
    seconds; a row without parts draws nothing)."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot
    fig, ax = pyplot.subplots(figsize=figsize)
    ax.set_ylabel("ms per step (median)")
    bottom = [0.0] * len(rows)
    for i, part in enumerate(parts):
        vals = [1e3 * r["parts"][i] if r["parts"] else 0.0 for r in rows]
        ax.bar(labels, vals, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, vals)]
    return fig, ax


def write_breakdown(out_dir: Path, name: str, text: list[str], rows: list[dict], plot, no_plot: bool):
    """``name.md`` with ``text``, and ``plot(rows, name.png)`` unless ``no_plot`` or no rows."""
    write_table(out_dir / f"{name}.md", text)
    png = None if no_plot or not rows else plot(rows, out_dir / f"{name}.png")
    if png:
        print(f"wrote {png}")
    return rows


def save_figure(fig, path: Path) -> Path:
    """Lay out ``fig``, write it to ``path`` as a PNG at 100 dpi, close it; returns ``path``."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def moe_tokens(T: int, h: int, rank: int, seed: int, dtype):
    """This rank's tokens ``x (T, h)`` and output gradient ``dy (T, h)``, seeded by (seed, rank)."""
    g = torch.Generator().manual_seed(1000 * seed + rank + 1)
    return (torch.randn(T, h, generator=g, dtype=torch.float64).to(dtype),
            torch.randn(T, h, generator=g, dtype=torch.float64).to(dtype))
