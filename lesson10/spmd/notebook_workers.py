"""Workers for notebook 06: each one runs a method on real ranks and checks it.

Pass them to :func:`lesson10.spmd.launch.launch`; they run inside every rank::

    from lesson10.spmd.launch import launch
    from lesson10.spmd import notebook_workers as nw
    res = launch(nw.ring_demo, 2)[0]       # rank 0's summary

Every worker draws the *whole* input from a seed, so each rank can compute the
single-process reference on its own, cuts out its shard, runs the parallel method,
and compares its part of the output and of the gradients with the reference.
Errors are all-reduced with MAX, so every rank returns the worst error over all
ranks. Bytes are what :func:`lesson10.spmd.comm.count_bytes` saw this rank send,
returned next to the closed form of :mod:`lesson10.cost` computed with the same
bytes per element ``e`` (8 for float64). Return values are small dicts of Python
numbers, one per rank (bytes may differ between ranks, e.g. in the MoE).

Collectives that only carry shapes or counts (``"metadata"``) and the all-reduce
of replicated weight gradients (``"param_grad"``) are reported apart from the
activation traffic that the lesson's formulas count, and so is SP's backward re-gather of
the LayerNorm output it kept only a shard of (``"ag_recompute"``).
"""
from __future__ import annotations

import math
import os
import socket
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist

from .. import cost
from . import comm
from .launch import current_device

__all__ = ["hello", "sp_demo", "ring_demo", "ulysses_demo", "ulysses_gqa_error",
           "moe_demo", "all_demos", "SIDE_OPS"]

#: ops that are not activation traffic: shape/count exchanges and weight-gradient sums
SIDE_OPS = ("metadata", "param_grad", "ag_recompute")

_DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


# ------------------------------------------------------------------ helpers
def _dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {name!r}")
    return _DTYPES[name]


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| (0.0 for empty tensors), computed on the CPU in float64."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).abs().max()) if a.numel() else 0.0


def _max_over_ranks(values: dict) -> dict:
    """Every float in ``values`` replaced by its maximum over all ranks (one all-reduce).

    Not counted by ``count_bytes`` (call it outside a counter): it is bookkeeping.
    """
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return dict(zip(keys, t.cpu().tolist()))


def _gather_floats(x: list[float]) -> list[list[float]]:
    """Every rank's list of floats (same length on every rank), in rank order."""
    t = torch.tensor(x, dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t)
    return [p.cpu().tolist() for p in parts]


def _split(by_op: dict) -> tuple[int, dict]:
    """(activation bytes, side bytes by op) from a counter's ``by_op``."""
    main = sum(v for k, v in by_op.items() if k not in SIDE_OPS)
    side = {k: v for k, v in by_op.items() if k in SIDE_OPS}
    return int(main), side


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _slowest(seconds: float) -> float:
    return _max_over_ranks({"t": seconds})["t"]


# -------------------------------------------------------------------- hello
def hello() -> dict:
    """Who am I: rank, world size, backend, process id, host, torch threads, device."""
    return {"rank": dist.get_rank(), "world": dist.get_world_size(),
            "backend": dist.get_backend(), "pid": os.getpid(), "host": socket.gethostname(),
            "threads": torch.get_num_threads(), "device": str(current_device())}


# ----------------------------------------------------------------------- SP
def sp_demo(b: int = 2, s: int = 8, h: int = 16, ffn: int = 32, p: float = 0.1,
            seed: int = 0, dtype: str = "float64") -> dict:
    """Plain TP and TP + SP on a stand-in layer, against one process.

    The layer is two ``SequenceParallelBlock`` s in a row (LayerNorm -> column-parallel
    -> GELU -> row-parallel -> dropout -> residual), the communication pattern of the
    attention block plus the MLP block of a transformer layer: 2 all-reduces
    forward under TP, 2 reduce-scatters + 2 all-gathers under SP.
    Input ``x (b, s, h)``; under SP rank ``r`` holds tokens ``r s/t .. (r+1) s/t - 1``.

    Returns ``{"tp": ..., "sp": ..., "tp_vs_sp", "formula_fwd", "t", "e"}``; per mode:
    ``out_err``, ``dx_err``, ``grad_err`` (largest over the weight gradients, this
    rank's shard of the reference's), ``fwd``/``bwd`` activation bytes, ``fwd_side``/
    ``bwd_side`` (metadata, param_grad, ag_recompute), ``tokens_per_rank`` of the LayerNorm input.
    ``tp_vs_sp``: largest difference between the TP output and the SP output
    all-gathered. ``formula_fwd = cost.comm_bytes("sp", s, h, t, e=e) * b``.
    """
    from .sp import ReferenceBlock, SequenceParallelBlock, sp_shard

    dt, dev = _dtype(dtype), current_device()
    t, r = dist.get_world_size(), dist.get_rank()
    if s % t:
        raise ValueError(f"s = {s} must be a multiple of the {t} ranks (SP splits the tokens)")
    refs = [ReferenceBlock(h, ffn, p, seed=seed + i, dropout_seed=99 + i, dtype=dt) for i in range(2)]
    g = torch.Generator().manual_seed(seed + 1000)
    x = torch.randn(b, s, h, generator=g, dtype=dt)
    dy = torch.randn(b, s, h, generator=g, dtype=dt)
    xr = x.clone().requires_grad_()
    yr = refs[1](refs[0](xr))
    yr.backward(dy)
    ffn_rows = slice(r * ffn // t, (r + 1) * ffn // t)
    e = torch.empty((), dtype=dt).element_size()
    res = {"t": t, "e": e, "formula_fwd": cost.comm_bytes("sp", s, h, t, e=e) * b,
           "shapes": {"b": b, "s": s, "h": h, "ffn": ffn, "p": p}}
    outs = {}
    for mode, sp in (("tp", False), ("sp", True)):
        blocks = [SequenceParallelBlock(h, ffn, sequence_parallel=sp, reference=ref).to(dev)
                  for ref in refs]
        tok = slice(r * s // t, (r + 1) * s // t) if sp else slice(None)
        xl = (sp_shard(x) if sp else x.clone()).to(dev).requires_grad_()
        with comm.count_bytes() as fwd:
            y = blocks[1](blocks[0](xl))
        with comm.count_bytes() as bwd:
            y.backward(dy[:, tok].to(dev))
        grad_err = 0.0
        for blk, ref in zip(blocks, refs):
            want = {"ln.weight": ref.ln.weight.grad, "ln.bias": ref.ln.bias.grad,
                    "fc1.weight": ref.fc1.weight.grad[ffn_rows], "fc1.bias": ref.fc1.bias.grad[ffn_rows],
                    "fc2.weight": ref.fc2.weight.grad[:, ffn_rows], "fc2.bias": ref.fc2.bias.grad}
            got = dict(blk.named_parameters())
            grad_err = max(grad_err, *(_err(got[k].grad, want[k]) for k in want))
        f_main, f_side = _split(fwd.by_op)
        b_main, b_side = _split(bwd.by_op)
        res[mode] = {"out_err": _err(y, yr[:, tok]), "dx_err": _err(xl.grad, xr.grad[:, tok]),
                     "grad_err": grad_err, "fwd": f_main, "bwd": b_main, "fwd_side": f_side,
                     "bwd_side": b_side, "fwd_by_op": dict(fwd.by_op),
                     "tokens_per_rank": xl.shape[1]}
        outs[mode] = y.detach()
    full_sp = comm.all_gather(outs["sp"], dim=1)         # outside any counter
    errs = _max_over_ranks({"tp_vs_sp": _err(outs["tp"], full_sp),
                            **{f"{m}.{k}": res[m][k] for m in ("tp", "sp")
                               for k in ("out_err", "dx_err", "grad_err")}})
    res["tp_vs_sp"] = errs.pop("tp_vs_sp")
    for key, v in errs.items():
        m, k = key.split(".")
        res[m][k] = v
    return res


# ------------------------------------------------------------- ring attention
def _reference_attention(q, k, v, causal: bool):
    """Plain softmax attention over the whole sequence, ``(b, s, a, d)``; GQA by repeating K/V."""
    g = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(g, dim=2), v.repeat_interleave(g, dim=2)
    x = torch.einsum("bqad,bkad->baqk", q, k) / math.sqrt(q.shape[-1])
    if causal:
        s = q.shape[1]
        x = x.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("baqk,bkad->bqad", x.softmax(-1), v)


def _qkv(b, s, a, a_kv, d, seed, dt):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, s, a, d, generator=g, dtype=dt)
    k = torch.randn(b, s, a_kv, d, generator=g, dtype=dt)
    v = torch.randn(b, s, a_kv, d, generator=g, dtype=dt)
    dout = torch.randn(b, s, a, d, generator=g, dtype=dt)
    return q, k, v, dout


def _check_method(fn, layout, b, s, a, a_kv, d, seed, dt, causal=True, **kw) -> dict:
    """Run ``fn`` (ring or Ulysses attention) on this rank's shard; errors + bytes."""
    from ..layouts import shard_positions

    dev = current_device()
    n, r = dist.get_world_size(), dist.get_rank()
    q, k, v, dout = _qkv(b, s, a, a_kv, d, seed, dt)
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    o_ref = _reference_attention(*ref, causal)
    o_ref.backward(dout)
    pos = torch.as_tensor(shard_positions(s, n, layout)[r], dtype=torch.long)
    loc = [t[:, pos].to(dev).requires_grad_() for t in (q, k, v)]
    with comm.count_bytes() as fwd:
        o = fn(*loc, causal=causal, layout=layout, **kw)
    with comm.count_bytes() as bwd:
        o.backward(dout[:, pos].to(dev))
    f_main, f_side = _split(fwd.by_op)
    b_main, _ = _split(bwd.by_op)
    errs = {"out_err": _err(o, o_ref[:, pos]), "dq_err": _err(loc[0].grad, ref[0].grad[:, pos]),
            "dk_err": _err(loc[1].grad, ref[1].grad[:, pos]),
            "dv_err": _err(loc[2].grad, ref[2].grad[:, pos])}
    return {**errs, "fwd": f_main, "bwd": b_main, "fwd_side": f_side,
            "fwd_by_op": dict(fwd.by_op), "tokens": pos.tolist()}


def _max_errors(cases: dict) -> None:
    """In place: the error fields of every case become their max over ranks."""
    flat = {f"{name}|{k}": v for name, c in cases.items() for k, v in c.items() if k.endswith("_err")}
    for key, v in _max_over_ranks(flat).items():
        name, k = key.split("|")
        cases[name][k] = v


def ring_demo(b: int = 1, s: int = 32, a: int = 4, a_kv: int = 2, d: int = 8, seed: int = 0,
              dtype: str = "float64", time_s: int = 1024, time_a: int = 4, time_d: int = 32,
              time_dtype: str = "float32", reps: int = 5, warmup: int = 1) -> dict:
    """Causal ring attention with the zig-zag and the contiguous layout.

    Check (``b, s, a, a_kv, d``, ``dtype``): output and dq, dk, dv of this rank's
    tokens vs full single-process attention; forward / backward bytes; the formula
    ``cost.comm_bytes("ring", s, a d, N_c, g=a/a_kv, e) * b``.
    Timing (``time_s, time_a, time_d``, MHA, ``time_dtype``; ``reps`` after ``warmup``,
    the layouts alternating rep by rep so drifts of a shared machine hit both):
    median fwd+bwd of the slowest rank, and every rank's total compute time.
    Returns ``{"check": {layout: ...}, "formula_fwd", "time": {layout: ...}, ...}``.
    """
    from .ring import ring_attention

    dt, dev = _dtype(dtype), current_device()
    n = dist.get_world_size()
    e = torch.empty((), dtype=dt).element_size()
    layouts = ("zigzag", "contiguous")
    check = {lay: _check_method(ring_attention, lay, b, s, a, a_kv, d, seed, dt) for lay in layouts}
    _max_errors(check)
    res = {"n": n, "e": e, "g": a // a_kv, "shapes": {"b": b, "s": s, "a": a, "a_kv": a_kv, "d": d},
           "check": check, "formula_fwd": cost.comm_bytes("ring", s, a * d, n, g=a // a_kv, e=e) * b}
    if reps <= 0:
        return res
    # timing: per-rank random shards (only the shapes matter)
    tdt = _dtype(time_dtype)
    c = time_s // n
    g = torch.Generator().manual_seed(seed + dist.get_rank())
    q, k, v, dout = (torch.randn(1, c, time_a, time_d, generator=g).to(tdt).to(dev) for _ in range(4))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    times = {lay: [] for lay in layouts}
    compute = {lay: [] for lay in layouts}
    for i in range(warmup + reps):
        for lay in layouts:
            tm: list = []
            q.grad = k.grad = v.grad = None
            dist.barrier()
            _sync(dev)
            t0 = time.perf_counter()
            o = ring_attention(q, k, v, causal=True, layout=lay, timings=tm, check=False)
            o.backward(dout)
            _sync(dev)
            dt_s = _slowest(time.perf_counter() - t0)
            if i >= warmup:
                times[lay].append(dt_s)
                compute[lay].append(sum(x["compute_s"] for x in tm))
    per_rank = _gather_floats([statistics.median(compute[lay]) for lay in layouts])
    res["time"] = {lay: {"median_s": statistics.median(times[lay]), "times": times[lay],
                         "compute_per_rank_s": [row[i] for row in per_rank]}
                   for i, lay in enumerate(layouts)}
    res["time_shapes"] = {"s": time_s, "a": time_a, "d": time_d, "dtype": time_dtype, "reps": reps}
    return res


# ------------------------------------------------------------------ Ulysses
def ulysses_demo(b: int = 1, s: int = 32, a: int = 4, a_kv: int = 2, d: int = 8, seed: int = 0,
                 dtype: str = "float64") -> dict:
    """Causal Ulysses attention, checked like :func:`ring_demo`, in three cases.

    ``"gqa"``: ``a`` query heads, ``a_kv`` K/V heads, contiguous layout;
    ``"gqa_zigzag"``: the same on the zig-zag layout (Ulysses accepts any layout);
    ``"replicated"``: one K/V head copied to ``lcm(1, N_c)`` heads (``replicate_kv``).
    Each case has ``formula_fwd = cost.comm_bytes("ulysses", s, a d, N_c, g, e) * b``
    with ``g`` = query heads per K/V head *as sent*; ``ring_formula_fwd`` is ring
    attention's bytes for the same shapes.
    """
    from .ulysses import ulysses_attention

    dt = _dtype(dtype)
    n = dist.get_world_size()
    e = torch.empty((), dtype=dt).element_size()
    h = a * d
    cases = {
        "gqa": dict(layout="contiguous", a_kv=a_kv, kw={}),
        "gqa_zigzag": dict(layout="zigzag", a_kv=a_kv, kw={}),
        "replicated": dict(layout="contiguous", a_kv=1, kw={"replicate_kv": True}),
    }
    out = {}
    for name, cs in cases.items():
        out[name] = _check_method(ulysses_attention, cs["layout"], b, s, a, cs["a_kv"], d, seed, dt,
                                  **cs["kw"])
        sent_kv = math.lcm(cs["a_kv"], n) if cs["kw"] else cs["a_kv"]   # K/V heads on the wire
        out[name].update(a_kv=cs["a_kv"], layout=cs["layout"], kv_heads_sent=sent_kv,
                         formula_fwd=cost.comm_bytes("ulysses", s, h, n, g=a / sent_kv, e=e) * b,
                         ring_formula_fwd=cost.comm_bytes("ring", s, h, n, g=a / cs["a_kv"], e=e) * b)
    _max_errors(out)
    return {"n": n, "e": e, "shapes": {"b": b, "s": s, "a": a, "a_kv": a_kv, "d": d}, "cases": out}


def ulysses_gqa_error(a: int = 4, a_kv: int = 1, c: int = 4, d: int = 8) -> None:
    """Ulysses with fewer K/V heads than ranks and no copying: raises the ValueError.

    Every rank raises it before any collective, so nothing hangs; ``launch`` turns
    it into one ``RankError`` whose ``.original`` is the ValueError.
    """
    from .ulysses import ulysses_attention

    q = torch.randn(1, c, a, d)
    kv = torch.randn(1, c, a_kv, d)
    ulysses_attention(q, kv, kv.clone())


# ---------------------------------------------------------------------- MoE
def _uniform_tokens(T: int, h: int, E: int, k: int, start: int, dt):
    """Tokens + router that route exactly uniformly: token ``t`` of a rank whose first
    expert offset is ``start`` picks experts ``start + t k + j (mod E)``, ``j < k``."""
    router_w = torch.eye(h, E, dtype=dt)
    x = torch.zeros(T, h, dtype=dt)
    for t in range(T):
        for j in range(k):
            x[t, (start + t * k + j) % E] = k - j      # decreasing: the order of choice
    return x, router_w


def _kept_copies(x, router_w, k: int, E: int, cf):
    """Independent routing bookkeeping on all ``N`` tokens: ``(experts (N, k), kept (N, k))``.

    Top-``k`` of ``x W_r`` (ties to the lower id), capacity ``ceil(CF k N / E)``
    applied first come, first served in (token, choice) order.
    """
    from fractions import Fraction

    logits = (x.to(router_w.dtype) @ router_w).cpu().numpy()
    N = logits.shape[0]
    experts = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    cap = None if cf is None else math.ceil(Fraction(repr(float(cf))) * k * N / E)
    seen = np.zeros(E, dtype=np.int64)
    kept = np.zeros_like(experts, dtype=bool)
    for t in range(N):
        for j in range(k):
            ex = experts[t, j]
            kept[t, j] = cap is None or seen[ex] < cap
            seen[ex] += 1
    return experts, kept, cap


def moe_demo(T: int = 16, h: int = 8, E: int = 4, k: int = 2, d_ff: int = 16, seed: int = 0,
             dtype: str = "float64", cases=None) -> dict:
    """Expert-parallel MoE (``ExpertParallelMoE``) on ``N_e`` ranks, ``T`` tokens each.

    ``cases``: list of ``(name, routing, capacity_factor)`` with routing ``"uniform"``
    (every rank sends ``kT/E`` copies to every expert) or ``"random"`` (a random
    router). Default: uniform dropless, random dropless, random with CF 1.0 and 1.25.
    Per case and rank: ``y_err``, ``dx_err`` vs ``moe_reference`` on all ``N_e T``
    tokens (max over ranks), ``dropped`` (the layer's count) and ``ref_dropped``
    (counted independently here), ``dropped_mine`` (dropped copies of this rank's
    tokens), ``capacity``, ``load`` per expert, ``fwd`` / ``bwd``
    token all-to-all bytes, ``remote_sent`` (this rank's kept copies whose expert
    lives on another rank: they leave in the dispatch), ``remote_received`` (kept
    copies of other ranks' tokens for this rank's experts: their outputs leave in the
    combine), ``row_bytes = h e``, and ``formula_fwd = cost.moe_a2a_bytes(k, T, h, N_e, e)``
    (uniform routing). Exactly: ``fwd = (remote_sent + remote_received) * row_bytes``.
    """
    from .moe import ExpertParallelMoE, init_moe_weights, moe_reference

    dt, dev = _dtype(dtype), current_device()
    n, r = dist.get_world_size(), dist.get_rank()
    if E % n:
        raise ValueError(f"E = {E} experts must be a multiple of the {n} ranks")
    El = E // n
    e = torch.empty((), dtype=dt).element_size()
    if cases is None:
        cases = [("uniform, no capacity", "uniform", None), ("random, no capacity", "random", None),
                 ("random, CF = 1.0", "random", 1.0), ("random, CF = 1.25", "random", 1.25)]
    out = {}
    for name, routing, cf in cases:
        router_w, w1, w2 = init_moe_weights(h, E, d_ff, seed, dt)
        g = torch.Generator().manual_seed(seed + 7)
        if routing == "uniform":
            if h < E:
                raise ValueError("uniform routing needs h >= E")
            x = torch.cat([_uniform_tokens(T, h, E, k, i, dt)[0] for i in range(n)])
            router_w = _uniform_tokens(1, h, E, k, 0, router_w.dtype)[1]
        elif routing == "random":
            x = torch.randn(n * T, h, generator=g, dtype=dt)
        else:
            raise ValueError(f"routing must be 'uniform' or 'random', got {routing!r}")
        dy = torch.randn(n * T, h, generator=g, dtype=dt)
        layer = ExpertParallelMoE(h, E, d_ff, k, capacity_factor=cf, router_w=router_w,
                                  w1=w1, w2=w2).to(dev)
        mine = slice(r * T, (r + 1) * T)
        xl = x[mine].clone().to(dev).requires_grad_()
        with comm.count_bytes() as fwd:
            y = layer(xl)
        with comm.count_bytes() as bwd:
            (y * dy[mine].to(dev)).sum().backward()
        xr = x.clone().requires_grad_()
        yr, _ = moe_reference(xr, router_w, w1, w2, k, cf)
        (yr * dy).sum().backward()
        experts, kept, cap = _kept_copies(x, router_w, k, E, cf)
        home = experts // El                                   # (N, k) rank of each expert
        owner = np.repeat(np.arange(n), T)[:, None]            # (N, 1) rank of each token
        sent = int(((owner == r) & (home != r) & kept).sum())
        received = int(((owner != r) & (home == r) & kept).sum())
        out[name] = {
            "routing": routing, "cf": cf, "capacity": cap,
            "y_err": _err(y, yr[mine]), "dx_err": _err(xl.grad, xr.grad[mine]),
            "dropped": int(layer.dropped), "ref_dropped": int((~kept).sum()),
            "dropped_mine": int(((owner == r) & ~kept).sum()),
            "copies": int(n * T * k), "load": layer.load.tolist(),
            "fwd": int(fwd.by_op.get("all_to_all", 0)), "bwd": int(bwd.by_op.get("all_to_all", 0)),
            "fwd_by_op": dict(fwd.by_op), "remote_sent": sent, "remote_received": received,
            "row_bytes": h * e,
            "formula_fwd": cost.moe_a2a_bytes(k, T, h, n, e=e),
        }
    _max_errors(out)
    return {"n": n, "e": e, "shapes": {"T": T, "h": h, "E": E, "k": k, "d_ff": d_ff}, "cases": out}


# ---------------------------------------------------------------- everything
def all_demos(sp: dict | None = None, ring: dict | None = None, ulysses: dict | None = None,
              moe: dict | None = None, gqa: dict | None = None) -> dict:
    """Every demo in one launch (for tests): keyword dicts per demo, ``None`` = defaults.

    ``gqa`` (the arguments of :func:`ulysses_gqa_error`) gives ``"gqa_error"``: the
    ``ValueError`` message, caught here.
    """
    res = {"hello": hello(), "sp": sp_demo(**(sp or {})), "ring": ring_demo(**(ring or {})),
           "ulysses": ulysses_demo(**(ulysses or {})), "moe": moe_demo(**(moe or {}))}
    try:
        ulysses_gqa_error(**(gqa or {}))
        res["gqa_error"] = None
    except ValueError as err:
        res["gqa_error"] = str(err)
    return res
