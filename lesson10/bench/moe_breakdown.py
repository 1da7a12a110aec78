"""``python -m lesson10 bench moe --breakdown``: where an expert-parallel MoE step's time
goes (router and plan, dispatch and combine all-to-alls, expert GEMMs, the rest), with the
experts run two ways in the same launch, interleaved: one grouped matmul per rank
(:func:`lesson10.spmd.moe.grouped_expert_mlp`, what the layer runs) and the loop over the
local experts it replaced (``before``). Writes ``moe_breakdown.md`` and ``moe_breakdown.png``.
"""
from __future__ import annotations

import contextlib
import os
import time

import torch
import torch.distributed as dist

from ..spmd import comm
from ..spmd.device import current_device, torch_dtype
from . import harness
from .harness import md_table, moe_tokens, ms, save_figure

__all__ = ["loop_expert_mlp", "time_breakdown", "breakdown_table", "bench_breakdown"]

PARTS = ("router + plan", "all-to-alls (dispatch + combine)", "expert GEMMs", "rest")


def loop_expert_mlp(x, eid, w1, w2):
    """The former expert step: a Python loop of two matmuls per local expert (the baseline)."""
    order = torch.sort(eid, stable=True).indices                 # group rows by local expert
    sizes = torch.bincount(eid, minlength=w1.shape[0]).tolist()
    outs = [torch.relu(xe @ w1[e]) @ w2[e] for e, xe in enumerate(torch.split(x[order], sizes))]
    yg = torch.cat(outs) if outs else x[order]
    return yg[torch.argsort(order)]


@contextlib.contextmanager
def _timed_all_to_alls(acc: dict):
    """Add the seconds every token all-to-all takes (forward and backward) to ``acc["a2a"]``;
    ``acc["first"]``: when the first exchange of the dispatch began."""
    inner = comm.all_to_all_single

    def wrapped(x, *args, **kw):
        t0 = time.perf_counter()
        acc.setdefault("first", t0)                              # the router's part ends here
        try:
            return inner(x, *args, **kw)
        finally:
            if kw.get("op", "all_to_all") == "all_to_all":
                acc["a2a"] = acc.get("a2a", 0.0) + time.perf_counter() - t0

    comm.all_to_all_single = wrapped
    try:
        yield acc
    finally:
        comm.all_to_all_single = inner


def _setup(cfg: dict, st: dict) -> None:
    from ..spmd.moe import ExpertParallelMoE, grouped_expert_mlp
    dt, seed, rank = torch_dtype(cfg.get("dtype", "float32")), cfg.get("seed", 0), dist.get_rank()
    layer = ExpertParallelMoE(cfg["h"], cfg["E"], cfg["d_ff"], cfg["k"], capacity_factor=cfg.get("cf"),
                              seed=seed, dtype=dt).to(current_device())
    fn = grouped_expert_mlp if cfg["experts"] == "grouped" else loop_expert_mlp
    acc: dict = {}

    def local(xr, recv_counts):            # the layer's expert step, timed forward and backward
        n, El = recv_counts.shape
        eid = torch.arange(El, device=xr.device).repeat(n).repeat_interleave(recv_counts.reshape(-1))
        t0 = time.perf_counter()
        y = fn(xr, eid, layer.w1, layer.w2)
        acc["experts"] = acc.get("experts", 0.0) + time.perf_counter() - t0
        if y.requires_grad and xr.requires_grad:      # backward: from y's gradient to xr's
            y.register_hook(lambda g: acc.__setitem__("bwd", time.perf_counter()))
            xr.register_hook(lambda g: acc.__setitem__(
                "experts", acc["experts"] + time.perf_counter() - acc["bwd"]))
        return y

    layer._local_experts = local  # type: ignore[method-assign]  # the bench's hook, this instance
    x, dy = (t.to(current_device()) for t in moe_tokens(cfg["T"], cfg["h"], rank, seed, dt))
    st.update(layer=layer, x=x.requires_grad_(), dy=dy, acc=acc)


def _step(cfg, st):
    """One rep, fwd + bwd, its parts timed inside the step on every rank: the router part
    (until the first exchange), the token all-to-alls, the expert step (forward, and backward
    from its output's gradient to its input's). Returns the slowest rank's seconds; that
    rank's parts go to ``st["parts"]``."""
    if "layer" not in st:
        _setup(cfg, st)
    layer, x, dy, acc = st["layer"], st["x"], st["dy"], st["acc"]
    layer.zero_grad(set_to_none=True)
    x.grad = None
    acc.clear()
    dist.barrier()
    with _timed_all_to_alls(acc):
        t0 = acc["start"] = time.perf_counter()
        y = layer(x)
        ((y * dy).sum() + layer.aux_loss).backward()
        total = time.perf_counter() - t0
    mine = torch.tensor([total, acc.get("first", t0) - t0, acc.get("a2a", 0.0),
                         acc.get("experts", 0.0)], dtype=torch.float64, device=current_device())
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    slow = max(every, key=lambda v: float(v[0])).tolist()   # the rank that ends the step
    st.setdefault("parts", []).append((*slow[1:], max(slow[0] - sum(slow[1:]), 0.0)))
    return slow[0]


def time_breakdown(configs: list[dict], reps: int = 5, warmup: int = 1) -> list[dict]:
    """Worker: per config (the :func:`lesson10.bench.moe.time_moe` keys plus ``"experts"``:
    ``"grouped"`` or ``"loop"``), the median step and the median of each part of
    :data:`PARTS` (the parts of the slowest rank; ``rest`` = its step minus the others)."""
    times, states = harness.interleaved(configs, _step, reps, warmup)
    rows = []
    for cfg, ts, st in zip(configs, times, states):
        parts = st["parts"][warmup:]
        rows.append({**cfg, "n": dist.get_world_size(), "median_s": harness.median(ts),
                     "parts": [harness.median([p[i] for p in parts]) for i in range(len(PARTS))]})
    return rows


def breakdown_table(rows: list[dict]) -> str:
    """Markdown: each part's ms and share, grouped vs loop, and the loop/grouped ratios."""
    out = []
    for n in sorted({r["n"] for r in rows}):
        by = {r["experts"]: r for r in rows if r["n"] == n}
        body = []
        for label in ("loop", "grouped"):
            r = by.get(label)
            if r:
                cells = [f"{ms(p)} ({p / r['median_s']:.0%})" for p in r["parts"]]
                body.append([label, ms(r["median_s"]), *cells])
        if "loop" in by and "grouped" in by:
            lo, gr = by["loop"], by["grouped"]
            body.append(["grouped / loop", f"{gr['median_s'] / lo['median_s']:.2f}x",
                         *[f"{g / lo_p:.2f}x" if lo_p > 0 else "-"
                           for g, lo_p in zip(gr["parts"], lo["parts"])]])
        out += [f"## N_e = {n}", "", md_table(["experts", "step ms", *PARTS], body), ""]
    return "\n".join(out)


def bench_breakdown(args, out_dir, base: dict, cf=None) -> list[dict]:
    """Launch :func:`time_breakdown` for every ``--nproc``; write the table and the plot."""
    rows = []
    load0 = os.getloadavg()
    for n in args.nproc:
        configs = [{**base, "method": "ep", "cf": cf, "skew": 0.0, "experts": e}
                   for e in ("loop", "grouped")]
        rows += harness.run_configs(time_breakdown, n, configs, args)
    load1 = os.getloadavg()
    text = ["# Expert-parallel MoE: where a step's time goes", "",
            f"T={base['T']} tokens per rank, h={base['h']}, E={base['E']}, top-{base['k']}, "
            f"d_ff={base['d_ff']}, {base['dtype']}, dropless, no skew; step = forward + backward. "
            "Each part is timed inside the step, on the rank whose step ended last: the token "
            "all-to-alls (forward and backward, waiting for the other ranks included), the "
            "router with the count exchange and the dispatch plan (forward, until the first "
            "exchange of the dispatch), the expert GEMMs with their gather and scatter "
            "(forward, and backward from the gradient of their output to that of their "
            "input); rest = step minus those (the weighted sum, its backward, the router's "
            "backward). 'loop' is the former per-expert loop, 'grouped' the padded "
            "bmm the layer runs now; both in the same launch, reps interleaved. Medians of "
            f"{args.reps} reps; load average (1 min) {load0[0]:.1f} before, {load1[0]:.1f} "
            f"after; {harness.machine_note()}. Quote the ratios, not the ms: the machine is "
            "shared.", "", breakdown_table(rows)]
    return harness.write_breakdown(out_dir, "moe_breakdown", text, rows, _plot, args.no_plot)


def _plot(rows, path):
    """Stacked bars: each part's ms, loop and grouped side by side per N_e."""
    labels = [f"N_e={r['n']}\n{r['experts']}" for r in rows]
    fig, ax = harness.stacked_parts(labels, rows, PARTS, figsize=(6, 3.2))
    ax.legend(fontsize=7)
    fig.suptitle("expert-parallel MoE: step breakdown")
    return save_figure(fig, path)
