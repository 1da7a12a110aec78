"""Worker functions for :func:`lesson10.spmd.launch.launch`: the tests and `python -m lesson10 run`.

A spawned rank imports its worker by name, so workers live here, at module level.
Each takes plain arguments and returns plain Python / CPU tensors. The ``*_cases``
workers run many cases in one launch (starting ranks costs seconds) and return,
per case, the errors against a single-process reference and the bytes by op.

``torchrun --nproc-per-node N -m lesson10.spmd._workers`` runs :func:`all_reduce_rank`
under torchrun (a smoke test of :func:`lesson10.spmd.launch.init_from_env`).
"""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def whoami() -> dict:
    """Rank facts: rank, world size, backend, env vars, threads, pid."""
    return {
        "rank": dist.get_rank(), "world": dist.get_world_size(),
        "backend": dist.get_backend(), "pid": os.getpid(),
        "env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                 "MASTER_ADDR", "MASTER_PORT")},
        "threads": torch.get_num_threads(),
    }


def all_reduce_rank(scale: float = 1.0) -> torch.Tensor:
    """All-reduce of ``scale * (rank + 1)``: sum_{r<n} scale (r + 1) on every rank."""
    x = torch.tensor([scale * (dist.get_rank() + 1.0)], dtype=torch.float64, device=_dev())
    dist.all_reduce(x)
    return x


def fail_on(rank: int, pid_dir: str | None = None) -> None:
    """Rank ``rank`` raises ValueError; the others wait in an all-reduce it never joins."""
    if pid_dir:
        with open(os.path.join(pid_dir, f"{dist.get_rank()}.pid"), "w") as f:
            f.write(str(os.getpid()))
    if dist.get_rank() == rank:
        raise ValueError(f"deliberate failure in rank {rank}")
    x = torch.ones(1, device=_dev())
    dist.all_reduce(x)  # never completes: rank `rank` is gone


def exit_on(rank: int, code: int = 3) -> None:
    """Rank ``rank`` dies without a word (``os._exit``); the others wait in an all-reduce."""
    if dist.get_rank() == rank:
        os._exit(code)
    x = torch.ones(1, device=_dev())
    dist.all_reduce(x)


def hang_on(rank: int, pid_dir: str | None = None) -> None:
    """Every rank but ``rank`` calls an all-reduce; ``rank`` sleeps: a collective nobody answers."""
    if pid_dir:
        with open(os.path.join(pid_dir, f"{dist.get_rank()}.pid"), "w") as f:
            f.write(str(os.getpid()))
    if dist.get_rank() == rank:
        time.sleep(3600)
    x = torch.ones(1, device=_dev())
    dist.all_reduce(x)


# ------------------------------------------------------------------ helpers
def _maxerr(a, b) -> float:
    return float((a.detach().double() - b.detach().double()).abs().max()) if a.numel() else 0.0


def _dev() -> torch.device:
    """This rank's device: its GPU under NCCL, else the CPU (so the same workers run on both)."""
    from .launch import current_device
    return current_device()


def _grads(module):
    return {n: p.grad.detach().clone() for n, p in module.named_parameters()}


# ----------------------------------------------------------------------- SP
def sp_cases(cases: list[dict]) -> list[dict]:
    """Run SequenceParallelBlock cases against a single-process ReferenceBlock.

    Each case: ``b, s, h, ffn, sp (bool), p, dtype ("float64"/"float32"), seed``.
    Returns per case the max errors of output, input gradient and every parameter
    gradient (this rank's shard of the reference gradient), and the bytes sent
    forward and backward by op; a case that raises ValueError returns ``{"error": ...}``.
    """
    out = []
    for case in cases:
        try:
            out.append(_sp_case(case))
        except ValueError as e:
            out.append({"case": case, "error": str(e)})
    return out


def _sp_case(case: dict) -> dict:
    from . import comm
    from .sp import ReferenceBlock, SequenceParallelBlock, sp_shard

    n, r = dist.get_world_size(), dist.get_rank()
    dtype = getattr(torch, case.get("dtype", "float64"))
    b, s, h, ffn = case["b"], case["s"], case["h"], case["ffn"]
    p, sp, seed = case.get("p", 0.0), case["sp"], case.get("seed", 0)
    dev = _dev()
    ref = ReferenceBlock(h, ffn, p, seed=seed, dtype=dtype).to(dev)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(b, s, h, generator=g, dtype=dtype).to(dev)
    dy = torch.randn(b, s, h, generator=g, dtype=dtype).to(dev)
    xr = x.clone().requires_grad_()
    yr = ref(xr)
    yr.backward(dy)
    blk = SequenceParallelBlock(h, ffn, sequence_parallel=sp, reference=ref)
    if sp:
        xl, dyl = sp_shard(x), sp_shard(dy)
        tok = slice(r * s // n, (r + 1) * s // n)
    else:
        xl, dyl, tok = x.clone(), dy, slice(None)
    xl.requires_grad_()
    with comm.count_bytes() as fwd:
        y = blk(xl)
    with comm.count_bytes() as bwd:
        y.backward(dyl)
    rg = _grads(ref)
    rows = slice(r * ffn // n, (r + 1) * ffn // n)
    want = {"ln.weight": rg["ln.weight"], "ln.bias": rg["ln.bias"],
            "fc1.weight": rg["fc1.weight"][rows], "fc1.bias": rg["fc1.bias"][rows],
            "fc2.weight": rg["fc2.weight"][:, rows], "fc2.bias": rg["fc2.bias"]}
    got = _grads(blk)
    return {
        "case": case, "out_err": _maxerr(y, yr[:, tok]), "dx_err": _maxerr(xl.grad, xr.grad[:, tok]),
        "grad_err": {k: _maxerr(got[k], want[k]) for k in want},
        "fwd": dict(fwd.by_op), "bwd": dict(bwd.by_op),
        "dropped": float((yr - xr == 0).double().mean()) if p else 0.0,
    }


# ------------------------------------------------------------------ Ulysses
def reference_attention(q, k, v, causal: bool):
    """Plain softmax attention on the whole sequence, ``(b, s, a, d)``; K/V heads repeated (GQA)."""
    g = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(g, dim=2)
    v = v.repeat_interleave(g, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5
    if causal:
        s = q.shape[1]
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)


def ulysses_cases(cases: list[dict]) -> list[dict]:
    """Run ulysses_attention cases against :func:`reference_attention` on the full sequence.

    Each case: ``b, s, a, n_kv, d, causal, layout, dtype, replicate_kv, seed``.
    Returns max errors of the output and of dq, dk, dv (this rank's tokens), and the
    forward / backward bytes by op. A case that raises returns ``{"error": message}``;
    ``{"mismatch": True}`` runs :func:`ulysses_mismatch`.
    """
    import numpy as np

    from . import comm
    from ..layouts import shard_positions
    from .ulysses import ulysses_attention

    out = []
    n, r = dist.get_world_size(), dist.get_rank()
    for case in cases:
        if case.get("mismatch"):
            out.append({"case": case, "error": ulysses_mismatch()})
            continue
        dtype = getattr(torch, case.get("dtype", "float64"))
        b, s, a, n_kv, d = case["b"], case["s"], case["a"], case["n_kv"], case["d"]
        causal, layout = case.get("causal", True), case.get("layout", "contiguous")
        g = torch.Generator().manual_seed(case.get("seed", 0))
        q, dout = (torch.randn(b, s, a, d, generator=g, dtype=dtype).to(_dev()) for _ in range(2))
        k, v = (torch.randn(b, s, n_kv, d, generator=g, dtype=dtype).to(_dev()) for _ in range(2))
        try:
            pos = torch.from_numpy(np.asarray(shard_positions(s, n, layout)[r]))
        except ValueError:  # let ulysses_attention itself reject the layout
            pos = torch.arange(r * (s // n), (r + 1) * (s // n))
        pos = pos.to(_dev())
        qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
        ref = reference_attention(qr, kr, vr, causal)
        ref.backward(dout)
        ql, kl, vl = (t[:, pos].clone().requires_grad_() for t in (q, k, v))
        try:
            with comm.count_bytes() as fwd:
                o = ulysses_attention(ql, kl, vl, causal=causal, layout=layout,
                                      replicate_kv=case.get("replicate_kv", False))
            with comm.count_bytes() as bwd:
                o.backward(dout[:, pos])
        except ValueError as e:
            out.append({"case": case, "error": str(e)})
            continue
        out.append({
            "case": case, "out_err": _maxerr(o, ref[:, pos]),
            "dq_err": _maxerr(ql.grad, qr.grad[:, pos]), "dk_err": _maxerr(kl.grad, kr.grad[:, pos]),
            "dv_err": _maxerr(vl.grad, vr.grad[:, pos]),
            "fwd": dict(fwd.by_op), "bwd": dict(bwd.by_op),
        })
    return out


def ulysses_mismatch(b: int = 1, c: int = 4, a: int = 4, d: int = 8) -> str:
    """Rank 0 passes one token more than the others: every rank must get a ValueError."""
    from .ulysses import ulysses_attention
    cc = c + (1 if dist.get_rank() == 0 else 0)
    q = torch.randn(b, cc, a, d, device=_dev())
    try:
        ulysses_attention(q, q, q)
    except ValueError as e:
        return str(e)
    return "no error"


# ---------------------------------------------------------------------- MoE
def uniform_router_tokens(T: int, h: int, E: int, k: int, start: int = 0, dtype=torch.float64):
    """Tokens and a router that route *exactly* uniformly (for byte checks).

    ``router_w`` = the first ``E`` columns of the identity ``(h, E)``; token ``t`` is
    ``sum_j (k - j) e_{(start + t k + j) mod E}``, so its top-``k`` experts are
    ``start + t k .. start + t k + k - 1 (mod E)``: with ``k T`` a multiple of ``E``
    every expert gets ``k T / E`` copies from every rank.
    """
    if h < E:
        raise ValueError("uniform routing construction needs h >= E")
    router_w = torch.eye(h, E, dtype=dtype)
    x = torch.zeros(T, h, dtype=dtype)
    for t in range(T):
        for j in range(k):
            x[t, (start + t * k + j) % E] = k - j
    return x, router_w


def moe_cases(cases: list[dict]) -> list[dict]:
    """Run ExpertParallelMoE cases against :func:`lesson10.spmd.moe.moe_reference`.

    Case keys: ``T`` (tokens per rank, or a list per rank), ``h, E, d_ff, k``, ``cf``
    (capacity factor), ``dtype``, ``seed``, ``alpha``, ``bias`` (list, routing bias),
    ``uniform`` (use :func:`uniform_router_tokens`), ``rate`` (bias update to report).
    Returns errors of y, dx, router / w1 / w2 gradients and aux loss, the loads,
    the bytes by op, and, for float64, the error against ``lesson10.sim.moe``.
    """
    import numpy as np

    from . import comm
    from .moe import ExpertParallelMoE, init_moe_weights, moe_reference

    out = []
    n, r = dist.get_world_size(), dist.get_rank()
    for case in cases:
        dtype = getattr(torch, case.get("dtype", "float64"))
        h, E, d_ff, k = case["h"], case["E"], case["d_ff"], case["k"]
        cf, alpha, seed = case.get("cf"), case.get("alpha", 0.5), case.get("seed", 0)
        Ts = case["T"] if isinstance(case["T"], list) else [case["T"]] * n
        dev = _dev()
        router_w, w1, w2 = init_moe_weights(h, E, d_ff, seed, dtype)
        g = torch.Generator().manual_seed(seed + 7)
        if case.get("uniform"):
            parts = [uniform_router_tokens(Ts[i], h, E, k, start=i, dtype=dtype)[0] for i in range(n)]
            router_w = uniform_router_tokens(1, h, E, k, dtype=router_w.dtype)[1]
            x = torch.cat(parts)
        else:
            x = torch.randn(sum(Ts), h, generator=g, dtype=dtype)
        dy = torch.randn(sum(Ts), h, generator=g, dtype=dtype)
        x, dy, router_w, w1, w2 = (t.to(dev) for t in (x, dy, router_w, w1, w2))
        bias = torch.tensor(case["bias"], dtype=router_w.dtype, device=dev) if "bias" in case else None
        lo, hi = sum(Ts[:r]), sum(Ts[:r + 1])
        try:
            layer = ExpertParallelMoE(h, E, d_ff, k, capacity_factor=cf, router_w=router_w,
                                      w1=w1, w2=w2, alpha=alpha)
        except ValueError as e:
            out.append({"case": case, "error": str(e)})
            continue
        if bias is not None:
            layer.bias.copy_(bias)
        xl = x[lo:hi].clone().requires_grad_()
        with comm.count_bytes() as fwd:
            y = layer(xl)
        with comm.count_bytes() as bwd:
            ((y * dy[lo:hi]).sum() + layer.aux_loss).backward()
        aux_total = layer.aux_loss.detach().clone()
        dist.all_reduce(aux_total)
        # single-process reference with the same weights
        ref_params = [t.clone().requires_grad_() for t in (x, router_w, w1, w2)]
        xr, rw, rw1, rw2 = ref_params
        yr, auxr = moe_reference(xr, rw, rw1, rw2, k, cf, bias, alpha)
        ((yr * dy).sum() + auxr).backward()
        El = E // n
        res = {
            "case": case, "y_err": _maxerr(y, yr[lo:hi]), "dx_err": _maxerr(xl.grad, xr.grad[lo:hi]),
            "router_grad_err": _maxerr(layer.router_w.grad, rw.grad),
            "w1_grad_err": _maxerr(layer.w1.grad, rw1.grad[r * El:(r + 1) * El]),
            "w2_grad_err": _maxerr(layer.w2.grad, rw2.grad[r * El:(r + 1) * El]),
            "w_grad_zero": [bool((layer.w1.grad[e] == 0).all()) for e in range(El)],
            "aux_err": abs(float(aux_total) - float(auxr.detach())), "aux": float(aux_total),
            "load": layer.load.tolist(), "counts": layer.counts.tolist(), "dropped": layer.dropped,
            "fwd": dict(fwd.by_op), "bwd": dict(bwd.by_op), "T": Ts[r],
            "elem": torch.empty((), dtype=dtype).element_size(),
        }
        if dtype == torch.float64:
            from ..sim.moe import moe_reference as sim_ref, switch_aux_loss as sim_aux
            from ..sim.moe import route_topk as sim_route
            x, router_w, w1, w2 = (t.cpu() for t in (x, router_w, w1, w2))
            bias_np = None if bias is None else bias.cpu().numpy()
            experts = [(w1[e].numpy(), w2[e].numpy()) for e in range(E)]
            ys = sim_ref(x.numpy(), router_w.numpy(), experts, k, cf, bias_np)
            res["sim_err"] = float(np.abs(ys[lo:hi] - y.detach().cpu().numpy()).max(initial=0.0))
            logits = x.numpy() @ router_w.numpy()
            ch, _ = sim_route(logits, k, bias_np)
            p = np.exp(logits - logits.max(1, keepdims=True))
            res["sim_aux_err"] = abs(sim_aux(p / p.sum(1, keepdims=True), ch, alpha) - float(aux_total))
        if "rate" in case:
            from ..sim.moe import update_expert_bias as sim_update
            before = layer.bias.cpu().clone()
            new = layer.update_bias(case["rate"]).cpu().clone()
            res["bias_err"] = float(np.abs(sim_update(before.numpy(), layer.load.cpu().numpy(),
                                                      case["rate"]) - new.numpy()).max())
            res["bias_changed"] = bool((new != before).any())
        out.append(res)
    return out


# ---------------------------------------------------------------------- comm
def comm_cases() -> dict:
    """Each comm wrapper once in float64 and float32: results and bytes recorded."""
    from . import comm

    n, r = dist.get_world_size(), dist.get_rank()
    res = {}
    for dtype in (torch.float64, torch.float32):
        name = str(dtype).split(".")[-1]
        x = (torch.arange(2 * n * 3, dtype=dtype).reshape(2, n, 3) + 100 * r).to(_dev())  # (2, n, 3)
        with comm.count_bytes() as c:
            ar = comm.all_reduce(x.clone())
        res[f"all_reduce_{name}"] = (ar, dict(c.by_op))
        with comm.count_bytes() as c:
            ag = comm.all_gather(x, dim=1)
        res[f"all_gather_{name}"] = (ag, dict(c.by_op))
        with comm.count_bytes() as c:
            rs = comm.reduce_scatter(x, dim=1)
        res[f"reduce_scatter_{name}"] = (rs, dict(c.by_op))
        # uneven all-to-all: rank r sends (r + j) % 3 rows to rank j (some splits are 0)
        ins = [(r + j) % 3 for j in range(n)]
        outs = [(j + r) % 3 for j in range(n)]
        rows = torch.cat([torch.full((ins[j], 2), float(10 * r + j), dtype=dtype)
                          for j in range(n)]).to(_dev())
        with comm.count_bytes() as c:
            a2a = comm.all_to_all_single(rows, outs, ins)
        res[f"all_to_all_{name}"] = (a2a, dict(c.by_op), ins, outs)
    try:
        comm.reduce_scatter(torch.zeros(n + 1, 2, device=_dev()), dim=0)
        res["rs_error"] = None
    except ValueError as e:
        res["rs_error"] = str(e)
    try:
        comm.check_same_shape(torch.zeros(2 + (r == 0), 3, device=_dev()), what="x")
        res["shape_error"] = None
    except ValueError as e:
        res["shape_error"] = str(e)
    return res


if __name__ == "__main__":  # under torchrun
    from .launch import init_from_env, shutdown

    rank, world = init_from_env(quiet=True)
    total = float(all_reduce_rank()[0])
    print(f"rank {rank}/{world} backend={dist.get_backend()} sum={total:g}", flush=True)
    shutdown()


# ------------------------------------------------- one launch for many tests
# Starting ranks costs seconds (each imports torch), so the test modules register
# their cases at import time and the first test that needs N ranks runs every
# registered job in a single launch of N ranks; the results are cached.
_REGISTRY: dict[str, tuple[str, object]] = {}
_RESULTS: dict[int, dict] = {}


def run_jobs(jobs: dict) -> dict:
    """In each rank: ``{name: (worker name, cases)}`` -> ``{name: worker(cases)}``."""
    out = {}
    for name, (worker, args) in jobs.items():
        out[name] = globals()[worker](*args)
    return out


def register(name: str, worker: str, make_args) -> None:
    """Register ``worker(*make_args(n))`` (a function of this module, by name) under ``name``."""
    _REGISTRY[name] = (worker, make_args)


def registered_results(n: int, name: str, timeout: float = 240.0) -> list:
    """Each rank's result of job ``name`` with ``n`` ranks (all registered jobs run once)."""
    from .launch import launch

    have = _RESULTS.setdefault(n, {})
    if name not in have:
        todo = {k: (wk, tuple(mk(n))) for k, (wk, mk) in _REGISTRY.items() if k not in have}
        try:
            outs = launch(run_jobs, n, todo, timeout=timeout, quiet=True)
        except Exception as exc:          # remember the failure: one launch, not one per module
            for k in todo:
                have[k] = exc
            raise
        for k in todo:
            have[k] = [o[k] for o in outs]
    if isinstance(have[name], Exception):
        raise RuntimeError(f"the shared {n}-rank launch of the registered jobs failed "
                           f"(see the first failing test): {have[name]!r}"[:2000]) from have[name]
    return have[name]


# ------------------------------------------------------ `python -m lesson10 run`
def _cli_cases(method: str, args, n: int) -> list[dict]:
    h = args.heads * args.dim
    if method == "sp":
        return [dict(b=args.batch, s=args.seq, h=h, ffn=4 * h, sp=sp, p=0.1, dtype=args.dtype)
                for sp in (False, True)]
    E = max(4, 2 * n)
    T = max(E, args.seq // n)
    base = dict(h=max(h, E), E=E, d_ff=2 * h, k=2, dtype=args.dtype)
    return [dict(base, T=T, uniform=True), dict(base, T=T, cf=1.25)]


def _cli_report(method: str, n: int, rank0: list[dict]) -> tuple[str, bool]:
    from .. import cost
    lines, ok = [], True
    for res in rank0:
        c = res["case"]
        tol = 1e-9 if c["dtype"] == "float64" else (1e-4 if c["dtype"] == "float32" else 5e-2)
        e = torch.empty((), dtype=getattr(torch, c["dtype"])).element_size()
        if method == "sp":
            errs = [res["out_err"], res["dx_err"], *res["grad_err"].values()]
            act = {k: v for k, v in res["fwd"].items() if k not in ("metadata", "param_grad")}
            want = cost.comm_bytes("sp", c["s"], c["h"], n, e=e) / 2 * c["b"]
            lines.append(f"{'TP + SP' if c['sp'] else 'TP':7s} t={n} b={c['b']} s={c['s']} h={c['h']} "
                         f"ffn={c['ffn']} {c['dtype']}: max error {max(errs):.1e}, forward bytes "
                         f"{act} = {sum(act.values()):,} (lesson: {want:,.0f} per block)")
        else:
            errs = [res[k] for k in ("y_err", "dx_err", "router_grad_err", "w1_grad_err",
                                     "w2_grad_err", "aux_err")]
            kind = "uniform routing" if c.get("uniform") else f"random routing, CF={c.get('cf')}"
            want = cost.moe_a2a_bytes(c["k"], c["T"], c["h"], n, e=e)
            lines.append(f"MoE {kind}: N_e={n} T={c['T']} h={c['h']} E={c['E']} k={c['k']} "
                         f"{c['dtype']}: max error {max(errs):.1e}, dropped {res['dropped']}, "
                         f"max/mean load {max(res['load']) / (sum(res['load']) / len(res['load'])):.2f}, "
                         f"all-to-all bytes {res['fwd'].get('all_to_all', 0):,} "
                         f"(uniform formula {want:,.0f})")
        ok = ok and max(errs) <= tol
    return "\n".join(lines), ok


def cli_run(method: str, args) -> int:
    """``python -m lesson10 run sp|moe`` (launches ranks) and the same inside ``torchrun``."""
    worker = sp_cases if method == "sp" else moe_cases
    if dist.is_initialized():                       # inside torchrun: this process is one rank
        n = dist.get_world_size()
        res = worker(_cli_cases(method, args, n))
        if dist.get_rank() != 0:
            return 0
    else:
        from .launch import launch
        n = args.nproc
        res = launch(worker, n, _cli_cases(method, args, n), backend=args.backend,
                     timeout=args.timeout)[0]
    text, ok = _cli_report(method, n, res)
    print(text)
    print("OK" if ok else "ERROR TOO LARGE")
    return 0 if ok else 1
