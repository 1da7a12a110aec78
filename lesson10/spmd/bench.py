"""Timing harness for the real (torch.distributed) methods, and the one-off ``run`` command.

Two entry points used by ``python -m lesson10``:

* ``run_main(argv)`` -- ``python -m lesson10 run {ring,ulysses,sp,moe} --nproc N [sizes]``:
  one multi-process run, checked against the single-process reference; prints the time,
  the largest error and the bytes sent per rank next to :mod:`lesson10.cost`'s formula.
* ``main(argv)`` -- ``python -m lesson10 bench {ring,ulysses,moe,sp,all}``: benchmarks that
  write markdown tables (and a PNG when matplotlib is there) to ``benchmarks/results/``:

  1. causal ring attention fwd+bwd, zig-zag vs contiguous, next to the lesson's
     ``(N_c - 1/2)/(N_c/2)``;
  2. overlap vs no overlap, and the exposed communication per round;
  3. ring / Ulysses vs one process over the whole sequence: parallel efficiency;
  4. the target: causal zig-zag ring fwd+bwd on 2 ranks x 1 thread vs one process with 2
     threads running SDPA on the whole sequence (``b=1, s=4096, a=8, d=64``, float32);
  5. ``moe``: expert-parallel MoE fwd+bwd for capacity factors x router skews: step time,
     drop rate, all-to-all bytes next to ``cost.moe_a2a_bytes``, load imbalance, and one
     process running the dense MoE (:func:`time_moe_configs`, ``moe.md``);
  6. ``sp``: one LN+MLP block, TP vs TP + SP: time, bytes (equal) and the activation memory
     autograd saves per rank, next to the lesson's terms (:func:`time_sp_configs`, ``sp.md``).

The same module runs under torchrun (the processes already exist)::

    torchrun --nproc-per-node 2 -m lesson10.spmd.bench ring --seq 4096
    python -m lesson10.spmd.bench ring --nproc 2          # starts the ranks itself

Every worker below is a module-level function, so spawned ranks can import it. Times
are medians over ``reps`` after a warm-up; each rep is the slowest rank's time.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .attention import attention
from .comm import count_bytes
from .ring import ring_attention
from .shard import gather_sequence, shard_sequence

__all__ = ["main", "run_main", "check_attention_cases", "time_attention_configs",
           "check_shard_cases", "ring_error_messages",
           "time_single_process", "ring_table", "RESULTS_DIR",
           "time_moe_configs", "moe_table", "time_sp_configs", "sp_table",
           "sp_block_activation_bytes"]

RESULTS_DIR = Path("benchmarks") / "results"
_DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


# ---------------------------------------------------------------------- helpers
def _method_fn(method: str):
    if method == "ring":
        return ring_attention
    if method == "ulysses":
        try:
            from .ulysses import ulysses_attention
        except ImportError as e:  # pragma: no cover - depends on the other half
            raise RuntimeError(f"lesson10.spmd.ulysses is not available: {e}") from e
        return ulysses_attention
    raise ValueError(f"unknown attention method {method!r}; use 'ring' or 'ulysses'")


def _device():
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _full_inputs(case: dict, device):
    """The same full q, k, v, dout on every rank (seeded), shapes (b, s, a|a_kv, d)."""
    g = torch.Generator().manual_seed(int(case.get("seed", 0)))
    dt = _DTYPES[case.get("dtype", "float32")]
    b, s, a, d = case["b"], case["s"], case["a"], case["d"]
    a_kv = case.get("a_kv", a)
    shapes = [(b, s, a, d), (b, s, a_kv, d), (b, s, a_kv, d), (b, s, a, d)]
    return [torch.randn(sh, generator=g, dtype=torch.float64).to(dt).to(device) for sh in shapes]


def _slowest(seconds: float) -> float:
    t = torch.tensor([seconds], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _sync():
    if torch.cuda.is_available() and dist.get_backend() == "nccl":
        torch.cuda.synchronize()


# ---------------------------------------------------------------------- workers
def check_attention_cases(cases: list[dict]) -> list[dict]:
    """Worker: run each case through ring (or Ulysses) and the single-process reference.

    A case: ``{"method": "ring", "b", "s", "a", "a_kv", "d", "dtype", "causal", "layout",
    "overlap", "impl", "seed", "split"}``; ``split = m`` cuts the world into ``m``
    groups of consecutive ranks, each running its own ring on its own sequence. Returns
    per case the largest absolute errors of the output and of dq, dk, dv (gathered to
    the full sequence), the bytes this rank sent in forward and backward, the ring size
    ``n_ring`` and the time of one forward+backward.
    """
    device = _device()
    results = []
    world, rank = dist.get_world_size(), dist.get_rank()
    for case in cases:
        method = case.get("method", "ring")
        layout = case.get("layout", "zigzag")
        causal = bool(case.get("causal", True))
        group, n_ring = None, world
        if case.get("split"):
            n_ring = world // int(case["split"])
            groups = [dist.new_group(list(range(i, i + n_ring))) for i in range(0, world, n_ring)]
            group = groups[rank // n_ring]
            case = {**case, "seed": int(case.get("seed", 0)) + 1000 * (rank // n_ring)}
        q, k, v, dout = _full_inputs(case, device)
        ref = [t.clone().requires_grad_() for t in (q, k, v)]
        o_ref, _ = attention(*ref, causal=causal)
        o_ref.backward(dout)
        loc = [shard_sequence(t, layout, group).detach().requires_grad_() for t in (q, k, v)]
        kwargs = {}
        if method == "ring":
            kwargs = {"overlap": case.get("overlap", True), "impl": case.get("impl", "auto")}
        fn = _method_fn(method)
        dist.barrier()
        t0 = time.perf_counter()
        with count_bytes() as fwd:
            out = fn(*loc, causal=causal, layout=layout, group=group, **kwargs)
        with count_bytes() as bwd:
            out.backward(shard_sequence(dout, layout, group))
        _sync()
        elapsed = _slowest(time.perf_counter() - t0)
        full = [gather_sequence(t.detach(), layout, group)
                for t in (out, loc[0].grad, loc[1].grad, loc[2].grad)]
        errs = [float((x.double() - y.detach().double()).abs().max()) for x, y in
                zip(full, (o_ref, ref[0].grad, ref[1].grad, ref[2].grad))]
        results.append({**case, "err_out": errs[0], "err_dq": errs[1], "err_dk": errs[2],
                        "err_dv": errs[3], "err": max(errs), "bytes_fwd": fwd.sent,
                        "bytes_bwd": bwd.sent, "bytes_fwd_by_op": dict(fwd.by_op),
                        "time_s": elapsed, "rank": rank, "n_ring": n_ring})
    return results


def check_shard_cases(cases: list[tuple]) -> list[dict]:
    """Worker: for each ``(s, layout)`` shard a tensor whose entries are their global
    token ids and gather it back. Returns the ids this rank holds, the round trip's
    exactness, and the error message when ``s`` does not fit the layout."""
    out = []
    for s, layout in cases:
        x = torch.arange(s, dtype=torch.float64).view(1, s, 1, 1).expand(2, s, 3, 1).contiguous()
        try:
            loc = shard_sequence(x, layout)
        except ValueError as e:
            out.append({"s": s, "layout": layout, "error": str(e)})
            continue
        back = gather_sequence(loc, layout)
        out.append({"s": s, "layout": layout, "ids": loc[0, :, 0, 0].long().tolist(),
                    "roundtrip": bool(torch.equal(back, x)), "error": None})
    return out


def ring_error_messages(n_heads_bad: int = 3) -> dict:
    """Worker: the exceptions ``ring_attention`` raises for bad input (``type: message``)."""
    r = dist.get_rank()
    cases = {
        "odd_zigzag": lambda: ring_attention(*(torch.randn(1, 3, 2, 4) for _ in range(3)), layout="zigzag"),
        "heads": lambda: ring_attention(torch.randn(1, 4, 4, 4), torch.randn(1, 4, n_heads_bad, 4),
                                        torch.randn(1, 4, n_heads_bad, 4)),
        "kv_mismatch": lambda: ring_attention(torch.randn(1, 4, 2, 4), torch.randn(1, 4, 2, 4),
                                              torch.randn(1, 6, 2, 4)),
        "layout": lambda: ring_attention(*(torch.randn(1, 4, 2, 4) for _ in range(3)), layout="striped"),
        "ranks_disagree": lambda: ring_attention(*(torch.randn(1, 4 + 2 * r, 2, 4) for _ in range(3))),
    }
    msgs = {}
    for name, fn in cases.items():
        try:
            fn()
            msgs[name] = None
        except Exception as e:  # noqa: BLE001 - the test inspects type and text
            msgs[name] = f"{type(e).__name__}: {e}"
    return msgs


def _sdpa_once(state, cfg):
    """One fwd+bwd of ``F.scaled_dot_product_attention`` over the whole sequence, timed."""
    if "sdpa" not in state:
        dt = _DTYPES[cfg.get("dtype", "float32")]
        g = torch.Generator().manual_seed(0)
        b, s, a, d = cfg["b"], cfg["s"], cfg["a"], cfg["d"]
        dev = _device()
        q, k, v = (torch.randn(b, a, s, d, generator=g).to(dt).to(dev).requires_grad_() for _ in range(3))
        state["sdpa"] = (q, k, v, torch.randn(b, a, s, d, generator=g).to(dt).to(dev))
    q, k, v, dout = state["sdpa"]
    q.grad = k.grad = v.grad = None
    _sync()
    t0 = time.perf_counter()
    F.scaled_dot_product_attention(q, k, v, is_causal=cfg.get("causal", True)).backward(dout)
    _sync()
    return time.perf_counter() - t0


def _one_process(rank: int, cfg: dict, fn, *args) -> float:
    """Time ``fn(*args)`` on rank 0 alone with ``cfg["threads"]`` threads (the others wait):
    the single-process baseline, measured inside the same launch."""
    if rank != 0:
        return 0.0
    old = torch.get_num_threads()
    torch.set_num_threads(int(cfg.get("threads", 1)))
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(old)


def time_attention_configs(configs: list[dict], reps: int = 5, warmup: int = 1) -> list[dict]:
    """Worker: median fwd+bwd time (slowest rank) of each config, and per-round timings.

    A config: ``{"method": "ring"|"ulysses", "b", "s", "a", "a_kv", "d", "dtype",
    "causal", "layout", "overlap"}`` (``s`` = whole sequence), or ``{"method": "sdpa",
    "threads": t, ...}``: rank 0 alone runs PyTorch SDPA over the whole sequence with
    ``t`` threads while the other ranks wait (the single-process reference, measured
    side by side). Reps are interleaved (rep 1 of every config, then rep 2, ...), so a
    change in the load of a shared machine hits every config alike. For ring attention
    also the compute and the waiting time of every round (max over ranks, last rep):
    waiting = exposed communication.
    """
    device = _device()
    n, rank = dist.get_world_size(), dist.get_rank()
    states = [{} for _ in configs]
    times = [[] for _ in configs]
    rounds = [None for _ in configs]
    for i in range(warmup + reps):
        for j, cfg in enumerate(configs):
            method = cfg.get("method", "ring")
            st = states[j]
            dist.barrier()
            if method == "sdpa":
                t = _slowest(_one_process(rank, cfg, _sdpa_once, st, cfg))
                if i >= warmup:
                    times[j].append(t)
                continue
            if "qkv" not in st:
                b, s, a, d = cfg["b"], cfg["s"], cfg["a"], cfg["d"]
                a_kv = cfg.get("a_kv", a)
                dt = _DTYPES[cfg.get("dtype", "float32")]
                c = s // n
                g = torch.Generator().manual_seed(rank)
                st["qkv"] = [torch.randn(b, c, h, d, generator=g).to(dt).to(device).requires_grad_()
                             for h in (a, a_kv, a_kv)]
                st["dout"] = torch.randn(b, c, a, d, generator=g).to(dt).to(device)
            q, k, v = st["qkv"]
            tm = [] if method == "ring" else None
            kwargs = {"overlap": cfg.get("overlap", True), "timings": tm, "check": False} \
                if method == "ring" else {}
            q.grad = k.grad = v.grad = None
            _sync()
            t0 = time.perf_counter()
            o = _method_fn(method)(q, k, v, causal=cfg.get("causal", True),
                                   layout=cfg.get("layout", "zigzag"), **kwargs)
            o.backward(st["dout"])
            _sync()
            t = _slowest(time.perf_counter() - t0)
            if i >= warmup:
                times[j].append(t)
                rounds[j] = tm
    out_rows = []
    for j, cfg in enumerate(configs):
        per_round = None
        if rounds[j]:
            vals = torch.tensor([[r["compute_s"], r["wait_s"]] for r in rounds[j]], dtype=torch.float64)
            if dist.get_backend() == "nccl":
                vals = vals.cuda()
            dist.all_reduce(vals, op=dist.ReduceOp.MAX)
            per_round = [{"phase": r["phase"], "round": r["round"], "compute_s": float(x[0]),
                          "wait_s": float(x[1])} for r, x in zip(rounds[j], vals.cpu())]
        out_rows.append({**cfg, "n": n, "median_s": statistics.median(times[j]),
                         "times": times[j], "per_round": per_round})
    return out_rows


def time_single_process(s=4096, a=8, d=64, b=1, causal=True, threads=2, reps=5, warmup=1,
                        dtype="float32") -> float:
    """Median fwd+bwd time of ``F.scaled_dot_product_attention`` over the whole sequence,
    in this process with ``threads`` torch threads (restored afterwards)."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        dt = _DTYPES[dtype]
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(b, a, s, d, generator=g).to(dt).requires_grad_() for _ in range(3))
        dout = torch.randn(b, a, s, d, generator=g).to(dt)
        times = []
        for i in range(warmup + reps):
            q.grad = k.grad = v.grad = None
            t0 = time.perf_counter()
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            o.backward(dout)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        return statistics.median(times)
    finally:
        torch.set_num_threads(old)


# ---------------------------------------------------------------------- tables
def _md_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def _ms(x):
    return f"{1e3 * x:.1f}"


def ring_table(rows: list[dict]) -> str:
    """Markdown for benchmarks 1-4 from :func:`time_attention_configs` rows (the
    ``"sdpa"`` rows are the single-process references of the same launch)."""
    out = []
    by = {(r["method"], r["n"], r.get("layout"), r.get("overlap", True)): r for r in rows
          if r["method"] != "sdpa"}
    single = {(r["n"], r["threads"]): r["median_s"] for r in rows if r["method"] == "sdpa"}
    ns = sorted({r["n"] for r in rows})
    # (1) layouts
    t1 = []
    for n in ns:
        z, c = by.get(("ring", n, "zigzag", True)), by.get(("ring", n, "contiguous", True))
        if z and c:
            ring_c = sum(r["compute_s"] for r in c["per_round"])
            ring_z = sum(r["compute_s"] for r in z["per_round"])
            t1.append([n, z["s"], _ms(c["median_s"]), _ms(z["median_s"]),
                       f"{c['median_s'] / z['median_s']:.2f}", f"{ring_c / ring_z:.2f}",
                       f"{(n - 0.5) / (n / 2):.2f}"])
    if t1:
        out += ["## 1. Causal ring attention: contiguous vs zig-zag (fwd+bwd)", "",
                _md_table(["N_c", "s", "contiguous ms", "zig-zag ms", "measured ratio",
                           "ratio of sum_k max_r compute", "lesson (N_c-1/2)/(N_c/2)"], t1), "",
                "The lesson's ratio assumes one core per rank. With fewer free cores than "
                "ranks, an idle rank hands its core to a busy one, and the measured ratio "
                "moves towards 1 (the total work of both layouts is the same).", ""]
    # (2) overlap
    t2, t2r = [], []
    for n in ns:
        on, off = by.get(("ring", n, "zigzag", True)), by.get(("ring", n, "zigzag", False))
        if on and off:
            exp_on = sum(r["wait_s"] for r in on["per_round"])
            exp_off = sum(r["wait_s"] for r in off["per_round"])
            t2.append([n, _ms(off["median_s"]), _ms(on["median_s"]),
                       f"{off['median_s'] / on['median_s']:.2f}", _ms(exp_off), _ms(exp_on)])
            for a_, b_ in zip(off["per_round"], on["per_round"]):
                t2r.append([n, a_["phase"], a_["round"], _ms(b_["compute_s"]), _ms(a_["wait_s"]),
                            _ms(b_["wait_s"])])
    if t2:
        out += ["## 2. Overlap: transfer before compute vs overlapped (causal zig-zag, fwd+bwd)", "",
                _md_table(["N_c", "no overlap ms", "overlap ms", "speed-up",
                           "exposed comm, no overlap ms", "exposed comm, overlap ms"], t2), "",
                "Per round (slowest rank; waiting time = communication not hidden):", "",
                _md_table(["N_c", "phase", "round", "compute ms", "wait ms, no overlap",
                           "wait ms, overlap"], t2r), ""]
    # (3) parallel efficiency
    t3 = []
    for r in rows:
        t_one = single.get((r["n"], 1))
        if r["method"] == "sdpa" or not t_one:
            continue
        if r.get("overlap", True) and (r["method"] == "ulysses" or r.get("layout") == "zigzag"):
            eff = t_one / (r["n"] * r["median_s"])
            t3.append([r["method"], r["n"], r.get("layout"), _ms(r["median_s"]), _ms(t_one),
                       f"{t_one / r['median_s']:.2f}", f"{eff:.0%}"])
    if t3:
        out += ["## 3. Parallel efficiency vs one process over the whole sequence (1 thread)", "",
                _md_table(["method", "N_c", "layout", "parallel ms", "single ms", "speed-up",
                           "efficiency = T_1/(N_c T_N)"], t3), ""]
    # (4) target
    z2 = by.get(("ring", 2, "zigzag", True))
    if z2 and single.get((2, 2)):
        ratio = z2["median_s"] / single[(2, 2)]
        out += ["## 4. Target: zig-zag ring, 2 ranks x 1 thread vs one process SDPA, 2 threads", "",
                _md_table(["s", "heads", "d", "ring 2x1 ms", "SDPA 1x2 ms", "ratio", "target",
                           "met"],
                          [[z2["s"], z2["a"], z2["d"], _ms(z2["median_s"]), _ms(single[(2, 2)]),
                            f"{ratio:.2f}", "<= 1.5", "yes" if ratio <= 1.5 else "no"]]), ""]
    return "\n".join(out)


def _plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return None
    ring = [r for r in rows if r["method"] == "ring" and r.get("overlap", True)]
    if not ring:
        return None
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for lay in ("contiguous", "zigzag"):
        pts = sorted((r["n"], 1e3 * r["median_s"]) for r in ring if r.get("layout") == lay)
        if pts:
            ax.plot(*zip(*pts), marker="o", label=lay)
    ns = sorted({r["n"] for r in ring})
    one = [r["median_s"] for r in rows if r["method"] == "sdpa" and r.get("threads") == 1]
    if one:
        ax.axhline(1e3 * statistics.median(one), color="grey", ls="--", label="1 process, 1 thread")
    ax.set_xticks(ns)
    ax.set_xlabel("ranks N_c")
    ax.set_ylabel("fwd+bwd ms (causal)")
    ax.set_title("ring attention on gloo/CPU")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------- MoE benchmark
def _popularity(E: int, seed: int = 0) -> torch.Tensor:
    """Fixed per-expert popularity ``u (E,)``, standard normal from ``seed`` (float64)."""
    return torch.randn(E, generator=torch.Generator().manual_seed(10_000 + seed), dtype=torch.float64)


def _moe_tokens(T: int, h: int, rank: int, seed: int, dtype):
    """This rank's tokens ``x (T, h)`` and output gradient ``dy (T, h)``, seeded by (seed, rank)."""
    g = torch.Generator().manual_seed(1000 * seed + rank + 1)
    return (torch.randn(T, h, generator=g, dtype=torch.float64).to(dtype),
            torch.randn(T, h, generator=g, dtype=torch.float64).to(dtype))


def _moe_dense_once(st, cfg, n):
    """Rank 0 alone: fwd+bwd of :func:`lesson10.spmd.moe.moe_reference` on all ``n T`` tokens."""
    from .moe import init_moe_weights, moe_reference
    if "dense" not in st:
        dt = _DTYPES[cfg.get("dtype", "float32")]
        h, E, d_ff, T, seed = cfg["h"], cfg["E"], cfg["d_ff"], cfg["T"], cfg.get("seed", 0)
        params = [w.clone().requires_grad_() for w in init_moe_weights(h, E, d_ff, seed, dt)]
        xs, dys = zip(*(_moe_tokens(T, h, r, seed, dt) for r in range(n)))
        x = torch.cat(xs).requires_grad_()
        bias = cfg.get("skew", 0.0) * _popularity(E, seed).to(params[0].dtype)
        st["dense"] = (x, torch.cat(dys), params, bias)
    x, dy, params, bias = st["dense"]
    for t in (x, *params):
        t.grad = None
    t0 = time.perf_counter()
    y, aux = moe_reference(x, *params, cfg["k"], cfg.get("cf"), bias)
    ((y * dy).sum() + aux).backward()
    return time.perf_counter() - t0


def time_moe_configs(configs: list[dict], reps: int = 5, warmup: int = 1) -> list[dict]:
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
    every rank sent in forward and backward (``"metadata"``/``"param_grad"`` excluded), the
    copies routed to each expert (before drops) and kept on each rank (after drops).
    Reps are interleaved over the configs, as in :func:`time_attention_configs`.
    """
    from .moe import ExpertParallelMoE
    n, rank = dist.get_world_size(), dist.get_rank()
    device = _device()
    states = [{} for _ in configs]
    times = [[] for _ in configs]
    for i in range(warmup + reps):
        for j, cfg in enumerate(configs):
            st = states[j]
            dist.barrier()
            if cfg.get("method", "ep") == "dense":
                t = _slowest(_one_process(rank, cfg, _moe_dense_once, st, cfg, n))
                if i >= warmup:
                    times[j].append(t)
                continue
            if "layer" not in st:
                dt = _DTYPES[cfg.get("dtype", "float32")]
                seed = cfg.get("seed", 0)
                layer = ExpertParallelMoE(cfg["h"], cfg["E"], cfg["d_ff"], cfg["k"],
                                          capacity_factor=cfg.get("cf"), seed=seed,
                                          dtype=dt).to(device)
                with torch.no_grad():
                    layer.bias.copy_(cfg.get("skew", 0.0) * _popularity(cfg["E"], seed))
                x, dy = (t.to(device) for t in _moe_tokens(cfg["T"], cfg["h"], rank, seed, dt))
                st.update(layer=layer, x=x.requires_grad_(), dy=dy)
            layer, x, dy = st["layer"], st["x"], st["dy"]
            layer.zero_grad(set_to_none=True)
            x.grad = None
            _sync()
            t0 = time.perf_counter()
            with count_bytes() as fwd:
                y = layer(x)
            with count_bytes() as bwd:
                ((y * dy).sum() + layer.aux_loss).backward()
            _sync()
            t = _slowest(time.perf_counter() - t0)
            if i >= warmup:
                times[j].append(t)
            skip = ("metadata", "param_grad")
            st["bytes"] = [sum(v for op, v in c.by_op.items() if op not in skip) for c in (fwd, bwd)]
    rows = []
    for j, cfg in enumerate(configs):
        row = {**cfg, "n": n, "median_s": statistics.median(times[j]), "times": times[j]}
        st = states[j]
        if "layer" in st:
            layer = st["layer"]
            mine = torch.tensor(st["bytes"], dtype=torch.int64, device=device)
            parts = [torch.empty_like(mine) for _ in range(n)]
            dist.all_gather(parts, mine)
            El = cfg["E"] // n
            N = cfg["T"] * n
            row.update(bytes_fwd=[int(p[0]) for p in parts], bytes_bwd=[int(p[1]) for p in parts],
                       counts=layer.counts.cpu().tolist(),
                       load_rank=layer.load.cpu().reshape(n, El).sum(1).tolist(),
                       dropped=layer.dropped, drop_rate=layer.dropped / (cfg["k"] * N),
                       elem=torch.empty((), dtype=_DTYPES[cfg.get("dtype", "float32")]).element_size())
        rows.append(row)
    return rows


def _ratio(vals) -> float:
    m = sum(vals) / len(vals)
    return max(vals) / m if m > 0 else 1.0


def moe_table(rows: list[dict]) -> str:
    """Markdown for the MoE benchmark from :func:`time_moe_configs` rows."""
    from .. import cost
    out = []
    dense = {(r["n"], r.get("skew", 0.0)): r["median_s"] for r in rows if r.get("method") == "dense"}
    t1 = []
    for r in rows:
        if r.get("method") == "dense":
            continue
        n, cf, skew = r["n"], r.get("cf"), r.get("skew", 0.0)
        formula = cost.moe_a2a_bytes(r["k"], r["T"], r["h"], n, e=r["elem"])
        fwd = r["bytes_fwd"]
        t1.append([n, "none" if cf is None else f"{cf:g}", f"{skew:g}", _ms(r["median_s"]),
                   f"{100 * r['drop_rate']:.1f}", f"{sum(fwd) / n:,.0f}", f"{max(fwd):,}",
                   f"{formula:,.0f}", f"{sum(r['bytes_bwd']) / n:,.0f}",
                   f"{_ratio(r['counts']):.2f}", f"{_ratio(r['load_rank']):.2f}"])
    if t1:
        out += ["## Expert-parallel MoE: fwd+bwd per step", "",
                _md_table(["N_e", "CF", "skew", "ms/step", "dropped %",
                           "a2a bytes/rank fwd (mean)", "fwd (max rank)",
                           "cost.moe_a2a_bytes (uniform)", "bwd (mean)",
                           "max/mean expert load (routed)", "max/mean rank load (kept)"], t1), ""]
    t2 = []
    for r in rows:
        if r.get("method") == "dense" or r.get("cf") is not None:
            continue
        t_one = dense.get((r["n"], r.get("skew", 0.0)))
        if t_one:
            t2.append([r["n"], f"{r.get('skew', 0.0):g}", r["n"] * r["T"], _ms(t_one),
                       _ms(r["median_s"]), f"{t_one / r['median_s']:.2f}",
                       f"{t_one / (r['n'] * r['median_s']):.0%}"])
    if t2:
        out += ["## Dropless expert parallelism vs one process running the dense MoE", "",
                _md_table(["N_e", "skew", "tokens N", "dense 1 process ms", "EP ms", "speed-up",
                           "efficiency = T_1/(N_e T_N)"], t2), ""]
    return "\n".join(out)


def _bench_moe(args, out_dir):
    from .launch import launch
    T, h, E, k, d_ff = args.tokens, args.hidden or 256, args.experts, args.topk, args.ffn or 512
    base = {"T": T, "h": h, "E": E, "k": k, "d_ff": d_ff, "dtype": args.dtype, "seed": 0}
    cfs, skews = (None, 1.0, 1.25), (0.0, 1.0, 2.0)
    bad = [n for n in args.nproc if E % n]
    if bad:
        raise ValueError(f"bench moe: E = {E} experts do not split over N_e = {bad} ranks; "
                         "pass --experts a multiple of every --nproc")
    if not 1 <= k <= E:
        raise ValueError(f"bench moe: --topk {k} must be between 1 and --experts {E}")
    rows = []
    for n in args.nproc:
        configs = [{**base, "method": "ep", "cf": cf, "skew": sk} for cf in cfs for sk in skews]
        configs += [{**base, "method": "dense", "cf": None, "skew": sk} for sk in (0.0, max(skews))]
        rows += launch(time_moe_configs, n, configs, args.reps, backend=args.backend,
                       timeout=args.timeout, threads=1, quiet=True)[0]
    text = ["# Expert-parallel MoE benchmark (gloo on CPU unless NCCL was chosen)", "",
            f"T={T} tokens per rank, h={h}, E={E} experts, top-{k}, d_ff={d_ff}, {args.dtype}; "
            "step = forward + loss sum(y dy) + aux loss + backward; every rank 1 thread; median "
            f"of {args.reps} reps after one warm-up, each rep the slowest rank; cores on this "
            f"machine: {os.cpu_count()}; torch {torch.__version__}; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", "",
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
    _write_table(out_dir / "moe.md", text)
    if not args.no_plot and _plot_moe(rows, out_dir / "moe.png"):
        print(f"wrote {out_dir / 'moe.png'}")
    return rows


def _plot_moe(rows, path):
    """Drop rate and max/mean rank load against the router skew, one line per capacity factor."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return None
    ep = [r for r in rows if r.get("method") == "ep"]
    if not ep:
        return None
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(8, 3.2))
    for n in sorted({r["n"] for r in ep}):
        for cf in sorted({r.get("cf") for r in ep}, key=lambda c: -1 if c is None else c):
            pts = sorted((r["skew"], 100 * r["drop_rate"], _ratio(r["load_rank"]))
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
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------- SP benchmark
def sp_block_activation_bytes(s, b, h, t: int = 1, sp: bool = False, e: float = 2,
                              mask_bytes: float = 1, ffn_mult: int = 4,
                              regather: bool = True, stats_bytes: float = 0) -> float:
    """Activation bytes one rank stores for the backward of LN -> MLP -> dropout (one block).

    Terms (Korthikanti et al. 2022, the MLP half of a layer plus one LayerNorm), with
    ``e`` bytes per activation and ``mask_bytes`` per dropout-mask element:

    ============================  ============  =====================
    stored tensor                 TP            TP + SP
    ============================  ============  =====================
    LayerNorm input               ``sbh e``     ``sbh e / t``
    fc1 input (= LN output)       ``sbh e``     ``sbh e / t`` (``sbh e`` if not ``regather``)
    GELU input, fc2 input         ``2 sb (4h/t) e`` both
    dropout mask                  ``sbh m``     ``sbh m / t``
    ============================  ============  =====================

    In general (``m = ffn_mult``): TP ``sbh (2e + mask + 2me/t)``, TP + SP
    ``sbh (2e + mask + 2me) / t``: SP divides every term by ``t``. With ``e=2,
    mask_bytes=1``: TP ``sbh (5 + 16/t)``, TP + SP ``21 sbh / t``; adding the attention
    half and the other LayerNorm (``sbh (5 + 8/t)`` resp. ``13 sbh / t``) gives
    :func:`lesson10.cost.activation_bytes` (``10 + 24/t``, ``34/t``). ``regather=False``:
    the all-gathered fc1 input is kept in full for the weight gradient (plain autograd
    around an all-gather) instead of re-gathered in the backward as Megatron and
    :class:`lesson10.spmd.sp.SequenceParallelBlock` do. ``stats_bytes``: bytes per token
    of the LayerNorm statistics (mean and 1/std, each one number per token: 8 in float32;
    the lesson ignores them, default 0), for ``s b`` tokens (TP) or ``s b / t`` (SP).
    With ``e`` the dtype's size, ``mask_bytes=1`` and ``stats_bytes`` = twice the size of
    the LayerNorm statistics' dtype, this is exactly what autograd keeps for the block.
    """
    sbh = s * b * h
    mlp = 2 * sbh * ffn_mult * e / t
    if sp:
        return (sbh * e / t + sbh * e / (t if regather else 1) + mlp + sbh * mask_bytes / t
                + s * b * stats_bytes / t)
    return 2 * sbh * e + mlp + sbh * mask_bytes + s * b * stats_bytes


def _saved_bytes(params):
    """``(hooks, seen)``: inside ``with hooks``, every tensor autograd saves for the backward
    adds ``{storage pointer: storage bytes}`` to ``seen`` (storages of ``params`` skipped), so
    ``sum(seen.values())`` is the memory the saved activations keep alive."""
    skip = {p.untyped_storage().data_ptr() for p in params}
    seen = {}

    def pack(t):
        stg = t.untyped_storage()
        if stg.data_ptr() not in skip:
            seen[stg.data_ptr()] = stg.nbytes()
        return t

    return torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), seen


def time_sp_configs(configs: list[dict], reps: int = 5, warmup: int = 1) -> list[dict]:
    """Worker: :class:`SequenceParallelBlock` fwd+bwd, TP (``"sp": False``) or TP + SP.

    A config: ``{"sp": bool, "b", "s", "h", "ffn", "p" (dropout), "dtype", "seed"}``, and
    ``"time": False`` to measure bytes and memory only (no timed reps); ``s`` is the whole
    sequence (TP: every rank holds all of it, SP: its ``s/t`` tokens).
    Returns per config: median fwd+bwd time (slowest rank; None if not timed), bytes this
    rank sent forward and backward by op, ``saved_bytes``: unique storage bytes of the
    tensors autograd keeps for the backward (``saved_tensors_hooks``, weights excluded),
    measured on one extra step, max over ranks, and ``stats_elem``: bytes per number of
    the LayerNorm mean and 1/std on this device (float32 on GPU even for bf16 input).
    """
    from .sp import SequenceParallelBlock, sp_shard
    n = dist.get_world_size()
    device = _device()
    states = [{} for _ in configs]
    times = [[] for _ in configs]
    for i in range(warmup + reps):
        for j, cfg in enumerate(configs):
            st = states[j]
            if "block" not in st:
                dt = _DTYPES[cfg.get("dtype", "float32")]
                b, s, h = cfg["b"], cfg["s"], cfg["h"]
                blk = SequenceParallelBlock(h, cfg["ffn"], sequence_parallel=cfg["sp"],
                                            p=cfg.get("p", 0.1), seed=cfg.get("seed", 0),
                                            dtype=dt, check_shapes=False).to(device)
                g = torch.Generator().manual_seed(cfg.get("seed", 0) + 1)
                x = torch.randn(b, s, h, generator=g, dtype=torch.float64).to(dt)
                dy = torch.randn(b, s, h, generator=g, dtype=torch.float64).to(dt)
                if cfg["sp"]:
                    x, dy = sp_shard(x), sp_shard(dy)
                st.update(block=blk, x=x.to(device).requires_grad_(), dy=dy.to(device))
                # one extra step: the bytes sent and the memory saved for the backward
                hooks, seen = _saved_bytes(list(blk.parameters()))
                with count_bytes() as fwd:
                    with hooks:
                        y = blk(st["x"])
                st["saved"] = sum(seen.values())
                with count_bytes() as bwd:
                    y.backward(st["dy"])
                st["fwd"], st["bwd"] = dict(fwd.by_op), dict(bwd.by_op)
                probe = st["x"].detach()[:1, :1]
                stats = torch.native_layer_norm(probe, (h,), None, None, 1e-5)[1]
                st["stats_elem"] = stats.element_size()
            if not cfg.get("time", True):
                continue
            blk, x, dy = st["block"], st["x"], st["dy"]
            blk.zero_grad(set_to_none=True)
            x.grad = None
            dist.barrier()
            _sync()
            t0 = time.perf_counter()
            blk(x).backward(dy)
            _sync()
            t = _slowest(time.perf_counter() - t0)
            if i >= warmup:
                times[j].append(t)
    rows = []
    for j, cfg in enumerate(configs):
        st = states[j]
        saved = torch.tensor([st["saved"]], dtype=torch.int64, device=device)
        dist.all_reduce(saved, op=dist.ReduceOp.MAX)
        rows.append({**cfg, "n": n, "times": times[j],
                     "median_s": statistics.median(times[j]) if times[j] else None,
                     "bytes_fwd_by_op": st["fwd"], "bytes_bwd_by_op": st["bwd"],
                     "saved_bytes": int(saved), "stats_elem": st["stats_elem"],
                     "elem": torch.empty((), dtype=_DTYPES[cfg.get("dtype", "float32")]).element_size()})
    return rows


def _act_bytes(by_op: dict) -> int:
    return sum(v for op, v in by_op.items() if op not in ("metadata", "param_grad", "ag_recompute"))


def _sp_counts(r: dict) -> dict:
    """The count of a :func:`time_sp_configs` row, in bytes: ``"code"`` (this code's terms:
    its dtype, 1-byte mask, fc1 input kept as a shard, LayerNorm statistics), ``"stats"``
    (the LayerNorm statistics alone), ``"lesson"`` (bf16, 1-byte mask, no statistics)."""
    s, b, h, n, sp, e = r["s"], r["b"], r["h"], r["n"], r["sp"], r["elem"]
    mult = r["ffn"] // h if r["ffn"] % h == 0 else r["ffn"] / h
    stats = 2 * r["stats_elem"]
    code = sp_block_activation_bytes(s, b, h, n, sp, e=e, mask_bytes=1, ffn_mult=mult,
                                     stats_bytes=stats)
    return {"code": code, "stats": s * b * stats / (n if sp else 1),
            "lesson": sp_block_activation_bytes(s, b, h, n, sp, e=2, mask_bytes=1, ffn_mult=mult)}


def sp_table(rows: list[dict]) -> str:
    """Markdown for the SP benchmark from :func:`time_sp_configs` rows (timed rows in the
    first table; every row, timed or memory-only, in the memory tables)."""
    from .. import cost
    t1, t2 = [], []
    by = {(r["n"], r.get("dtype", "float32"), r["sp"]): r for r in rows}
    for (n, dt, sp), r in sorted(by.items()):
        s, b, h, e = r["s"], r["b"], r["h"], r["elem"]
        sbh = s * b * h
        mode = "TP + SP" if sp else "TP"
        bwd = r["bytes_bwd_by_op"]
        if r["median_s"] is not None:
            t1.append([n, mode, dt, _ms(r["median_s"]), f"{_act_bytes(r['bytes_fwd_by_op']):,}",
                       f"{_act_bytes(bwd):,}", f"{bwd.get('ag_recompute', 0):,}",
                       f"{bwd.get('param_grad', 0):,}",
                       f"{cost.comm_bytes('sp', s, h, n, e=e) * b / 2:,.0f}"])
        c = _sp_counts(r)
        t2.append([n, mode, dt, f"{r['saved_bytes']:,}", f"{c['code']:,.0f}", f"{c['stats']:,.0f}",
                   f"{r['saved_bytes'] / sbh:.3f}", f"{(r['saved_bytes'] - c['stats']) / sbh:.3f}",
                   f"{c['lesson'] / sbh:.3f}",
                   f"{cost.activation_bytes(s, b, h, 1, t=n, sp=sp) / sbh:.2f}"])
    ratio = []
    for n, dt in sorted({(r["n"], r.get("dtype", "float32")) for r in rows}):
        tp, sp = by.get((n, dt, False)), by.get((n, dt, True))
        if tp and sp:
            s, b, h = tp["s"], tp["b"], tp["h"]
            ct, cs = _sp_counts(tp), _sp_counts(sp)
            layer = [cost.activation_bytes(s, b, h, 1, t=n, sp=m) for m in (False, True)]
            timed = tp["median_s"] is not None and sp["median_s"] is not None
            ratio.append([n, dt, f"{sp['saved_bytes'] / tp['saved_bytes']:.4f}",
                          f"{(sp['saved_bytes'] - cs['stats']) / (tp['saved_bytes'] - ct['stats']):.4f}",
                          f"{cs['lesson'] / ct['lesson']:.4f}", f"{layer[1] / layer[0]:.4f}",
                          f"{tp['median_s'] / sp['median_s']:.2f}" if timed else "-"])
    out = ["## Time and bytes (fwd+bwd)", "",
           _md_table(["t", "mode", "dtype", "fwd+bwd ms", "activation bytes/rank fwd", "bwd",
                      "+ re-gather of the fc1 input (SP only)",
                      "+ LN/bias grad all-reduce (SP only)",
                      "cost.comm_bytes('sp')/2 (one of a layer's two all-reduces)"], t1), "",
           "## Activation memory saved for the backward, per rank", "",
           _md_table(["t", "mode", "dtype", "measured bytes", "this code's count (bytes)",
                      "of which LN mean+1/std", "measured / sbh",
                      "(measured - LN stats) / sbh",
                      "lesson's terms for LN+MLP+dropout / sbh (bf16, 1-byte mask)",
                      "cost.activation_bytes / sbh (whole layer, flash)"], t2), "",
           _md_table(["t", "dtype", "SP / TP measured", "SP / TP measured without LN stats",
                      "SP / TP lesson's block terms", "SP / TP cost.activation_bytes (layer)",
                      "time TP / TP+SP"], ratio), ""]
    return "\n".join(out)


def _bench_sp(args, out_dir):
    from .launch import launch
    b, s, h = args.batch, args.seq or 2048, args.hidden or 512
    ffn = args.ffn or 4 * h
    base = {"b": b, "s": s, "h": h, "ffn": ffn, "p": 0.1, "dtype": args.dtype, "seed": 0}
    bad = [n for n in args.nproc if s % n or ffn % n]
    if bad:
        raise ValueError(f"bench sp: s = {s} tokens and ffn = {ffn} must be multiples of the "
                         f"TP degree t; not so for t in {bad}. Change --seq / --ffn or --nproc.")
    rows = []
    for n in args.nproc:
        configs = [{**base, "sp": False}, {**base, "sp": True}]
        if args.dtype != "bfloat16":           # the lesson's dtype, for its memory count
            configs += [{**base, "sp": m, "dtype": "bfloat16", "time": False} for m in (False, True)]
        rows += launch(time_sp_configs, n, configs, args.reps, backend=args.backend,
                       timeout=args.timeout, threads=1, quiet=True)[0]
    text = ["# Sequence parallelism benchmark: TP vs TP + SP (gloo on CPU unless NCCL was chosen)", "",
            f"One `SequenceParallelBlock` (LayerNorm -> column-parallel fc1 -> GELU -> "
            f"row-parallel fc2 -> dropout p=0.1 -> residual), b={b}, s={s}, h={h}, ffn={ffn}, "
            f"{args.dtype}; every rank 1 thread; median of {args.reps} reps after one warm-up, "
            f"each rep the slowest rank; cores on this machine: {os.cpu_count()}; torch "
            f"{torch.__version__}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", "",
            "Bytes: what each rank sends for activations (shape checks and the SP-only "
            "all-reduce of the LayerNorm and fc2-bias gradients shown apart). TP: one "
            "all-reduce each way; TP + SP: an all-gather and a reduce-scatter each way, the same "
            "bytes, plus in the backward the re-gather of the fc1 input ((t-1)/t of sbh e, "
            "shown apart), the price of storing only its s/t shard. This block is half a transformer layer (no attention), so it sends half of "
            "`cost.comm_bytes('sp', ...)`.", "",
            "Memory: the unique storages autograd keeps for the backward "
            "(`torch.autograd.graph.saved_tensors_hooks`, weights excluded), in units of "
            "sbh bytes, measured in the benchmark's dtype and, for the memory only, in bfloat16 "
            "(the lesson's 2 bytes per activation). The lesson's 34 sbh/t counts a whole layer; "
            "the part this block models (one LayerNorm, the MLP, one dropout) is sbh (5 + 16/t) "
            "with TP and 21 sbh/t with TP + SP; with e bytes per activation and a 1-byte mask, "
            "sbh (2e + 1 + 8e/t) resp. sbh (10e + 1)/t. The code stores exactly these tensors: the "
            "LayerNorm input, the fc1 input (under TP + SP only its s/t shard: the backward "
            "all-gathers it again, the 're-gather' bytes, instead of keeping the gathered copy), "
            "the GELU input and output (s tokens, ffn/t features), and the dropout mask as bool; "
            "plus the LayerNorm mean and 1/std (two numbers per token held), which the lesson "
            "leaves out. 'This code's count' is those terms in bytes: it equals the measured "
            "bytes. Without the LayerNorm statistics, the bfloat16 rows are the lesson's terms "
            "exactly, and so is their SP / TP ratio; in a dtype of e bytes the 1-byte mask is a "
            "smaller share, so the ratio is ((10e + 1)/t) / (2e + 1 + 8e/t) (float32: "
            "(41/t) / (9 + 32/t)) instead. "
            "Time: under TP every rank also runs the LayerNorm and the dropout mask (a hash per "
            "element) on all s tokens, under TP + SP on s/t of them.", "", sp_table(rows)]
    _write_table(out_dir / "sp.md", text)
    return rows


# ---------------------------------------------------------------------- commands
def _common_args(p):
    p.add_argument("--seq", type=int, default=4096, help="whole sequence length s")
    p.add_argument("--heads", type=int, default=8, help="query heads a")
    p.add_argument("--kv-heads", type=int, default=None, help="K/V heads (GQA); default = heads")
    p.add_argument("--dim", type=int, default=64, help="head dim d")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default="float32", choices=sorted(_DTYPES))
    p.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    p.add_argument("--timeout", type=float, default=600.0)


def main(argv=None) -> int:
    """``python -m lesson10 bench {ring,ulysses,moe,sp,all} [--nproc 2 4] [--seq ...]``."""
    p = argparse.ArgumentParser(prog="python -m lesson10 bench",
                                description="benchmarks of the real multi-process methods")
    p.add_argument("what", choices=["ring", "ulysses", "moe", "sp", "all"])
    p.add_argument("--nproc", type=int, nargs="+", default=[2, 4])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default=str(RESULTS_DIR), help="folder for the tables")
    p.add_argument("--no-plot", action="store_true")
    _common_args(p)
    p.set_defaults(seq=None)
    g = p.add_argument_group("moe and sp sizes")
    g.add_argument("--hidden", type=int, default=None, help="h (default: moe 256, sp 512)")
    g.add_argument("--ffn", type=int, default=None, help="d_ff (default: moe 512, sp 4h)")
    g.add_argument("--tokens", type=int, default=2048, help="moe: tokens T per rank")
    g.add_argument("--experts", type=int, default=8, help="moe: experts E")
    g.add_argument("--topk", type=int, default=2, help="moe: experts per token k")
    args = p.parse_args(argv)
    for name in ("seq", "hidden", "ffn", "tokens", "experts", "topk", "reps", "batch"):
        v = getattr(args, name)
        if v is not None and v < 1:
            p.error(f"--{name} must be a positive integer, got {v}")
    if any(n < 1 for n in args.nproc):
        p.error(f"--nproc must be positive, got {args.nproc}")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    todo = ["ring", "ulysses", "moe", "sp"] if args.what == "all" else [args.what]
    for what in todo:
        if what in ("ring", "ulysses"):
            _bench_attention(argparse.Namespace(**{**vars(args), "seq": args.seq or 4096}),
                             what, out_dir)
        elif what == "moe":
            _bench_moe(args, out_dir)
        else:
            _bench_sp(args, out_dir)
    return 0


def _write_table(md: Path, lines: list[str]) -> None:
    """Write a benchmark's markdown to ``md`` and print it."""
    md.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {md}")


def _bench_attention(args, what, out_dir):
    from .launch import launch
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
        try:
            _method_fn("ulysses")
            configs.append({**base, "method": "ulysses", "layout": "contiguous"})
        except RuntimeError:
            pass
        rows += launch(time_attention_configs, n, configs, args.reps, backend=args.backend,
                       timeout=args.timeout, threads=1, quiet=True)[0]
    text = [f"# {what} attention benchmark (gloo on CPU unless NCCL was chosen)", "",
            f"b={args.batch}, s={args.seq}, heads={args.heads}, kv heads={base['a_kv']}, "
            f"d={args.dim}, {args.dtype}; every rank 1 thread; median of {args.reps} reps after "
            f"one warm-up; cores on this machine: {os.cpu_count()}; torch {torch.__version__}; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Numbers from a shared "
            "machine are noisy; with more ranks than cores the ranks share cores.", "",
            ring_table(rows)]
    _write_table(out_dir / f"{what}.md", text)
    if what == "ring" and not args.no_plot:
        png = _plot(rows, out_dir / "ring.png")
        if png:
            print(f"wrote {png}")
    return rows


# ---------------------------------------------------------------------- run
def _run_parser(prog):
    p = argparse.ArgumentParser(prog=prog, description="one checked multi-process run")
    p.add_argument("method", choices=["ring", "ulysses", "sp", "moe"])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--layout", default=None, help="zigzag | contiguous (default: ring zigzag, "
                                                   "Ulysses contiguous)")
    p.add_argument("--no-causal", action="store_true")
    p.add_argument("--no-overlap", action="store_true")
    _common_args(p)
    p.set_defaults(seq=1024, dtype="float32")
    return p


def _case_from_args(args) -> dict:
    layout = args.layout or ("zigzag" if args.method == "ring" else "contiguous")
    return {"method": args.method, "b": args.batch, "s": args.seq, "a": args.heads,
            "a_kv": args.kv_heads or args.heads, "d": args.dim, "dtype": args.dtype,
            "causal": not args.no_causal, "layout": layout, "overlap": not args.no_overlap}


def _report(res: dict, n: int) -> str:
    from .. import cost
    e = torch.empty((), dtype=_DTYPES[res["dtype"]]).element_size()
    h, g = res["a"] * res["d"], res["a"] // res["a_kv"]
    method = res["method"]
    expect = cost.comm_bytes(method, res["s"], h, n, g=g, e=e) * res["b"]
    tol = 1e-9 if res["dtype"] == "float64" else (1e-4 if res["dtype"] == "float32" else 5e-2)
    ok = res["err"] <= tol
    meta = res["bytes_fwd_by_op"].get("metadata", 0)     # shape checks, not the method's traffic
    fwd = res["bytes_fwd"] - meta
    lines = [f"{method} attention, N_c={n}, layout={res['layout']}, causal={res['causal']}, "
             f"b={res['b']} s={res['s']} heads={res['a']} kv_heads={res['a_kv']} d={res['d']} "
             f"{res['dtype']}",
             f"  fwd+bwd time (slowest rank): {1e3 * res['time_s']:.1f} ms",
             f"  max |error| vs single-process reference: {res['err']:.2e} "
             f"(out {res['err_out']:.1e}, dq {res['err_dq']:.1e}, dk {res['err_dk']:.1e}, "
             f"dv {res['err_dv']:.1e}) -> {'OK' if ok else 'TOO LARGE'} (tol {tol:g})",
             f"  bytes sent per rank, forward: {fwd:,} "
             f"(cost.comm_bytes('{method}', ...) = {expect:,.0f})"
             + (f" + {meta:,} of shape checks" if meta else ""),
             f"  bytes sent per rank, backward: {res['bytes_bwd']:,}"]
    return "\n".join(lines), ok


def run_main(argv=None) -> int:
    """``python -m lesson10 run {ring,ulysses,sp,moe} --nproc N [--seq S --heads A --dim D]``."""
    args = _run_parser("python -m lesson10 run").parse_args(argv)
    if args.method in ("sp", "moe"):
        from ._workers import cli_run
        return cli_run(args.method, args)
    from .launch import launch
    case = _case_from_args(args)
    res = launch(check_attention_cases, args.nproc, [case], backend=args.backend,
                 timeout=args.timeout)
    text, ok = _report(res[0][0], args.nproc)
    print(text)
    return 0 if ok else 1


def torchrun_main(argv=None) -> int:
    """Body of ``torchrun --nproc-per-node N -m lesson10.spmd.bench METHOD [sizes]``:
    this process is one rank; run the checked case (and ``--reps`` timed reps)."""
    from .launch import init_from_env, shutdown
    p = _run_parser("torchrun ... -m lesson10.spmd.bench")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    init_from_env(args.backend, timeout=args.timeout)
    try:
        if args.method in ("sp", "moe"):            # checked against one process, like `run`
            from ._workers import cli_run
            return cli_run(args.method, args)
        n = dist.get_world_size()
        case = _case_from_args(args)
        res = check_attention_cases([case])[0]
        timed = time_attention_configs([case], reps=args.reps)[0]
        if dist.get_rank() == 0:
            text, ok = _report(res, n)
            print(text)
            print(f"  median fwd+bwd over {args.reps} reps: {1e3 * timed['median_s']:.1f} ms")
        return 0
    finally:
        shutdown()


if __name__ == "__main__":
    # use the importable module's functions, so spawned ranks can find the workers
    from lesson10.spmd import bench as _bench
    from lesson10.spmd.launch import is_torchrun
    if is_torchrun():
        sys.exit(_bench.torchrun_main(sys.argv[1:]))
    sys.exit(_bench.run_main(sys.argv[1:]))
