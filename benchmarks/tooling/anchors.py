"""Our methods against outside "anchor" implementations (issue 35), 2 ranks on gloo, fwd + bwd.

ring: our causal zig-zag ring attention vs lucidrains' ``ring_attention_pytorch`` (its CPU ring
``ring_flash_attn``, striped, and its ``zig_zag_attn``) and the floor (one process, SDPA over the
whole sequence, 2 threads); ulysses: ours vs DeepSpeed's ``DistributedAttention`` around the same
local SDPA, and the floor; moe: our ``ExpertParallelMoE`` vs fairscale's ``MOELayer`` +
``Top2Gate`` with our weights. Every rank 1 thread; reps interleaved (order reversed every rep),
the slowest rank's time, medians; before timing, outputs and gradients are compared on the same
global inputs (what was aligned: :data:`NOTES`). Writes ``benchmarks/results/anchors.md``
(``--only`` replaces one section). The anchors live in their own venv, which
``make bench-anchors`` installs (torch pinned, the anchors with ``--no-deps``) before it runs::

    make bench-anchors                              # all three sections, 5 reps
    make bench-anchors ANCHOR_ARGS="--reps 9 --only ring"
"""
from __future__ import annotations

import argparse
import os
import pickle
import socket
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

from lesson10.bench import harness
from lesson10.bench.attention import sdpa_once

B, S, A, D = 1, 4096, 8, 64
T, H, E, K, DFF = 4096, 512, 8, 2, 512
BUCKET = 512                                    # lucidrains' RingAttention default bucket_size
OUT = Path(__file__).resolve().parents[1] / "results" / "anchors.md"
FLOOR = "floor: SDPA, 1 process x 2 threads"
LOCAL = "each rank's local SDPA alone, no exchange"


# ------------------------------------------------------------------ attention helpers
def _sdpa_bshd(q, k, v):
    """The local attention DeepSpeed wraps: causal SDPA on ``(b, s, h, d)``."""
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          is_causal=True).transpose(1, 2)


def _striped_positions(n: int) -> torch.Tensor:
    """lucidrains' striping ('b (i j) d -> b (j i) d', i = bucket): every rank's global ids."""
    return torch.arange(S).reshape(BUCKET, S // BUCKET).t().reshape(n, -1)


def _rel(got, ref) -> list[float]:
    """max |a - b| / max |b| of every pair of tensors."""
    return [float((a - b).abs().max() / b.abs().max()) for a, b in zip(got, ref)]


def _to_global(x, pos, dim=1):
    """Every rank's shard ``x`` (positions ``pos`` along ``dim``) put back in token order."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    poss = [torch.empty_like(pos) for _ in parts]
    dist.all_gather(parts, x.contiguous())
    dist.all_gather(poss, pos)
    out = torch.empty_like(torch.cat(parts, dim))
    out.index_copy_(dim, torch.cat(poss), torch.cat(parts, dim))
    return out


def _attn_setup(section: str) -> dict:
    from lesson10.layouts import shard_positions
    n, r = dist.get_world_size(), dist.get_rank()
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(B, S, A, D, generator=g) for _ in range(4))   # global, every rank
    pos = {"ours": torch.as_tensor(shard_positions(S, n, "zigzag" if section == "ring" else "contiguous")[r])}
    pos["striped"] = _striped_positions(n)[r]
    full_z = torch.cat([torch.as_tensor(p) for p in shard_positions(S, n, "zigzag")])
    st = {"pos": pos, "full": (q, k, v, do), "mask": pos["ours"][:, None] >= full_z[None, :]}
    heads = slice(r * A // n, (r + 1) * A // n)           # Ulysses: this rank's heads, all tokens
    st["local"] = [t[:, :, heads].clone().requires_grad_() for t in (q, k, v)] + [do[:, :, heads].clone()]
    for name, p in pos.items():
        st[name] = [t[:, p].clone().requires_grad_() for t in (q, k, v)] + [do[:, p].clone()]
    return st


def _attn_run(method: str, st: dict, ds_attn=None):
    """fwd + bwd of ``method`` on this rank's shards; returns (out, leaves, positions)."""
    from lesson10.spmd.ring import ring_attention
    from lesson10.spmd.ulysses import ulysses_attention
    for t in (*st["ours"][:3], *st["striped"][:3], *st["local"][:3]):
        t.grad = None
    if method == LOCAL:
        q, k, v, do = st["local"]
        _sdpa_bshd(q, k, v).backward(do)
        return None
    if method == "lucidrains ring (striped)":
        from ring_attention_pytorch import ring_flash_attn
        q, k, v, do = st["striped"]
        out = ring_flash_attn(q, k, v, causal=True, bucket_size=BUCKET, ring_reduce_col=True,
                              striped_ring_attn=True)
        out.backward(do)
        return out, (q, k, v), st["pos"]["striped"]
    q, k, v, do = st["ours"]
    if method == "lucidrains zig_zag_attn":
        from ring_attention_pytorch.zig_zag_attention import zig_zag_attn
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))       # its (b, h, n, d): views
        out = zig_zag_attn(qt, kt, vt, attn_mask=st["mask"]).transpose(1, 2)
    elif method == "ours":
        out = ring_attention(q, k, v, causal=True, layout="zigzag")
    elif method.startswith("ours"):                               # Ulysses, default or 4 groups
        out = ulysses_attention(q, k, v, causal=True, layout="contiguous",
                                head_groups=4 if "4" in method else 1)
    else:                                                          # DeepSpeed
        out = ds_attn(q, k, v, 0)
    out.backward(do)
    return out, (q, k, v), st["pos"]["ours"]


def _attn_check(methods, st, ds_attn) -> dict:
    """Relative max |difference| of out, dq, dk, dv: each method vs SDPA over the whole sequence."""
    q, k, v, do = (t.clone().requires_grad_() for t in st["full"])
    _sdpa_bshd(q, k, v).backward(do)
    ref = [_sdpa_bshd(q.detach(), k.detach(), v.detach()), q.grad, k.grad, v.grad]
    errs = {}
    for m in methods:
        out, leaves, pos = _attn_run(m, st, ds_attn)
        got = [_to_global(t, pos) for t in (out.detach(), *(x.grad for x in leaves))]
        errs[m] = _rel(got, ref)
    return errs


# ------------------------------------------------------------------ MoE helpers
class _Expert(nn.Module):
    """fairscale's expert: our expert MLP ``relu(x W1) W2`` with our weights."""

    def __init__(self, w1, w2):
        super().__init__()
        self.w1, self.w2 = nn.Parameter(w1.clone()), nn.Parameter(w2.clone())

    def forward(self, x):
        return torch.relu(x @ self.w1) @ self.w2


def _moe_layers(router_w, w1, w2):
    from fairscale.nn import MOELayer, Top2Gate

    from lesson10.spmd.moe import ExpertParallelMoE
    ours = ExpertParallelMoE(H, E, DFF, K, router_w=router_w, w1=w1, w2=w2)
    gate = Top2Gate(H, E)
    with torch.no_grad():
        gate.wg.weight.copy_(router_w.t())
    el, r = E // dist.get_world_size(), dist.get_rank()
    experts = nn.ModuleList(_Expert(w1[e], w2[e]) for e in range(r * el, (r + 1) * el))
    return ours, MOELayer(gate, experts, group=dist.group.WORLD)


def _moe_run(layer, x, dy, fairscale: bool, aux: bool = True):
    """fwd + bwd of (y * dy).sum(), plus the layer's own balancing loss when ``aux``."""
    y = layer(x.reshape(len(layer.experts), -1, H)).reshape(x.shape) if fairscale else layer(x)
    loss = (y * dy).sum()
    if aux:
        loss = loss + (layer.l_aux if fairscale else layer.aux_loss)
    loss.backward()
    return y


def _moe_check() -> list[float]:
    """Tokens routed so that fairscale drops nothing (each expert gets exactly its capacity
    2T/E): relative max |difference| of y, dx, the router's and the experts' gradients (no aux loss:
    the two balancing losses are different formulas)."""
    from lesson10.spmd.moe import init_moe_weights
    r = dist.get_rank()
    g = torch.Generator().manual_seed(7)
    router_w = torch.zeros(H, E)
    router_w[torch.arange(E), torch.arange(E)] = 1.0
    _, w1, w2 = init_moe_weights(H, E, DFF)
    x = 0.1 * torch.randn(T, H, generator=g)
    t = torch.arange(T)
    x[t, (t + r) % E] += 4.0                                    # first choice
    x[t, (t + r + 1) % E] += 2.0                                # second choice
    dy = torch.randn(T, H, generator=g)
    res = []
    for fs, layer in zip((False, True), _moe_layers(router_w, w1, w2)):
        xx = x.clone().requires_grad_()
        y = _moe_run(layer, xx, dy, fs, aux=False)
        gr = layer.gate.wg.weight.grad.t().clone() if fs else layer.router_w.grad
        if fs:
            dist.all_reduce(gr)                                 # fairscale leaves it to DDP
            ew1 = torch.stack([e.w1.grad for e in layer.experts])
            ew2 = torch.stack([e.w2.grad for e in layer.experts])
        else:
            ew1, ew2 = layer.w1.grad, layer.w2.grad
        res.append([y.detach(), xx.grad, gr, ew1, ew2])
    return _rel(*res)


# ------------------------------------------------------------------ the worker
def _methods(section: str) -> list[str]:
    return {"ring": ["ours", "lucidrains ring (striped)", "lucidrains zig_zag_attn", FLOOR],
            "ulysses": ["ours (fused, 1 head group)", "ours (fused, 4 head groups)",
                        "DeepSpeed DistributedAttention", LOCAL, FLOOR],
            "moe": ["ours", "fairscale MOELayer + Top2Gate"]}[section]


def _worker(rank, world, port, section, reps, out_path):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    methods, ds_attn = _methods(section), None
    if section == "moe":
        import fairscale.nn.moe.top2gate as t2
        t2.gumbel_rsample = lambda shape, device: torch.zeros(shape, device=device)   # no noise
        err = dict.fromkeys(methods, _moe_check())
        from lesson10.spmd.moe import init_moe_weights
        layers = _moe_layers(*init_moe_weights(H, E, DFF, seed=0))
        x, dy = harness.moe_tokens(T, H, rank, 0, torch.float32)
        x.requires_grad_()

        def step(i):
            x.grad = None
            layers[i].zero_grad(set_to_none=True)
            return harness.timed(lambda: _moe_run(layers[i], x, dy, i == 1))
    else:
        if section == "ulysses":
            import deepspeed.comm
            from deepspeed.sequence.layer import DistributedAttention
            deepspeed.comm.init_distributed(dist_backend="gloo")
            ds_attn = DistributedAttention(_sdpa_bshd, dist.group.WORLD, scatter_idx=2, gather_idx=1)
        st = _attn_setup(section)
        err = _attn_check([m for m in methods if m not in (LOCAL, FLOOR)], st, ds_attn)
        floor_cfg, floor_st = {"b": B, "s": S, "a": A, "d": D, "causal": True}, dict[str, tuple]()

        def step(i):
            if methods[i] == FLOOR:
                return harness.one_process(world, sdpa_once, floor_st, floor_cfg)
            return harness.timed(lambda: _attn_run(methods[i], st, ds_attn))
    times: list[list[float]] = [[] for _ in methods]
    for rep in range(reps + 1):                                # rep 0: warm-up
        order = range(len(methods)) if rep % 2 else reversed(range(len(methods)))
        for i in order:
            t = step(i)
            if rep:
                times[i].append(t)
    if rank == 0:
        Path(out_path).write_bytes(pickle.dumps({"times": dict(zip(methods, times)), "err": err}))
    dist.barrier()
    dist.destroy_process_group()


def _launch(section: str, reps: int) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.pkl"
        load0 = os.getloadavg()[0]
        mp.spawn(_worker, args=(2, port, section, reps, str(out)), nprocs=2, join=True)
        res = pickle.loads(out.read_bytes())
    res["load"] = (load0, os.getloadavg()[0])
    return res


def _section(section: str, res: dict, reps: int) -> list[str]:
    med = {m: harness.median(ts) for m, ts in res["times"].items()}
    anchors = [m for m in med if not m.startswith("ours") and m not in (FLOOR, LOCAL)]
    cols = ([FLOOR] if FLOOR in med else []) + anchors
    ts = res["times"]

    def ratio(m, c):                       # ratio of medians (median of the per-rep ratios)
        return f"{med[m] / med[c]:.2f} ({harness.median([a / b for a, b in zip(ts[m], ts[c])]):.2f})"

    rows = [[m, harness.ms(t), *(ratio(m, c) for c in cols),
             " ".join(f"{e:.0e}" for e in res["err"][m]) if m in res["err"] else "" if m == LOCAL else "reference",
             " ".join(f"{1e3 * x:.0f}" for x in res["times"][m])] for m, t in med.items()]
    what = ("max abs difference, relative to the largest |value| of each tensor, of out, dq, dk, dv "
            "(gathered to token order) from one-process SDPA over the whole sequence" if section != "moe"
            else "the same of y, dx and the gradients of the router, W1 and W2, ours vs fairscale, on "
            "tokens routed so that fairscale drops none (each expert gets exactly its capacity 2T/E)")
    head = ["method", "median ms", *(f"/ {c.split(':')[0]}" for c in cols), "check", "every rep, ms"]
    return [f"## {section}", "", f"{reps} reps (+1 warm-up); load average (1 min) {res['load'][0]:.1f} "
            f"before, {res['load'][1]:.1f} after; {harness.machine_note()}. check = {what}.", "",
            "Ratio cells: ratio of the medians (median of the per-rep ratios, reps run back to back).", "",
            harness.md_table(head, rows), ""]


NOTES = """What was aligned, and what the checks found:

* ring: every method gets the same global q, k, v, dout (seeded), scale d^-1/2. Ours and
  lucidrains' zig_zag_attn take the same zig-zag shards (rank r: chunks r and 2N-1-r; zig_zag_attn
  in its (b, h, n, d) layout through transposed views, its mask from the positions as in its
  tests). lucidrains' ring (ring_flash_attn, the path its RingAttention takes without CUDA) has no
  zig-zag: it gets its own striped shards, the layout its module makes with buckets of 512.
  Outputs and gradients are gathered back to token order before they are compared.
* lucidrains 0.5.20, as shipped, returns wrong dK/dV (out and dQ agree): in ring_flash_attn's
  backward `dk, dv = dkv` (ring_flash_attention.py line 385) unpacks ring_pass's (received, sent)
  pair, and autograd sums the stacked (2, ...) tensor into K's shape: its dK is the true dK + dV
  (to 7e-7 at s = 1024). zig_zag_attn's AllGather backward (distributed.py lines 104-107) keeps
  this rank's slice of its own gradient and drops the other ranks' share of dK/dV (with an
  all-reduce added it agrees to 4e-7). Both are timed as shipped.
* ulysses: DeepSpeed's DistributedAttention(scatter_idx=2, gather_idx=1), batch_dim_idx=0,
  around causal SDPA on (b, s, h, d); deepspeed.comm.init_distributed("gloo") after torch's
  init (on CPU it JIT-builds its shm op once, untimed; all_to_all_single is torch's gloo one).
  The row "each rank's local SDPA alone" runs only the attention a rank does in Ulysses (its a/N
  heads over all s tokens, 1 thread) with no exchange: what any Ulysses costs on these ranks at best.
* moe: fairscale's Top2Gate with our router weight and no Gumbel noise on the second choice
  (so both take the top-2 logits, gates renormalised over the two), its experts our relu MLP
  with our weights, tokens reshaped (E/N, T N/E, h) as MOELayer requires; each layer's own
  balancing loss in the timed backward. fairscale keeps a fixed capacity 2T/E per expert and
  rank (with the random tokens timed it drops copies, at no change of its dense cost); ours is
  dropless.
"""


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--only", choices=["ring", "ulysses", "moe"])
    args = p.parse_args(argv)
    old = OUT.read_text().split("\n## ") if args.only and OUT.exists() else []
    sections = {c.split("\n", 1)[0]: "## " + c.rstrip("\n") + "\n" for c in old[1:]}
    for section in [args.only] if args.only else ["ring", "ulysses", "moe"]:
        sections[section] = "\n".join(_section(section, _launch(section, args.reps), args.reps))
        print(sections[section], flush=True)
    text = ["# Our methods vs outside anchors (issue 35)", "",
            "2 ranks on gloo, 1 thread each, forward + backward, float32; reps interleaved (the order "
            "reversed every rep); medians of the slowest rank; the floor is one process running SDPA "
            "over the whole sequence on 2 threads, in the same launch. Quote the ratios, not the ms: "
            "the 2-core machine is shared.", "", NOTES]
    text += [sections[s] for s in ("ring", "ulysses", "moe") if s in sections]
    OUT.write_text("\n".join(text))
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
