"""``python -m lesson10 bench ulysses --breakdown``: where a Ulysses step's time goes.

Four variants in one launch, reps interleaved: the unfused Ulysses (three q/k/v all-to-alls
and the output's, each waited for: ``fused=False``, the layout of DeepSpeed's
``DistributedAttention``), and the fused one (one q/k/v all-to-all per head group) with 1, 2
and 4 head groups pipelined; beside them the one-process floor, SDPA over the whole sequence
on as many threads as there are ranks. Each part is timed inside the step
(:func:`lesson10.spmd.ulysses_pipeline.ulysses_timings`) on the rank whose step ended last:
the time spent waiting for each all-to-all (forward q/k/v and output, backward dout and
dq/dk/dv: the exchange not hidden), the attention kernels, the copies into and out of the
send and receive buffers; rest = step minus those (autograd, allocation). Writes
``ulysses_breakdown.md`` and ``ulysses_breakdown.png``.
"""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from ..spmd.device import current_device, torch_dtype
from . import harness
from .harness import md_table, ms, save_figure

__all__ = ["PARTS", "time_breakdown", "breakdown_table", "bench_breakdown"]

#: the parts of a step, as the clock names them (``rest`` last)
PARTS = ("fwd q/k/v all-to-all wait", "fwd attention", "fwd output all-to-all wait",
         "bwd dout all-to-all wait", "bwd attention", "bwd dq/dk/dv all-to-all wait",
         "fwd copies", "bwd copies", "rest")


def _label(cfg: dict) -> str:
    if cfg["method"] == "sdpa":
        return f"floor: SDPA, 1 process x {cfg['threads']} threads"
    return "unfused" if not cfg["fused"] else f"fused, {cfg['groups']} head group(s)"


def _setup(cfg: dict, st: dict) -> None:
    n, dev = dist.get_world_size(), current_device()
    b, s, a, d, dt = cfg["b"], cfg["s"], cfg["a"], cfg["d"], torch_dtype(cfg["dtype"])
    g = torch.Generator().manual_seed(dist.get_rank())
    st["qkv"] = [torch.randn(b, s // n, h, d, generator=g).to(dt).to(dev).requires_grad_()
                 for h in (a, cfg["a_kv"], cfg["a_kv"])]
    st["dout"] = torch.randn(b, s // n, a, d, generator=g).to(dt).to(dev)


def _step(cfg: dict, st: dict) -> float:
    """One fwd + bwd; the slowest rank's seconds, its parts appended to ``st["parts"]``."""
    from ..spmd.ulysses import ulysses_attention
    from ..spmd.ulysses_pipeline import ulysses_timings
    if cfg["method"] == "sdpa":
        from .attention import sdpa_once
        return harness.one_process(cfg["threads"], sdpa_once, st, cfg)
    if "qkv" not in st:
        _setup(cfg, st)
    q, k, v = st["qkv"]
    q.grad = k.grad = v.grad = None
    acc: dict = {}
    dist.barrier()
    with ulysses_timings(acc):
        t0 = time.perf_counter()
        ulysses_attention(q, k, v, causal=True, layout="contiguous", fused=cfg["fused"],
                          head_groups=cfg["groups"]).backward(st["dout"])
        total = time.perf_counter() - t0
    parts = [acc.get(p, 0.0) for p in PARTS[:-1]]
    mine = torch.tensor([total, *parts], dtype=torch.float64, device=current_device())
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    slow = max(every, key=lambda t: float(t[0])).tolist()
    st.setdefault("parts", []).append([*slow[1:], max(slow[0] - sum(slow[1:]), 0.0)])
    return slow[0]


def time_breakdown(configs: list[dict], reps: int = 3, warmup: int = 1) -> list[dict]:
    """Worker: per config the median step and the median of each of :data:`PARTS`."""
    times, states = harness.interleaved(configs, _step, reps, warmup)
    rows = []
    for cfg, ts, st in zip(configs, times, states):
        parts = st.get("parts", [])[warmup:]
        rows.append({**cfg, "n": dist.get_world_size(), "median_s": harness.median(ts),
                     "parts": [harness.median([p[i] for p in parts]) for i in range(len(PARTS))]
                     if parts else None})
    return rows


def breakdown_table(rows: list[dict]) -> str:
    """Markdown per ``N_c``: each variant's step, its ratio to the floor and to the unfused
    version, and every part's ms and share of the step."""
    out = []
    for n in sorted({r["n"] for r in rows}):
        mine = [r for r in rows if r["n"] == n]
        floor = next((r["median_s"] for r in mine if r["method"] == "sdpa"), None)
        base = next((r["median_s"] for r in mine if r["method"] != "sdpa" and not r["fused"]), None)
        body = []
        for r in mine:
            t = r["median_s"]
            cells = [f"{ms(p)} ({p / t:.0%})" for p in r["parts"]] if r["parts"] else [""] * len(PARTS)
            body.append([_label(r), ms(t), f"{t / floor:.2f}" if floor else "",
                         f"{t / base:.2f}" if base and r["method"] != "sdpa" else "", *cells])
        out += [f"## N_c = {n}", "", md_table(["variant", "step ms", "/ floor", "/ unfused",
                                                *PARTS], body), ""]
    return "\n".join(out)


def bench_breakdown(args, out_dir) -> list[dict]:
    """Launch :func:`time_breakdown` for every ``--nproc``; write the table and the plot."""
    from .validate import ulysses_fits
    base = {"b": args.batch, "s": args.seq or 4096, "a": args.heads,
            "a_kv": args.kv_heads or args.heads, "d": args.dim, "dtype": args.dtype}
    rows, load0 = [], os.getloadavg()
    for n in args.nproc:
        if not ulysses_fits(base["a"], base["a_kv"], n):
            continue
        per = base["a_kv"] // n
        configs = [{**base, "method": "sdpa", "threads": n}, {**base, "method": "ulysses",
                                                               "fused": False, "groups": 1}]
        configs += [{**base, "method": "ulysses", "fused": True, "groups": g}
                    for g in (1, 2, 4) if per % g == 0 and (base["a"] // n) % g == 0]
        rows += harness.run_configs(time_breakdown, n, configs, args)
    load1 = os.getloadavg()
    text = ["# Ulysses: where a step's time goes, unfused vs fused and pipelined", "",
            f"b={base['b']}, s={base['s']}, heads={base['a']}, kv heads={base['a_kv']}, "
            f"d={base['d']}, {base['dtype']}, causal, contiguous layout; step = forward + "
            "backward; every rank 1 thread; the floor is one process running SDPA over the "
            "whole sequence with N_c threads, in the same launch. Parts: the slowest rank's, "
            "timed inside the step (an all-to-all's 'wait' is the part of the exchange not "
            "hidden behind attention; copies = packing into and out of the buffers; rest = "
            "step minus the others). 'unfused' has the structure of DeepSpeed's "
            "DistributedAttention (one all-to-all per tensor, each waited for); DeepSpeed "
            f"itself is not installed here. Medians of {args.reps} reps; load average (1 min) "
            f"{load0[0]:.1f} before, {load1[0]:.1f} after; {harness.machine_note()}. Quote "
            "the ratios, not the ms: the machine is shared.", "", breakdown_table(rows)]
    return harness.write_breakdown(out_dir, "ulysses_breakdown", text, rows, _plot, args.no_plot)


def _plot(rows, path):
    """Stacked bars: each part's ms per variant and N_c, the floor as a plain bar."""
    labels = [f"N_c={r['n']}\n{_label(r).split(':')[0].replace(', ', chr(10))}" for r in rows]
    fig, ax = harness.stacked_parts(labels, rows, PARTS, figsize=(7, 3.6))
    ax.bar(labels, [0.0 if r["parts"] else 1e3 * r["median_s"] for r in rows], color="grey",
           label="floor (SDPA, one process)")
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(fontsize=6, ncol=2)
    fig.suptitle("Ulysses fwd + bwd: step breakdown")
    return save_figure(fig, path)
