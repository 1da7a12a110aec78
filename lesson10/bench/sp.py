"""``python -m lesson10 bench sp``: one LN+MLP block, TP vs TP + SP: time, bytes (equal)
and the activation memory autograd saves per rank, next to the lesson's terms
(:func:`lesson10.cost.sp_block_activation_bytes`; ``sp.md``)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from .. import cost
from ..spmd.comm import ByteCounter, count_bytes
from ..spmd.device import current_device, torch_dtype
from .harness import interleaved, machine_note, md_table, median, ms, run_configs, timed, write_table

__all__ = ["time_sp", "sp_table", "bench"]


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


def _sp_step(cfg, st):
    """One timed fwd+bwd of ``cfg``; on the first call also the bytes and the saved memory."""
    from ..spmd.sp import SequenceParallelBlock, sp_shard
    if "block" not in st:
        dt, device = torch_dtype(cfg.get("dtype", "float32")), current_device()
        b, s, h = cfg["b"], cfg["s"], cfg["h"]
        blk = SequenceParallelBlock(h, cfg["ffn"], sequence_parallel=cfg["sp"],
                                    p=cfg.get("p", 0.1), seed=cfg.get("seed", 0), dtype=dt).to(device)
        g = torch.Generator().manual_seed(cfg.get("seed", 0) + 1)
        x = torch.randn(b, s, h, generator=g, dtype=torch.float64).to(dt)
        dy = torch.randn(b, s, h, generator=g, dtype=torch.float64).to(dt)
        if cfg["sp"]:
            x, dy = sp_shard(x), sp_shard(dy)
        st.update(block=blk, x=x.to(device).requires_grad_(), dy=dy.to(device))
        # one extra step: the bytes sent and the memory saved for the backward
        hooks, seen = _saved_bytes(list(blk.parameters()))
        with count_bytes() as fwd, hooks:
            y = blk(st["x"])
        st["saved"] = sum(seen.values())
        with count_bytes() as bwd:
            y.backward(st["dy"])
        st["fwd"], st["bwd"] = dict(fwd.by_op), dict(bwd.by_op)
        probe = st["x"].detach()[:1, :1]
        st["stats_elem"] = torch.native_layer_norm(probe, (h,), None, None, 1e-5)[1].element_size()
    if not cfg.get("time", True):
        return None
    blk, x, dy = st["block"], st["x"], st["dy"]
    blk.zero_grad(set_to_none=True)
    x.grad = None
    return timed(lambda: blk(x).backward(dy))


def time_sp(configs: list[dict], reps: int = 5, warmup: int = 1) -> list[dict]:
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
    n = dist.get_world_size()
    times, states = interleaved(configs, _sp_step, reps, warmup)
    rows = []
    for cfg, ts, st in zip(configs, times, states):
        saved = torch.tensor([st["saved"]], dtype=torch.int64, device=current_device())
        dist.all_reduce(saved, op=dist.ReduceOp.MAX)
        rows.append({**cfg, "n": n, "times": ts, "median_s": median(ts),
                     "bytes_fwd_by_op": st["fwd"], "bytes_bwd_by_op": st["bwd"],
                     "saved_bytes": int(saved), "stats_elem": st["stats_elem"],
                     "elem": torch.empty((), dtype=torch_dtype(cfg.get("dtype", "float32"))).element_size()})
    return rows


def _act_bytes(by_op: dict) -> int:
    return ByteCounter(by_op=dict(by_op)).activation


def _sp_counts(r: dict) -> dict:
    """The count of a :func:`time_sp` row, in bytes: ``"code"`` (this code's terms:
    its dtype, 1-byte mask, fc1 input kept as a shard, LayerNorm statistics), ``"stats"``
    (the LayerNorm statistics alone), ``"lesson"`` (bf16, 1-byte mask, no statistics)."""
    s, b, h, n, sp, e = r["s"], r["b"], r["h"], r["n"], r["sp"], r["elem"]
    mult = r["ffn"] // h if r["ffn"] % h == 0 else r["ffn"] / h
    stats = 2 * r["stats_elem"]
    code = cost.sp_block_activation_bytes(s, b, h, n, sp, e=e, mask_bytes=1, ffn_mult=mult,
                                     stats_bytes=stats)
    return {"code": code, "stats": s * b * stats / (n if sp else 1),
            "lesson": cost.sp_block_activation_bytes(s, b, h, n, sp, e=2, mask_bytes=1, ffn_mult=mult)}


def sp_table(rows: list[dict]) -> str:
    """Markdown for the SP benchmark from :func:`time_sp` rows (timed rows in the
    first table; every row, timed or memory-only, in the memory tables)."""
    t1, t2 = [], []
    by = {(r["n"], r.get("dtype", "float32"), r["sp"]): r for r in rows}
    for (n, dt, sp), r in sorted(by.items()):
        s, b, h, e = r["s"], r["b"], r["h"], r["elem"]
        sbh = s * b * h
        mode = "TP + SP" if sp else "TP"
        bwd = r["bytes_bwd_by_op"]
        if r["median_s"] is not None:
            t1.append([n, mode, dt, ms(r["median_s"]), f"{_act_bytes(r['bytes_fwd_by_op']):,}",
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
           md_table(["t", "mode", "dtype", "fwd+bwd ms", "activation bytes/rank fwd", "bwd",
                      "+ re-gather of the fc1 input (SP only)",
                      "+ LN/bias grad all-reduce (SP only)",
                      "cost.comm_bytes('sp')/2 (one of a layer's two all-reduces)"], t1), "",
           "## Activation memory saved for the backward, per rank", "",
           md_table(["t", "mode", "dtype", "measured bytes", "this code's count (bytes)",
                      "of which LN mean+1/std", "measured / sbh",
                      "(measured - LN stats) / sbh",
                      "lesson's terms for LN+MLP+dropout / sbh (bf16, 1-byte mask)",
                      "cost.activation_bytes / sbh (whole layer, flash)"], t2), "",
           md_table(["t", "dtype", "SP / TP measured", "SP / TP measured without LN stats",
                      "SP / TP lesson's block terms", "SP / TP cost.activation_bytes (layer)",
                      "time TP / TP+SP"], ratio), ""]
    return "\n".join(out)


def bench(args, out_dir):
    """Launch :func:`time_sp` for every ``--nproc``; write ``sp.md``."""
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
        rows += run_configs(time_sp, n, configs, args)
    text = ["# Sequence parallelism benchmark: TP vs TP + SP (gloo on CPU unless NCCL was chosen)", "",
            f"One `SequenceParallelBlock` (LayerNorm -> column-parallel fc1 -> GELU -> "
            f"row-parallel fc2 -> dropout p=0.1 -> residual), b={b}, s={s}, h={h}, ffn={ffn}, "
            f"{args.dtype}; every rank 1 thread; median of {args.reps} reps after one warm-up, "
            f"each rep the slowest rank; {machine_note()}.", "",
            "Bytes: what each rank sends for activations (shape checks and the SP-only "
            "all-reduce of the LayerNorm and fc2-bias gradients shown apart). TP: one "
            "all-reduce each way; TP + SP: an all-gather and a reduce-scatter each way, the same "
            "bytes, plus in the backward the re-gather of the fc1 input ((t-1)/t of sbh e, "
            "shown apart), the price of storing only its s/t shard. This block is half a "
            "transformer layer (no attention), so it sends half of "
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
    write_table(out_dir / "sp.md", text)
    return rows
