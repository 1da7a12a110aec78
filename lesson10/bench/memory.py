"""``python -m lesson10 bench memory``: a rank's peak memory in ring attention at a fixed
block ``c`` while ``s = N_c c`` and ``N_c`` grow together. The lesson: it stays flat.

For each ``N_c`` one launch (fresh processes): every rank builds its shard (``c`` tokens of
Q, K, V), notes its memory high-water mark, runs causal zig-zag ring attention forward +
backward once, and reports how far the high-water mark rose. On GPUs that is
``torch.cuda.max_memory_allocated``; on CPU the process's peak resident set
(``getrusage``), which is coarser (pages, allocator caches) but shows the trend. Next to it,
what one process attending over all ``s`` tokens must hold just for Q, K, V and dO: it
grows with ``s``. A rank holds its blocks, the output and gradients, and two K/V blocks in
flight (from ``N_c = 3`` on, the one it computes on and the one arriving): flat in
``N_c``. Writes ``memory.md``.
"""
from __future__ import annotations

import resource
import sys

import torch
import torch.distributed as dist

from ..spmd.device import current_device, torch_dtype
from .harness import machine_note, md_table, write_table

__all__ = ["ring_peak_memory", "memory_table", "bench"]


def _peak_bytes() -> int:
    if torch.cuda.is_available() and current_device().type == "cuda":
        return int(torch.cuda.max_memory_allocated())
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss) * (1 if sys.platform == "darwin" else 1024)     # Linux reports KiB


def _rise(step) -> int:
    before = _peak_bytes()
    step()
    if current_device().type == "cuda":
        torch.cuda.synchronize()
    return _peak_bytes() - before


def ring_peak_memory(c: int = 4096, a: int = 8, d: int = 64, dtype: str = "float32") -> dict:
    """Worker: the rise of this rank's memory high-water mark during one causal zig-zag
    ring attention fwd+bwd on ``c`` local tokens (max over ranks), in bytes."""
    from ..spmd.ring import ring_attention
    n, dev, dt = dist.get_world_size(), current_device(), torch_dtype(dtype)
    g = torch.Generator().manual_seed(dist.get_rank())
    q, k, v = (torch.randn(1, c, a, d, generator=g).to(dt).to(dev).requires_grad_() for _ in range(3))
    dout = torch.randn(1, c, a, d, generator=g).to(dt).to(dev)
    dist.barrier()
    ring = _rise(lambda: ring_attention(q, k, v, causal=True, layout="zigzag").backward(dout))
    t = torch.tensor([ring], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return {"n": n, "c": c, "s": n * c, "ring_rise": int(t),
            "inputs": 4 * q.numel() * q.element_size()}


def memory_table(rows: list[dict]) -> str:
    mb = 1e6
    body = [[r["n"], r["c"], r["s"], f"{r['inputs'] / mb:.1f}", f"{r['ring_rise'] / mb:.1f}",
             f"{r['n'] * r['inputs'] / mb:.1f}"] for r in rows]
    return md_table(["N_c", "c", "s = N_c c", "ring: Q,K,V,dO per rank MB",
                     "ring: peak rise per rank MB", "one process over s: Q,K,V,dO MB"], body)


def bench(args, out_dir):
    """One launch per ``--nproc`` (fresh processes); write ``memory.md``. On CPU the ranks
    get ``MALLOC_MMAP_THRESHOLD_=131072`` (glibc): large tensors are then mapped and unmapped
    one by one, so the resident set follows the live tensors instead of the allocator's
    reused heap, which otherwise only grows."""
    import os

    from ..spmd.launch import launch
    old = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "131072"
    try:
        rows = [launch(ring_peak_memory, n, c=args.block, a=args.heads, d=args.dim,
                       dtype=args.dtype, backend=args.backend, timeout=args.timeout, threads=1,
                       quiet=True)[0] for n in args.nproc]
    finally:
        if old is None:
            os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = old
    text = ["# Ring attention: peak memory per rank at a fixed block c", "",
            f"Causal zig-zag ring, forward + backward, c = {args.block} tokens per rank, "
            f"heads={args.heads}, d={args.dim}, {args.dtype}; {machine_note()}. Peak rise: how far "
            "the process's memory high-water mark rose during one step (CPU: resident set, "
            "coarse; GPU: max_memory_allocated). The ring's column should stay flat as N_c "
            "and s grow together (from N_c = 3 on two K/V blocks are in flight: the one a "
            "rank computes on and the one arriving); one process would have to hold all s "
            "tokens.", "",
            memory_table(rows), ""]
    write_table(out_dir / "memory.md", text)
    return rows
