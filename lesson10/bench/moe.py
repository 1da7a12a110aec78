"""``python -m lesson10 bench moe``: expert-parallel MoE fwd+bwd for capacity factors x
router skews: step time, drop rate, all-to-all bytes next to ``cost.moe_a2a_bytes``,
load imbalance, and one process running the dense MoE (``moe.md``, ``moe.png``)."""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from .. import cost
from ..spmd.comm import count_bytes
from ..spmd.device import current_device, torch_dtype
from . import harness
from .harness import md_table, moe_tokens, ms, save_figure, write_table

__all__ = ["time_moe", "moe_table", "bench"]


def _popularity(E: int, seed: int = 0) -> torch.Tensor:
    """Fixed per-expert popularity ``u (E,)``, standard normal from ``seed`` (float64)."""
    return torch.randn(E, generator=torch.Generator().manual_seed(10_000 + seed), dtype=torch.float64)


def _moe_dense_once(st, cfg, n):
    """Rank 0 alone: fwd+bwd of :func:`lesson10.spmd.moe.moe_reference` on all ``n T`` tokens."""
    from ..spmd.moe import init_moe_weights, moe_reference
    if "dense" not in st:
        dt = torch_dtype(cfg.get("dtype", "float32"))
        h, E, d_ff, T, seed = cfg["h"], cfg["E"], cfg["d_ff"], cfg["T"], cfg.get("seed", 0)
        params = [w.clone().requires_grad_() for w in init_moe_weights(h, E, d_ff, seed, dt)]
        xs, dys = zip(*(moe_tokens(T, h, r, seed, dt) for r in range(n)))
        x = torch.cat(xs).requires_grad_()
        bias = cfg.get("skew", 0.0) * _popularity(E, seed).to(params[0].dtype)
        st["dense"] = (x, torch.cat(dys), params, bias)
    x, dy, params, bias = st["dense"]
    for t in (x, *params):
        t.grad = None
    t0 = time.perf_counter()
    router_w, w1, w2 = params
    y, aux = moe_reference(x, router_w, w1, w2, cfg["k"], cfg.get("cf"), bias, return_aux=True)
    ((y * dy).sum() + aux).backward()
    return time.perf_counter() - t0


def _moe_step(cfg, st):
    """One timed step of ``cfg``: expert-parallel (``"ep"``) or the dense baseline."""
    from ..spmd.moe import ExpertParallelMoE
    n, rank = dist.get_world_size(), dist.get_rank()
    if cfg.get("method", "ep") == "dense":
        return harness.one_process(1, _moe_dense_once, st, cfg, n)
    if "layer" not in st:
        dt, seed = torch_dtype(cfg.get("dtype", "float32")), cfg.get("seed", 0)
        layer = ExpertParallelMoE(cfg["h"], cfg["E"], cfg["d_ff"], cfg["k"],
                                  capacity_factor=cfg.get("cf"), seed=seed,
                                  dtype=dt).to(current_device())
        with torch.no_grad():
            layer.bias.copy_(cfg.get("skew", 0.0) * _popularity(cfg["E"], seed))
        x, dy = (t.to(current_device()) for t in moe_tokens(cfg["T"], cfg["h"], rank, seed, dt))
        st.update(layer=layer, x=x.requires_grad_(), dy=dy)
    layer, x, dy = st["layer"], st["x"], st["dy"]
    layer.zero_grad(set_to_none=True)
    x.grad = None

    def run():
        with count_bytes() as fwd:
            y = layer(x)
        with count_bytes() as bwd:
            ((y * dy).sum() + layer.aux_loss).backward()
        st["bytes"] = [c.activation for c in (fwd, bwd)]

    return harness.timed(run)


def time_moe(configs: list[dict], reps: int = 5, warmup: int = 1) -> list[dict]:
    """Worker: expert-parallel MoE (:class:`ExpertParallelMoE`) fwd+bwd, one row per config.

    A config: ``{"method": "ep", "T" (tokens per rank), "h", "E", "k", "d_ff", "cf"
    (capacity factor or None), "skew", "dtype", "seed"}``, or ``{"method": "dense", ...}``:
    rank 0 alone runs the single-process :func:`moe_reference` on all ``N = N_e T`` tokens
    (1 thread) while the other ranks wait. Router skew: the layer's routing bias (the
    buffer DeepSeek-V3's balancing moves; it steers the top-k choice, not the gates) is
    set to ``skew * u`` with a fixed standard-normal popularity ``u_i`` per expert. The
    router logits ``x W_r`` are about N(0, 1) per entry (``x ~ N(0, 1)``, ``W_r ~ N(0, 1/h)``),
    so this is :func:`lesson10.sim.simulate_moe`'s skew model with Gaussian in place of
    Gumbel noise. Step = forward, loss ``sum(y * dy) + aux_loss``, backward.
    Returns per config: median step time (slowest rank), drop rate, the all-to-all bytes
    every rank sent in forward and backward (side traffic excluded), the copies routed
    to each expert (before drops) and kept on each rank (after drops).
    """
    n, device = dist.get_world_size(), current_device()
    times, states = harness.interleaved(configs, _moe_step, reps, warmup)
    rows = []
    for cfg, ts, st in zip(configs, times, states):
        row = {**cfg, "n": n, "median_s": harness.median(ts), "times": ts}
        if "layer" in st:
            layer = st["layer"]
            mine = torch.tensor(st["bytes"], dtype=torch.int64, device=device)
            parts = [torch.empty_like(mine) for _ in range(n)]
            dist.all_gather(parts, mine)
            El, N = cfg["E"] // n, cfg["T"] * n
            row.update(bytes_fwd=[int(p[0]) for p in parts], bytes_bwd=[int(p[1]) for p in parts],
                       counts=layer.counts.cpu().tolist(),
                       load_rank=layer.load.cpu().reshape(n, El).sum(1).tolist(),
                       dropped=layer.dropped, drop_rate=layer.dropped / (cfg["k"] * N),
                       elem=torch.empty((), dtype=torch_dtype(cfg.get("dtype", "float32"))).element_size())
        rows.append(row)
    return rows


def moe_table(rows: list[dict]) -> str:
    """Markdown for the MoE benchmark from :func:`time_moe` rows."""
    out = []
    dense = {(r["n"], r.get("skew", 0.0)): r["median_s"] for r in rows if r.get("method") == "dense"}
    t1 = []
    for r in rows:
        if r.get("method") == "dense":
            continue
        n, cf, skew = r["n"], r.get("cf"), r.get("skew", 0.0)
        formula = cost.moe_a2a_bytes(r["k"], r["T"], r["h"], n, e=r["elem"])
        fwd = r["bytes_fwd"]
        t1.append([n, "none" if cf is None else f"{cf:g}", f"{skew:g}", ms(r["median_s"]),
                   f"{100 * r['drop_rate']:.1f}", f"{sum(fwd) / n:,.0f}", f"{max(fwd):,}",
                   f"{formula:,.0f}", f"{sum(r['bytes_bwd']) / n:,.0f}",
                   f"{harness.ratio(r['counts']):.2f}", f"{harness.ratio(r['load_rank']):.2f}"])
    if t1:
        out += ["## Expert-parallel MoE: fwd+bwd per step", "",
                md_table(["N_e", "CF", "skew", "ms/step", "dropped %",
                           "a2a bytes/rank fwd (mean)", "fwd (max rank)",
                           "cost.moe_a2a_bytes (uniform)", "bwd (mean)",
                           "max/mean expert load (routed)", "max/mean rank load (kept)"], t1), ""]
    t2 = []
    for r in rows:
        if r.get("method") == "dense" or r.get("cf") is not None:
            continue
        t_one = dense.get((r["n"], r.get("skew", 0.0)))
        if t_one:
            t2.append([r["n"], f"{r.get('skew', 0.0):g}", r["n"] * r["T"], ms(t_one),
                       ms(r["median_s"]), f"{t_one / r['median_s']:.2f}",
                       f"{t_one / (r['n'] * r['median_s']):.0%}"])
    if t2:
        out += ["## Dropless expert parallelism vs one process running the dense MoE", "",
                md_table(["N_e", "skew", "tokens N", "dense 1 process ms", "EP ms", "speed-up",
                           "efficiency = T_1/(N_e T_N)"], t2), ""]
    return "\n".join(out)


def bench(args, out_dir):
    """Launch :func:`time_moe` for every ``--nproc``; write ``moe.md`` and ``moe.png``
    (``--breakdown``: :func:`lesson10.bench.moe_breakdown.bench_breakdown` instead)."""
    T, h, E, k, d_ff = args.tokens, args.hidden or 256, args.experts, args.topk, args.ffn or 512
    base = {"T": T, "h": h, "E": E, "k": k, "d_ff": d_ff, "dtype": args.dtype, "seed": 0}
    from ..runs.validate import check_moe, parse_capacity_factor
    cfs = tuple(parse_capacity_factor(c) for c in getattr(args, "capacity_factor",
                                                             ["none", "1.0", "1.25"]))
    skews = (0.0, 1.0, 2.0)
    if getattr(args, "breakdown", False):    # where the time goes, grouped vs loop experts
        from .moe_breakdown import bench_breakdown
        return bench_breakdown(args, out_dir, base)
    for n in args.nproc:                     # (python -m lesson10 bench checked these already)
        for cf in cfs:
            check_moe(args, n, E, k, cf, where="bench moe")
    rows = []
    for n in args.nproc:
        configs = [{**base, "method": "ep", "cf": cf, "skew": sk} for cf in cfs for sk in skews]
        configs += [{**base, "method": "dense", "cf": None, "skew": sk} for sk in (0.0, max(skews))]
        rows += harness.run_configs(time_moe, n, configs, args)
    text = ["# Expert-parallel MoE benchmark (gloo on CPU unless NCCL was chosen)", "",
            f"T={T} tokens per rank, h={h}, E={E} experts, top-{k}, d_ff={d_ff}, {args.dtype}; "
            "step = forward + loss sum(y dy) + aux loss + backward; every rank 1 thread; median "
            f"of {args.reps} reps after one warm-up, each rep the slowest rank; {harness.machine_note()}.", "",
            "Router skew: the layer's routing bias (it steers which experts a token picks, "
            "not the gates) is set to skew * u_i, with u_i a fixed standard-normal popularity "
            "per expert; the logits x W_r are about N(0, 1), so skew is in units of the logits' "
            "spread (the skew model of `lesson10.sim.simulate_moe`, with Gaussian noise). "
            "Bytes: what each rank sends in the dispatch and combine all-to-alls (the count "
            "exchange and the router-gradient all-reduce are left out); the formula "
            "2 k T h e (N_e-1)/N_e assumes uniform routing and no drops. Loads: copies per "
            "expert before drops, and per rank after drops (the busiest rank sets the step time). "
            "Numbers from a shared machine are noisy; with more ranks than cores the ranks "
            "share cores.", "", moe_table(rows)]
    write_table(out_dir / "moe.md", text)
    if not args.no_plot and _plot_moe(rows, out_dir / "moe.png"):
        print(f"wrote {out_dir / 'moe.png'}")
    return rows


def _plot_moe(rows, path):
    """Drop rate and max/mean rank load against the router skew, one line per capacity factor."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ep = [r for r in rows if r.get("method") == "ep"]
    if not ep:
        return None
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(8, 3.2))
    for n in sorted({r["n"] for r in ep}):
        for cf in sorted({r.get("cf") for r in ep}, key=lambda c: -1 if c is None else c):
            pts = sorted((r["skew"], 100 * r["drop_rate"], harness.ratio(r["load_rank"]))
                         for r in ep if r["n"] == n and r.get("cf") == cf)
            label = f"N_e={n}, CF={'none' if cf is None else f'{cf:g}'}"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
            bx.plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=label)
    ax.set_xlabel("router skew")
    ax.set_ylabel("dropped copies %")
    bx.set_xlabel("router skew")
    bx.set_ylabel("max / mean load per rank (kept)")
    bx.legend(fontsize=7)
    fig.suptitle("expert-parallel MoE on gloo/CPU")
    return save_figure(fig, path)
