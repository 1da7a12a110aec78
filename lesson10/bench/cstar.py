"""``python -m lesson10 bench cstar``: when does the ring's transfer hide? (c >= F/W)

One launch of 2 ranks (1 thread each):

1. **F**: the attention FLOP/s of one rank, measured: every rank at the same time (as in
   the ring, where they all compute at once and share the machine) times the local
   attention kernel of ring attention on one ``c x c`` block (``4 c^2 h`` FLOPs, no mask,
   ``c = 2 x target``); F from the slowest rank;
2. **W**: the link's bandwidth. On CPU/gloo the loopback "link" is far faster than a
   network, so :func:`lesson10.spmd.ring.ring_options` paces every ring transfer at
   ``bandwidth`` bytes/s (a transfer of ``B`` bytes is not done before ``B / bandwidth``
   seconds), and W is then *measured* on one transfer without compute to hide it. By
   default the pace is chosen from F so that ``c*`` lands inside the sweep;
3. **prediction**: ``c* = F / W`` corrected for the mask, GQA and bytes per element,
   :func:`lesson10.cost.min_block_size` (``F/W * (2 if causal) / g * e/2``);
4. **sweep**: ring attention forward on 2 ranks for blocks ``c`` from ``c*/8`` to ``4 c*``;
   per round (round 0: a rank's own block while its K/V travel) the compute time, the
   transfer time (the wait with overlap off) and the *exposed* communication with overlap
   (the time a rank still waits for the transfer after its compute). Every time is the
   fastest of ``reps`` runs (slowest rank in each): on a shared machine the least
   disturbed run is the best estimate of what the hardware does. The model: exposed
   ``= max(0, B/W - compute)``, zero from ``c*`` on. **Measured crossing**: the block size
   where the measured compute per round meets the measured transfer (interpolated on a
   log scale), i.e. where the exposed communication would reach zero. Acceptance: within
   2x of the prediction. (A floor of a few ms of synchronisation between the two ranks
   stays exposed at any ``c``; it is why the crossing is read off compute vs transfer.)

On CUDA every clock read waits for the GPU first (``torch.cuda.synchronize``: here and in the
ring's own timings), since kernels and NCCL transfers run asynchronously to the host.

Writes ``cstar.md`` and ``cstar.png`` to ``benchmarks/results/``.
"""
from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

from .. import cost
from ..spmd.device import current_device, synchronize, torch_dtype
from .harness import machine_note, md_table, ms, save_figure, slowest, write_table

__all__ = ["cstar_sweep", "crossing", "cstar_table", "bench"]



def _block(c, heads, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, c, heads, d, generator=g).to(dtype).to(current_device())


def _measure_flops(c, a, a_kv, d, dtype, reps):
    """FLOP/s of the ring's local kernel on one full ``c x c`` block, all ranks at once
    (fastest of ``reps``, slowest rank)."""
    from ..spmd.attention import local_attention
    q, k, v = _block(c, a, d, dtype, 0), _block(c, a_kv, d, dtype, 1), _block(c, a_kv, d, dtype, 2)
    local_attention(q, k, v)                                   # warm-up
    times = []
    for _ in range(reps):
        dist.barrier()
        synchronize()                           # CUDA: time the kernel, not its launch
        t0 = time.perf_counter()
        local_attention(q, k, v)
        synchronize()
        times.append(slowest(time.perf_counter() - t0))
    return 4 * c * c * a * d / min(times)


def _measure_bandwidth(nbytes, bandwidth, reps):
    """Bytes/s of one ring shift of ``nbytes`` with nothing to hide it (slowest rank)."""
    from ..spmd.ring import RingComm
    x = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=current_device())
    ring = RingComm(None, overlap=True, bandwidth=bandwidth)
    times = []
    for _ in range(reps):
        dist.barrier()
        synchronize()
        t0 = time.perf_counter()
        ring.shift([x]).wait()
        synchronize()                           # NCCL: wait() only orders the stream
        times.append(slowest(time.perf_counter() - t0))
    return x.numel() * x.element_size() / min(times)


def cstar_sweep(a: int = 32, a_kv: int = 32, d: int = 64, dtype: str = "float32",
                causal: bool = False, bandwidth: float | None = None, target: int = 256,
                factors=(0.125, 0.25, 0.5, 1, 2, 4), reps: int = 3, pace: bool = True) -> dict:
    """Worker (2+ ranks): measure F and W, predict c*, sweep c; see the module docstring.

    ``bandwidth``: the paced link in bytes/s; None = chosen so that the prediction is
    ``target`` tokens. ``pace=False``: no pacing, the backend's real link (NCCL between
    GPUs); W is measured on a transfer of ``2 x target`` tokens. Returns ``{"F", "W_set",
    "W", "c_star", "rows": [...]}`` with one
    row per block size ``c``: ``compute_s`` / ``compute_no_overlap_s`` (round 0),
    ``transfer_s`` (``B / W``), ``exposed_s`` (overlapped), ``exposed_no_overlap_s`` (the
    whole transfer); each the fastest of ``reps`` runs of the slowest rank.
    """
    from ..spmd.ring import ring_attention, ring_options
    dt = torch_dtype(dtype)
    e = torch.empty((), dtype=dt).element_size()
    g = a / a_kv
    h = a * d
    F = _measure_flops(2 * target, a, a_kv, d, dt, reps)
    if not pace:
        W_set = None
        W = _measure_bandwidth(int(2 * 2 * target * h * e / g), None, reps)
    else:
        if bandwidth is None:      # the pace that puts c* at `target`: c* = F/W * corr
            bandwidth = F / target * cost.min_block_size(1.0, 1.0, causal, g, e)
        W_set = float(bandwidth)
        guess = cost.min_block_size(F, W_set, causal, g, e)
        W = _measure_bandwidth(int(2 * 2 * guess * h * e / g), W_set, reps)
    c_star = cost.min_block_size(F, W, causal, g, e)
    n, r = dist.get_world_size(), dist.get_rank()
    rows = []
    for f in factors:
        c = max(2, 2 * round(f * c_star / 2))                  # even, for zig-zag
        q, k, v = _block(c, a, d, dt, 3 + r), _block(c, a_kv, d, dt, 4 + r), _block(c, a_kv, d, dt, 5 + r)
        res = {}
        for overlap in (True, False):
            comp, wait = [], []
            for _ in range(reps + 1):                         # the first run warms up
                rounds: list[dict] = []
                dist.barrier()
                with ring_options(overlap=overlap, timings=rounds, bandwidth=W_set):
                    ring_attention(q, k, v, causal=causal, layout="zigzag")
                comp.append(slowest(rounds[0]["compute_s"]))
                wait.append(slowest(rounds[0]["wait_s"]))
            res[overlap] = (min(comp[1:]), min(wait[1:]))
        nbytes = 2 * c * (h / g) * e                           # one K and one V block
        rows.append({"c": c, "n": n, "compute_s": res[True][0], "transfer_s": nbytes / W,
                     "compute_no_overlap_s": res[False][0],
                     "exposed_s": res[True][1], "exposed_no_overlap_s": res[False][1],
                     "model_exposed_s": max(0.0, nbytes / W - 4 * c * c * h / F / (2 if causal else 1))})
    return {"F": F, "W_set": W_set, "W": W, "c_star": c_star, "causal": causal, "g": g, "e": e,
            "a": a, "a_kv": a_kv, "d": d, "dtype": dtype, "rows": rows}


def crossing(rows: list[dict]):
    """The block size where the measured compute per round first reaches the measured
    transfer (the wait with overlap off), interpolated linearly in ``log c`` and ``log``
    of the ratio between the sweep points around it; None if it never does in the sweep."""
    pts = [(r["c"], math.log(max(r["compute_no_overlap_s"], 1e-9) / max(r["exposed_no_overlap_s"], 1e-9)))
           for r in rows]
    for (c0, f0), (c1, f1) in zip(pts, pts[1:]):
        if f0 < 0 <= f1:
            t = -f0 / (f1 - f0)
            return math.exp(math.log(c0) + t * (math.log(c1) - math.log(c0)))
    return None


def cstar_table(res: dict) -> list[str]:
    c_meas = crossing(res["rows"])
    ok = c_meas is not None and 0.5 <= c_meas / res["c_star"] <= 2
    link = ("the backend's own link" if res["W_set"] is None
            else f"link paced at {res['W_set'] / 1e6:.1f} MB/s")
    head = [f"F (attention, per rank, all ranks at once) = {res['F'] / 1e9:.1f} "
            f"GFLOP/s; {link}, measured W = {res['W'] / 1e6:.1f} MB/s; "
            f"{res['dtype']} (e = {res['e']}), g = {res['g']:g}, "
            f"{'causal' if res['causal'] else 'no mask'}, a = {res['a']}, d = {res['d']}.", "",
            f"**Predicted** c* = cost.min_block_size(F, W, ...) = **{res['c_star']:.0f}** tokens; "
            f"**measured** crossing (compute per round = transfer per round) = "
            f"**{'none in the sweep' if c_meas is None else f'{c_meas:.0f}'}**"
            + ("" if c_meas is None else f" ({c_meas / res['c_star']:.2f} x the prediction)")
            + f". Within 2x: **{'yes' if ok else 'no'}**.", ""]
    rows = [[r["c"], f"{r['c'] / res['c_star']:.2f}", ms(r["compute_no_overlap_s"]),
             ms(r["exposed_no_overlap_s"]), ms(r["transfer_s"]), ms(r["exposed_s"]),
             ms(r["model_exposed_s"])] for r in res["rows"]]
    return head + [md_table(["c", "c / c*", "compute ms", "transfer (wait, no overlap) ms",
                             "B/W ms", "exposed, overlap ms", "model exposed ms"], rows), "",
                   "Below c* the overlapped ring still waits for most of each transfer; from "
                   "c* on the compute covers it and only the synchronisation floor remains.", ""]


def _plot(res, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = res["rows"]
    cs = [r["c"] for r in rows]
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    ax.plot(cs, [1e3 * r["compute_no_overlap_s"] for r in rows], "o-", label="compute per round")
    ax.plot(cs, [1e3 * r["exposed_no_overlap_s"] for r in rows], "s--", label="transfer per round")
    ax.plot(cs, [1e3 * max(r["exposed_s"], 1e-3 * 1e-3) for r in rows], "^-",
            label="exposed (overlapped)")
    ax.axvline(res["c_star"], color="grey", ls=":", label=f"predicted c* = {res['c_star']:.0f}")
    c_meas = crossing(rows)
    if c_meas:
        ax.axvline(c_meas, color="tab:red", ls="-.", lw=1, label=f"measured {c_meas:.0f}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("block size c (tokens per rank)")
    ax.set_ylabel("ms per round")
    ax.set_title("ring round: when does the transfer hide?")
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def bench(args, out_dir):
    """Launch :func:`cstar_sweep` on 2 ranks; write ``cstar.md`` and ``cstar.png``."""
    from ..spmd.launch import launch
    a = args.cstar_heads
    res = launch(cstar_sweep, 2, a=a, a_kv=args.kv_heads or a, d=args.dim,
                 dtype=args.dtype, causal=args.causal, bandwidth=args.bandwidth,
                 pace=not args.no_pace,
                 target=args.target, reps=args.reps, backend=args.backend, timeout=args.timeout,
                 threads=1, quiet=True)[0]
    text = ["# The c* experiment: the ring's transfer hides once c >= F/W", "",
            f"2 ranks x 1 thread, gloo; fastest of {args.reps} runs per point; {machine_note()}. "
            "Times per ring round (round 0: the rank's own block, while its K/V travel).", ""]
    text += cstar_table(res)
    write_table(out_dir / "cstar.md", text)
    if not args.no_plot and _plot(res, out_dir / "cstar.png"):
        print(f"wrote {out_dir / 'cstar.png'}")
    return res
