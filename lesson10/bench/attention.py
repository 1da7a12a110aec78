"""``python -m lesson10 bench ring|ulysses``: ring attention and Ulysses, timed on real ranks.

Four questions, one launch per ``N_c``:

1. causal ring attention fwd+bwd, zig-zag vs contiguous, next to the lesson's
   ``(N_c - 1/2)/(N_c/2)``;
2. overlap vs no overlap (:func:`lesson10.spmd.ring.ring_options`), and the exposed
   communication per round;
3. ring / Ulysses vs one process over the whole sequence: parallel efficiency;
4. the target: causal zig-zag ring fwd+bwd on 2 ranks x 1 thread vs one process with 2
   threads running SDPA on the whole sequence (``b=1, s=4096, a=8, d=64``, float32).

``bench compare``: all-gather vs ring vs Ulysses vs USP at equal ``N`` (GQA by default):
fwd+bwd time and the forward bytes per rank, measured next to :mod:`lesson10.cost`.
"""
from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..runs import registry as methods
from ..spmd.device import current_device, synchronize, torch_dtype
from .harness import (
    interleaved,
    machine_note,
    md_table,
    median,
    ms,
    one_process,
    run_configs,
    save_figure,
    timed,
    write_table,
)

__all__ = ["breakdown_section", "time_attention", "ring_table", "compare_table", "bench", "bench_compare"]


def sdpa_once(state, cfg):
    """One fwd+bwd of ``F.scaled_dot_product_attention`` over the whole sequence, timed."""
    if "sdpa" not in state:
        dt, dev = torch_dtype(cfg.get("dtype", "float32")), current_device()
        g = torch.Generator().manual_seed(0)
        b, s, a, d = cfg["b"], cfg["s"], cfg["a"], cfg["d"]
        q, k, v = (torch.randn(b, a, s, d, generator=g).to(dt).to(dev).requires_grad_() for _ in range(3))
        state["sdpa"] = (q, k, v, torch.randn(b, a, s, d, generator=g).to(dt).to(dev))
    q, k, v, dout = state["sdpa"]
    q.grad = k.grad = v.grad = None
    synchronize()
    t0 = time.perf_counter()
    F.scaled_dot_product_attention(q, k, v, is_causal=cfg.get("causal", True)).backward(dout)
    synchronize()
    return time.perf_counter() - t0


def _method(name):
    from ..spmd.allgather import allgather_attention
    from ..spmd.ring import ring_attention
    from ..spmd.ulysses import ulysses_attention
    from ..spmd.usp import usp_attention
    return {"ring": ring_attention, "ulysses": ulysses_attention,
            "allgather": allgather_attention, "usp": usp_attention}[name]


def _step(cfg, st):
    """One timed fwd+bwd of ``cfg`` (a ring / Ulysses config, or the SDPA baseline)."""
    from ..spmd.ring import ring_options
    if cfg["method"] == "sdpa":
        return one_process(cfg["threads"], sdpa_once, st, cfg)
    if "qkv" not in st:
        n, dev = dist.get_world_size(), current_device()
        b, s, a, d = cfg["b"], cfg["s"], cfg["a"], cfg["d"]
        dt, c = torch_dtype(cfg.get("dtype", "float32")), s // n
        g = torch.Generator().manual_seed(dist.get_rank())
        st["qkv"] = [torch.randn(b, c, h, d, generator=g).to(dt).to(dev).requires_grad_()
                     for h in (a, cfg.get("a_kv", a), cfg.get("a_kv", a))]
        st["dout"] = torch.randn(b, c, a, d, generator=g).to(dt).to(dev)
    q, k, v = st["qkv"]
    q.grad = k.grad = v.grad = None
    st["rounds"] = []
    fn = _method(cfg["method"])
    kw = {"ulysses_size": cfg["ulysses_size"]} if cfg["method"] == "usp" else {}

    def forward():
        return fn(q, k, v, causal=cfg.get("causal", True), layout=cfg.get("layout", "zigzag"), **kw)

    if "bytes" not in st:                        # the forward's bytes, once, outside the timing
        from ..spmd.comm import count_bytes
        with count_bytes() as c:
            forward()
        st["bytes"], st["inter"] = c.activation, c.inter

    def run():
        with ring_options(overlap=cfg.get("overlap", True), timings=st["rounds"]):
            forward().backward(st["dout"])

    return timed(run)


def time_attention(configs: list[dict], reps: int = 5, warmup: int = 1) -> list[dict]:
    """Worker: median fwd+bwd time (slowest rank) of each config, and per-round timings.

    A config: ``{"method": "ring"|"ulysses", "b", "s", "a", "a_kv", "d", "dtype",
    "causal", "layout", "overlap"}`` (``s`` = whole sequence), or ``{"method": "sdpa",
    "threads": t, ...}``: rank 0 alone runs PyTorch SDPA over the whole sequence with
    ``t`` threads (the single-process reference, measured side by side). For ring
    attention also the compute and the waiting time of every round (max over ranks,
    last rep): waiting = exposed communication.
    """
    times, states = interleaved(configs, _step, reps, warmup)
    rows = []
    for cfg, ts, st in zip(configs, times, states):
        per_round = None
        if st.get("rounds"):
            vals = torch.tensor([[r["compute_s"], r["wait_s"]] for r in st["rounds"]],
                                dtype=torch.float64, device=current_device())
            dist.all_reduce(vals, op=dist.ReduceOp.MAX)
            per_round = [{"phase": r["phase"], "round": r["round"], "compute_s": float(x[0]),
                          "wait_s": float(x[1])} for r, x in zip(st["rounds"], vals.cpu())]
        inter = torch.tensor([float(st.get("inter") or 0)], dtype=torch.float64,
                             device=current_device())
        dist.all_reduce(inter)                     # mean over the ranks of what crosses nodes
        rows.append({**cfg, "n": dist.get_world_size(), "median_s": median(ts), "times": ts,
                     "per_round": per_round, "bytes_fwd": st.get("bytes"),
                     "bytes_fwd_inter": float(inter) / dist.get_world_size()})
    return rows


def ring_table(rows: list[dict]) -> str:
    """Markdown for questions 1-4 from :func:`time_attention` rows (the ``"sdpa"`` rows
    are the single-process references of the same launch)."""
    by = {(r["method"], r["n"], r.get("layout"), r.get("overlap", True)): r for r in rows
          if r["method"] != "sdpa"}
    single = {(r["n"], r["threads"]): r["median_s"] for r in rows if r["method"] == "sdpa"}
    ns = sorted({r["n"] for r in rows})
    out = _layout_section(by, ns) + _overlap_section(by, ns) + _efficiency_section(rows, single)
    return "\n".join(out + _target_section(by, single) + breakdown_section(by, ns))


def _layout_section(by: dict, ns: list) -> list[str]:
    """1. Causal ring attention, contiguous vs zig-zag."""
    t1 = []
    for n in ns:
        z, c = by.get(("ring", n, "zigzag", True)), by.get(("ring", n, "contiguous", True))
        if z and c:
            ring_c = sum(r["compute_s"] for r in c["per_round"])
            ring_z = sum(r["compute_s"] for r in z["per_round"])
            t1.append([n, z["s"], ms(c["median_s"]), ms(z["median_s"]),
                       f"{c['median_s'] / z['median_s']:.2f}", f"{ring_c / ring_z:.2f}",
                       f"{(n - 0.5) / (n / 2):.2f}"])
    if not t1:
        return []
    return ["## 1. Causal ring attention: contiguous vs zig-zag (fwd+bwd)", "",
            md_table(["N_c", "s", "contiguous ms", "zig-zag ms", "measured ratio",
                      "ratio of sum_k max_r compute", "lesson (N_c-1/2)/(N_c/2)"], t1), "",
            "The lesson's ratio assumes one core per rank. With fewer free cores than "
            "ranks, an idle rank hands its core to a busy one, and the measured ratio "
            "moves towards 1 (the total work of both layouts is the same).", ""]


def _overlap_section(by: dict, ns: list) -> list[str]:
    """2. Overlap: transfer before compute vs overlapped, with the per-round waits."""
    t2, t2r = [], []
    for n in ns:
        on, off = by.get(("ring", n, "zigzag", True)), by.get(("ring", n, "zigzag", False))
        if on and off:
            exp_on = sum(r["wait_s"] for r in on["per_round"])
            exp_off = sum(r["wait_s"] for r in off["per_round"])
            t2.append([n, ms(off["median_s"]), ms(on["median_s"]),
                       f"{off['median_s'] / on['median_s']:.2f}", ms(exp_off), ms(exp_on)])
            for a_, b_ in zip(off["per_round"], on["per_round"]):
                t2r.append([n, a_["phase"], a_["round"], ms(b_["compute_s"]), ms(a_["wait_s"]),
                            ms(b_["wait_s"])])
    if not t2:
        return []
    return ["## 2. Overlap: transfer before compute vs overlapped (causal zig-zag, fwd+bwd)", "",
            md_table(["N_c", "no overlap ms", "overlap ms", "speed-up",
                      "exposed comm, no overlap ms", "exposed comm, overlap ms"], t2), "",
            "Per round (slowest rank; waiting time = communication not hidden):", "",
            md_table(["N_c", "phase", "round", "compute ms", "wait ms, no overlap",
                      "wait ms, overlap"], t2r), ""]


def breakdown_section(by: dict, ns: list) -> list[str]:
    """5. Where a causal zig-zag ring step goes: per phase the rounds' compute (the attention
    kernels and the merge) and waiting (the send/recv set-up and the transfer not hidden),
    summed over rounds (each round's slowest rank, last rep); rest = that rep's step minus
    those (packing K/V, allocations, the casts, autograd)."""
    t5 = []
    for n in ns:
        z = by.get(("ring", n, "zigzag", True))
        if not (z and z["per_round"]):
            continue
        step = z["times"][-1] if z.get("times") else z["median_s"]   # the rep of per_round
        parts = [sum(r[key] for r in z["per_round"] if r["phase"] == ph)
                 for ph in ("forward", "backward") for key in ("compute_s", "wait_s")]
        parts.append(max(step - sum(parts), 0.0))
        t5.append([n, ms(step), *(f"{ms(p)} ({p / step:.0%})" for p in parts)])
    note = ("The last rep (the one the rounds were timed in): compute = attention kernels and "
            "merge per round; wait = send/recv set-up and the transfer the compute did not "
            "hide; rest = the step minus those (0 when the rounds' slowest ranks differ and "
            f"their sum passes the step). Load average (1 min) when written: {os.getloadavg()[0]:.1f}.")
    head = ["N_c", "step ms", "fwd compute", "fwd wait", "bwd compute",
            "bwd wait (K/V and dK/dV rings)", "rest"]
    section = ["## 5. Where the step goes (causal zig-zag, overlapped)", "", md_table(head, t5)]
    return section + ["", note, ""] if t5 else []


def _efficiency_section(rows: list[dict], single: dict) -> list[str]:
    """3. Parallel efficiency against one process over the whole sequence."""
    t3 = []
    for r in rows:
        t_one = single.get((r["n"], 1))
        if r["method"] == "sdpa" or not t_one:
            continue
        if r.get("overlap", True) and (r["method"] == "ulysses" or r.get("layout") == "zigzag"):
            t3.append([r["method"], r["n"], r.get("layout"), ms(r["median_s"]), ms(t_one),
                       f"{t_one / r['median_s']:.2f}", f"{t_one / (r['n'] * r['median_s']):.0%}"])
    if not t3:
        return []
    return ["## 3. Parallel efficiency vs one process over the whole sequence (1 thread)", "",
            md_table(["method", "N_c", "layout", "parallel ms", "single ms", "speed-up",
                      "efficiency = T_1/(N_c T_N)"], t3), ""]


def _target_section(by: dict, single: dict) -> list[str]:
    """4. The target: a zig-zag ring of 2 ranks x 1 thread against SDPA on 2 threads."""
    z2 = by.get(("ring", 2, "zigzag", True))
    if not (z2 and single.get((2, 2))):
        return []
    r2 = z2["median_s"] / single[(2, 2)]
    return ["## 4. Target: zig-zag ring, 2 ranks x 1 thread vs one process SDPA, 2 threads", "",
            md_table(["s", "heads", "d", "ring 2x1 ms", "SDPA 1x2 ms", "ratio", "target", "met"],
                     [[z2["s"], z2["a"], z2["d"], ms(z2["median_s"]), ms(single[(2, 2)]),
                       f"{r2:.2f}", "<= 1.5", "yes" if r2 <= 1.5 else "no"]]), ""]


def _formula(r) -> float:
    from .. import cost
    e = torch.empty((), dtype=torch_dtype(r.get("dtype", "float32"))).element_size()
    g, h = r["a"] / r.get("a_kv", r["a"]), r["a"] * r["d"]
    if r["method"] == "usp":
        return cost.usp_bytes(r["s"], h, r["ulysses_size"], r["n"] // r["ulysses_size"], g=g, e=e) * r["b"]
    return cost.comm_bytes(r["method"], r["s"], h, r["n"], g=g, e=e) * r["b"]


def compare_table(rows: list[dict]) -> str:
    """Markdown: every context-parallel method at each ``N``, time and bytes per rank."""
    one = {r["n"]: r["median_s"] for r in rows if r["method"] == "sdpa" and r["threads"] == 1}
    across = any(r.get("bytes_fwd_inter") for r in rows)      # the ranks spanned nodes
    body = []
    for r in rows:
        if r["method"] == "sdpa":
            continue
        name = r["method"] + (f" u={r['ulysses_size']} x r={r['n'] // r['ulysses_size']}"
                              if r["method"] == "usp" else "")
        body.append([r["n"], name, r.get("layout"), ms(r["median_s"]),
                     f"{one[r['n']] / r['median_s']:.2f}" if r["n"] in one else "",
                     f"{r['bytes_fwd'] / 1e6:.2f}", f"{_formula(r) / 1e6:.2f}"]
                    + ([f"{(r.get('bytes_fwd_inter') or 0) / 1e6:.2f}"] if across else []))
    return md_table(["N", "method", "layout", "fwd+bwd ms", "speed-up vs 1 process",
                     "fwd MB/rank measured", "lesson formula MB"]
                    + (["of which across nodes (mean MB/rank)"] if across else []), body)


def _plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ring = [r for r in rows if r["method"] == "ring" and r.get("overlap", True)]
    if not ring:
        return None
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for lay in ("contiguous", "zigzag"):
        pts = sorted((r["n"], 1e3 * r["median_s"]) for r in ring if r.get("layout") == lay)
        if pts:
            ax.plot(*zip(*pts), marker="o", label=lay)
    one = [r["median_s"] for r in rows if r["method"] == "sdpa" and r.get("threads") == 1]
    if one:
        ax.axhline(1e3 * statistics.median(one), color="grey", ls="--", label="1 process, 1 thread")
    ax.set_xticks(sorted({r["n"] for r in ring}))
    ax.set_xlabel("ranks N_c")
    ax.set_ylabel("fwd+bwd ms (causal)")
    ax.set_title("ring attention on gloo/CPU")
    ax.legend()
    return save_figure(fig, path)


def bench_compare(args, out_dir):
    """All-gather vs ring vs Ulysses vs USP at equal ``N`` (``compare.md``)."""
    a = args.heads
    base = {"b": args.batch, "s": args.seq, "a": a, "a_kv": args.kv_heads or max(1, a // 4),
            "d": args.dim, "dtype": args.dtype, "causal": True}
    rows = []
    for n in args.nproc:
        lay = {m: methods.get(m).default_layout for m in methods.attention_names()}
        configs = [{**base, "method": "sdpa", "threads": 1},
                   {**base, "method": "ring", "layout": lay["ring"]},
                   {**base, "method": "allgather", "layout": lay["allgather"]}]
        if base["a_kv"] % n == 0:
            configs.append({**base, "method": "ulysses", "layout": lay["ulysses"]})
        configs += [{**base, "method": "usp", "layout": lay["usp"], "ulysses_size": u}
                    for u in range(2, n) if n % u == 0 and base["a_kv"] % u == 0]
        rows += run_configs(time_attention, n, configs, args)
    text = ["# Context parallelism compared: all-gather, ring, Ulysses, USP", "",
            f"Causal; b={args.batch}, s={args.seq}, heads={a}, kv heads={base['a_kv']} (GQA), "
            f"d={args.dim}, {args.dtype}; every rank 1 thread; median of {args.reps} reps; "
            f"{machine_note()}. Bytes: the forward's activation traffic per rank "
            "(`count_bytes`, shape checks left out) next to `cost.comm_bytes` / `cost.usp_bytes`. "
            "All-gather sends the ring's bytes in one step; Ulysses needs N <= kv heads; USP "
            "runs Ulysses inside groups of u consecutive ranks and a ring of r = N/u across."
            + (f" Nodes of {args.node_size} ranks (`--node-size`): the last column is what "
               "a rank sends to other nodes, on average." if getattr(args, "node_size", None) else ""),
            "", compare_table(rows), ""]
    write_table(out_dir / "compare.md", text)
    return rows


def bench(args, what: str, out_dir):
    """Launch :func:`time_attention` for every ``--nproc``; write ``{what}.md`` (+ ``ring.png``)."""
    if what == "compare":
        return bench_compare(args, out_dir)
    base = {"b": args.batch, "s": args.seq, "a": args.heads, "a_kv": args.kv_heads or args.heads,
            "d": args.dim, "dtype": args.dtype, "causal": True}
    rows = []
    for n in args.nproc:
        configs = [{**base, "method": "sdpa", "threads": 1}]
        if n == 2:
            configs.append({**base, "method": "sdpa", "threads": 2})
        if what == "ring":
            configs += [{**base, "method": "ring", "layout": lay, "overlap": ov}
                        for lay, ov in (("zigzag", True), ("contiguous", True), ("zigzag", False))]
        from .validate import ulysses_fits
        if ulysses_fits(base["a"], base["a_kv"], n):     # Ulysses needs whole heads per rank
            configs.append({**base, "method": "ulysses", "layout": "contiguous"})
        rows += run_configs(time_attention, n, configs, args)
    text = [f"# {what} attention benchmark (gloo on CPU unless NCCL was chosen)", "",
            f"b={args.batch}, s={args.seq}, heads={args.heads}, kv heads={base['a_kv']}, "
            f"d={args.dim}, {args.dtype}; every rank 1 thread; median of {args.reps} reps after "
            f"one warm-up; {machine_note()}. Numbers from a shared machine are noisy; with more "
            "ranks than cores the ranks share cores.", "", ring_table(rows)]
    write_table(out_dir / f"{what}.md", text)
    if what == "ring" and not args.no_plot and _plot(rows, out_dir / "ring.png"):
        print(f"wrote {out_dir / 'ring.png'}")
    return rows
