"""One checked run per method on real ranks: notebook 06, ``python -m lesson10 run`` and the tests.

Pass a worker to :func:`lesson10.spmd.launch.launch`; it runs inside every rank::

    from lesson10.spmd import launch, workers
    res = launch(workers.check_attention, 2, "ring", s=64)[0]     # rank 0's result
    both = launch(workers.run_checks, 2, [("check_sp", {"sequence_parallel": False}),
                                          ("check_sp", {})])[0]   # two runs, one launch

Every worker draws the *whole* input from a seed, so each rank computes the
single-process reference on its own, cuts out its shard, runs the parallel method and
compares its part of the output and of the gradients. One result schema for all:

``method``, ``case`` (the arguments), ``n`` (ranks of the method's group), ``rank``;
``err`` (``{name: largest |error| over all ranks}``), ``max_err``; ``scale`` (``{name:
largest |reference value|}``), ``rel_err`` (``err / max(1, scale)``), ``max_rel_err``,
``worst`` (the name with the largest ``rel_err``), ``tol`` (for the dtype) and ``ok``
(``max_rel_err <= tol``: an error is judged against the size of the values, so a float32
gradient of size 300 may be 3e-2 off, one of size 0.5 only 1e-4); ``fwd`` / ``bwd``: the
activation bytes this rank sent (side traffic left out, see :data:`lesson10.spmd.comm.SIDE_OPS`), ``fwd_by_op`` / ``bwd_by_op``: every byte by op;
``formula_fwd``: the lesson's bytes from :mod:`lesson10.cost` with the same ``e``
(8 for float64); ``time_s``: forward + backward of the slowest rank; plus a few
fields of the method's own. A case the method rejects gives ``{"method", "case",
"error": message}`` (every method raises its ValueError on every rank, before any
collective, so nothing hangs).
"""
from __future__ import annotations

import copy
import math
import os
import socket
import time

import numpy as np
import torch
import torch.distributed as dist

from .. import cost
from . import comm
from .attention import attention
from .comm import SIDE_OPS
from .device import current_device, synchronize, torch_dtype

__all__ = ["hello", "check_attention", "check_sp", "check_moe", "run_checks",
           "uniform_router_tokens", "SIDE_OPS", "TOL"]

#: largest error accepted, by dtype, relative to the size of the values compared:
#: ``|got - want| <= TOL * max(1, max |want|)`` for each compared tensor
TOL = {"float64": 1e-9, "float32": 1e-4, "bfloat16": 5e-2}


# ------------------------------------------------------------------ helpers
def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| (0.0 for empty tensors), on the CPU in float64."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).abs().max()) if a.numel() else 0.0


class _Errors(dict):
    """``{name: largest |got - want|}``, and in ``scale`` the largest ``|want|`` of each name:
    what the tolerance is relative to."""

    def __init__(self):
        super().__init__()
        self.scale: dict[str, float] = {}

    def tensor(self, name: str, got: torch.Tensor, want: torch.Tensor) -> None:
        want = want.detach().double().cpu()
        self[name] = _err(got, want)
        self.scale[name] = float(want.abs().max()) if want.numel() else 0.0

    def value(self, name: str, got, want) -> None:
        """NumPy arrays or numbers."""
        got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
        self[name] = float(np.abs(got - want).max(initial=0.0))
        self.scale[name] = float(np.abs(want).max(initial=0.0))


def _max_over_ranks(values: dict) -> dict:
    """Every number in ``values`` replaced by its maximum over all ranks (one all-reduce,
    outside any byte counter: bookkeeping, not the method's traffic)."""
    keys = sorted(values, key=repr)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=current_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return dict(zip(keys, t.cpu().tolist()))


def _elem(dtype: str) -> int:
    return torch.empty((), dtype=torch_dtype(dtype)).element_size()


def _result(method, case, n, errs: _Errors, fwd, bwd, formula_fwd, seconds, **extra) -> dict:
    both = _max_over_ranks({**{("e", k): v for k, v in errs.items()},
                            **{("s", k): v for k, v in errs.scale.items()}, ("t", ""): seconds})
    seconds = both[("t", "")]
    err = {k: both[("e", k)] for k in errs}
    scale = {k: both[("s", k)] for k in errs}
    rel = {k: err[k] / max(1.0, scale[k]) for k in errs}
    max_err = max(err.values()) if err else 0.0
    worst = max(rel, key=rel.get) if rel else None
    max_rel = rel[worst] if rel else 0.0
    tol = TOL[case["dtype"]]
    return {"method": method, "case": case, "n": n, "rank": dist.get_rank(),
            "err": err, "max_err": max_err, "scale": scale, "rel_err": rel, "max_rel_err": max_rel,
            "worst": worst, "tol": tol, "ok": bool(max_rel <= tol),
            "fwd": fwd.activation, "bwd": bwd.activation,
            "fwd_by_op": dict(fwd.by_op), "bwd_by_op": dict(bwd.by_op),
            "formula_fwd": formula_fwd, "time_s": seconds, **extra}


def _timed_step(forward, dout):
    """``forward()`` then ``backward(dout)``, each inside a byte counter, timed on this rank."""
    dist.barrier()
    synchronize()
    t0 = time.perf_counter()
    with comm.count_bytes() as fwd:
        out = forward()
    with comm.count_bytes() as bwd:
        out.backward(dout)
    synchronize()
    return out, fwd, bwd, time.perf_counter() - t0


def run_checks(todo: list) -> list[dict]:
    """Several checked runs in one launch (starting ranks costs seconds): ``todo`` is a
    list of ``(worker name, kwargs)``, e.g. ``[("check_sp", {"sequence_parallel": False}),
    ("check_sp", {})]``; returns this rank's results in that order."""
    return [globals()[name](**kwargs) for name, kwargs in todo]


def hello() -> dict:
    """Who am I: rank, world size, backend, process id, host, torch threads, device."""
    return {"rank": dist.get_rank(), "world": dist.get_world_size(),
            "backend": dist.get_backend(), "pid": os.getpid(), "host": socket.gethostname(),
            "threads": torch.get_num_threads(), "device": str(current_device())}


# -------------------------------------------------------------- attention
def _attention_method(method: str):
    """The registry's record of an attention method (:mod:`lesson10.methods`)."""
    from .. import methods
    if method not in methods.attention_names():
        raise ValueError(f"method must be one of {sorted(methods.attention_names())}, got "
                         f"{method!r}")
    return methods.get(method)


def check_attention(method: str = "ring", b: int = 1, s: int = 32, a: int = 4, a_kv: int = 2,
                    d: int = 8, causal: bool = True, layout: str | None = None,
                    dtype: str = "float64", seed: int = 0, replicate_kv: bool = False,
                    impl: str = "auto", overlap: bool = True, split: int = 1,
                    ulysses_size: int | None = None, docs: list | None = None) -> dict:
    """``method`` (``"ring"``, ``"ulysses"``, ``"allgather"`` or ``"usp"``) on this rank's
    shard vs full attention.

    Inputs ``q (b, s, a, d)``, ``k, v (b, s, a_kv, d)`` and the output gradient, drawn
    from ``seed``; the reference is :func:`lesson10.spmd.attention.attention` in float64
    on the same (rounded) inputs. ``layout``: default zig-zag for the ring, contiguous
    for Ulysses. ``err``: ``out``, ``dq``, ``dk``, ``dv`` of this rank's tokens.
    ``formula_fwd = cost.comm_bytes(method, s, a d, n, g, e) * b`` with ``g`` query
    heads per K/V head *as sent* (``replicate_kv`` copies K/V heads up to
    ``lcm(a_kv, N_c)``). ``split = m``: the world is cut into ``m`` groups of
    consecutive ranks (``new_group``), each running the method on its own sequence.
    ``ulysses_size``: USP's Ulysses degree (``formula_fwd = cost.usp_bytes``); ``docs``:
    document lengths (summing to ``s``) for a document mask (ring, allgather, usp).
    Extras: ``tokens`` (this rank's global positions), ``kv_heads_sent``.
    """
    case = dict(locals())                                  # the arguments, as passed
    from .ring import ring_options
    from .shard import local_positions, shard_sequence
    record = _attention_method(method)
    fn = record.spmd_function()
    layout = case["layout"] = layout or record.default_layout
    group, n, which = _split_world(split)
    dt, dev = torch_dtype(dtype), current_device()
    g = torch.Generator().manual_seed(seed + 1000 * which)
    q, dout = (torch.randn(b, s, a, d, generator=g, dtype=torch.float64).to(dt) for _ in range(2))
    k, v = (torch.randn(b, s, a_kv, d, generator=g, dtype=torch.float64).to(dt) for _ in range(2))
    if docs is not None and (method == "ulysses" or sum(docs) != s or min(docs) < 1):
        return {"method": method, "case": case,
                "error": f"docs: document lengths >= 1 summing to s = {s}, for the ring, "
                         f"allgather or usp (got {docs} with {method})"}
    doc = None if docs is None else torch.as_tensor(np.repeat(np.arange(len(docs)), docs))
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    o_ref, _ = attention(*ref, causal=causal, doc_ids=doc)
    o_ref.backward(dout.double())
    kw = _method_kwargs(method, replicate_kv, impl, ulysses_size, doc)
    try:
        pos = local_positions(s, layout, group)
        loc = [shard_sequence(t.to(dev), layout, group).detach().requires_grad_() for t in (q, k, v)]
        with ring_options(overlap=overlap):
            o, fwd, bwd, seconds = _timed_step(
                lambda: fn(*loc, causal=causal, layout=layout, group=group, **kw),
                shard_sequence(dout.to(dev), layout, group))
    except ValueError as e:
        return {"method": method, "case": case, "error": str(e)}
    errs = _Errors()
    errs.tensor("out", o, o_ref[:, pos])
    for name, mine, full in zip(("dq", "dk", "dv"), loc, ref):
        errs.tensor(name, mine.grad, full.grad[:, pos])
    sent_kv = math.lcm(a_kv, n) if method == "ulysses" and replicate_kv and a_kv % n else a_kv
    extra_opts = {"ulysses_size": ulysses_size} if method == "usp" else {}
    formula = record.bytes_fwd(s, a * d, n, g=a / sent_kv, e=_elem(dtype), **extra_opts) * b
    return _result(method, case, n, errs, fwd, bwd, formula, seconds,
                   tokens=pos.tolist(), kv_heads_sent=sent_kv)


def _split_world(split: int):
    """``(group, n, which)``: with ``split = m``, the world cut into ``m`` groups of
    consecutive ranks (``new_group``, every rank joins every one) and this rank's; else the
    world."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if split <= 1:
        return None, world, 0
    if world % split:
        raise ValueError(f"split = {split} does not divide the {world} ranks")
    n, which = world // split, rank // (world // split)
    groups = [dist.new_group(list(range(i, i + n))) for i in range(0, world, n)]
    return groups[which], n, which


def _method_kwargs(method: str, replicate_kv, impl, ulysses_size, doc) -> dict:
    """The method's own keyword arguments (see :data:`lesson10.methods.METHODS` options)."""
    kw = {"replicate_kv": replicate_kv} if method == "ulysses" else {"impl": impl}
    if method == "usp":
        kw["ulysses_size"] = ulysses_size
    if doc is not None:
        kw["doc_ids"] = doc
    return kw


# ----------------------------------------------------------------------- SP
def check_sp(b: int = 2, s: int = 8, h: int = 16, ffn: int = 32, p: float = 0.1,
             sequence_parallel: bool = True, blocks: int = 2, seed: int = 0,
             dtype: str = "float64") -> dict:
    """``blocks`` :class:`SequenceParallelBlock` s in a row, as TP or TP + SP, vs one process.

    Each block: LayerNorm -> column-parallel fc1 -> GELU -> row-parallel fc2 -> dropout
    -> residual; two blocks communicate like a transformer layer (attention + MLP):
    2 all-reduces forward under TP, 2 reduce-scatters + 2 all-gathers under TP + SP.
    Input ``x (b, s, h)``; under SP rank ``r`` holds tokens ``r s/t .. (r+1) s/t - 1``.
    ``err``: ``out``, ``dx`` and every weight gradient (``"grad <block>.<name>"``, this
    rank's shard of the reference's). The reference runs in float64 on the same (rounded)
    inputs and weights, so a float32 run is measured against the exact answer.
    ``formula_fwd = cost.comm_bytes("sp", s, h, t, e) * b * blocks / 2``. Extras: ``tokens_per_rank`` of the LayerNorm input, ``dropped``
    (the fraction of block 0's outputs its dropout zeroed, in the reference).
    """
    case = dict(locals())                                  # the arguments, as passed
    from .sp import ReferenceBlock, SequenceParallelBlock, sp_shard
    dt, dev = torch_dtype(dtype), current_device()
    t, r = dist.get_world_size(), dist.get_rank()
    refs = [ReferenceBlock(h, ffn, p, seed=seed + i, dropout_seed=99 + i, dtype=dt) for i in range(blocks)]
    g = torch.Generator().manual_seed(seed + 1000)
    x = torch.randn(b, s, h, generator=g, dtype=dt)
    dy = torch.randn(b, s, h, generator=g, dtype=dt)
    refs64 = [copy.deepcopy(ref).double() for ref in refs]       # same weights, exact arithmetic
    xr = x.double().clone().requires_grad_()                     # (x itself stays a plain input)
    ys = [xr]
    for ref in refs64:
        ys.append(ref(ys[-1]))
    yr = ys[-1]
    yr.backward(dy.double())
    dropped = float((ys[1] - xr == 0).double().mean()) if p else 0.0   # block 0's dropout
    try:
        mods = [SequenceParallelBlock(h, ffn, sequence_parallel=sequence_parallel, reference=ref).to(dev)
                for ref in refs]
        if sequence_parallel:
            xl, dyl, tok = sp_shard(x), sp_shard(dy), slice(r * s // t, (r + 1) * s // t)
        else:
            xl, dyl, tok = x.clone(), dy, slice(None)
        xl = xl.to(dev).requires_grad_()

        def forward():
            y = xl
            for m in mods:
                y = m(y)
            return y

        y, fwd, bwd, seconds = _timed_step(forward, dyl.to(dev))
    except ValueError as e:
        return {"method": "sp", "case": case, "error": str(e)}
    errs = _Errors()
    errs.tensor("out", y, yr[:, tok])
    errs.tensor("dx", xl.grad, xr.grad[:, tok])
    _sp_grad_errors(errs, mods, refs64, slice(r * ffn // t, (r + 1) * ffn // t))
    formula = cost.comm_bytes("sp", s, h, t, e=_elem(dtype)) * b * blocks / 2
    return _result("sp", case, t, errs, fwd, bwd, formula, seconds, tokens_per_rank=xl.shape[1],
                   dropped=dropped)


# ---------------------------------------------------------------------- MoE
def uniform_router_tokens(T: int, h: int, E: int, k: int, start: int = 0, dtype=torch.float64):
    """Tokens and a router that route *exactly* uniformly (for byte checks).

    ``router_w`` = the first ``E`` columns of the identity ``(h, E)``; token ``t`` is
    ``sum_j (k - j) e_{(start + t k + j) mod E}``, so its top-``k`` experts are
    ``start + t k .. start + t k + k - 1 (mod E)``, best first: with ``k T`` a multiple
    of ``E`` every expert gets ``k T / E`` copies from every rank.
    """
    if h < E:
        raise ValueError(f"uniform routing needs h >= E, got h = {h}, E = {E}")
    x = torch.zeros(T, h, dtype=dtype)
    for t in range(T):
        for j in range(k):
            x[t, (start + t * k + j) % E] = k - j
    return x, torch.eye(h, E, dtype=dtype)


def _sp_grad_errors(errs, mods, refs64, rows: slice) -> None:
    """Every weight gradient of the blocks against this rank's shard of the reference's."""
    for i, (m, ref) in enumerate(zip(mods, refs64)):
        want = {"ln.weight": ref.ln.weight.grad, "ln.bias": ref.ln.bias.grad,
                "fc1.weight": ref.fc1.weight.grad[rows], "fc1.bias": ref.fc1.bias.grad[rows],
                "fc2.weight": ref.fc2.weight.grad[:, rows], "fc2.bias": ref.fc2.bias.grad}
        got = dict(m.named_parameters())
        for k in want:
            errs.tensor(f"grad {i}.{k}", got[k].grad, want[k])


def check_moe(T=16, h: int = 8, E: int = 4, k: int = 2, d_ff: int = 16, capacity_factor=None,
              routing: str = "random", seed: int = 0, dtype: str = "float64", alpha: float = 0.5,
              bias=None, rate=None, nodes=None, max_nodes=None) -> dict:
    """:class:`ExpertParallelMoE` on ``N_e`` ranks vs :func:`lesson10.spmd.moe.moe_reference`.

    ``T``: tokens per rank (or a list, one per rank); ``routing``: ``"uniform"`` (every
    rank sends exactly ``kT/E`` copies to every expert, :func:`uniform_router_tokens`)
    or ``"random"``; ``bias``: the routing bias (list of ``E``); ``alpha``: aux-loss
    weight (large, so that its gradient shows). Step: loss ``sum(y dy) + aux_loss``.
    ``err``: ``y``, ``dx``, ``router_grad``, ``w1_grad``, ``w2_grad`` (this rank's
    experts), ``aux``, against the reference in the run's dtype (a float64 recomputation of
    the float32 router's logits could flip a near-tie of the top-k, and with it a whole row;
    the tolerance is relative to the size of each value instead); in float64 also ``sim`` / ``sim_aux`` against
    :mod:`lesson10.sim.moe`, and ``bias`` (the bias update, with ``rate``).
    Routing bookkeeping, counted independently with :mod:`lesson10.sim.moe`:
    ``capacity``, ``ref_dropped``, ``dropped_mine`` (dropped copies of this rank's
    tokens), ``remote_sent`` (this rank's kept copies whose expert lives elsewhere: they
    leave in the dispatch), ``remote_received`` (kept copies of other ranks' tokens for
    this rank's experts: their outputs leave in the combine), so exactly
    ``fwd = (remote_sent + remote_received) * row_bytes``. From the layer: ``dropped``,
    ``load`` (kept copies per local expert), ``counts``, ``w_grad_zero``.
    ``formula_fwd = cost.moe_a2a_bytes(k, T, h, N_e, e)`` (uniform routing, no drops).
    ``nodes`` / ``max_nodes``: node-limited routing (DeepSeek-V3); extra ``nodes_used``:
    the most nodes any token's experts span.
    """
    case = dict(locals())                                  # the arguments, as passed
    dt, dev = torch_dtype(dtype), current_device()
    n, r = dist.get_world_size(), dist.get_rank()
    Ts = list(T) if isinstance(T, (list, tuple)) else [T] * n
    if len(Ts) != n:
        raise ValueError(f"T lists {len(Ts)} token counts for {n} ranks")
    x, dy, router_w, w1, w2 = _moe_inputs(Ts, h, E, k, d_ff, seed, dt, routing)
    b_t = None if bias is None else torch.tensor(bias, dtype=router_w.dtype)
    lo, hi = sum(Ts[:r]), sum(Ts[:r + 1])
    try:
        layer = _moe_layer(h, E, d_ff, k, capacity_factor, router_w, w1, w2, alpha, nodes,
                           max_nodes, b_t, dev)
    except ValueError as e:
        return {"method": "moe", "case": case, "error": str(e)}
    xl = x[lo:hi].clone().to(dev).requires_grad_()
    dyl = dy[lo:hi].to(dev)
    outs = []

    def forward():
        outs.append(layer(xl))
        return (outs[0] * dyl).sum() + layer.aux_loss      # a scalar: backward() needs no dout

    _, fwd, bwd, seconds = _timed_step(forward, None)
    y = outs[0].detach()
    aux_total = layer.aux_loss.detach().clone()
    dist.all_reduce(aux_total)
    route = dict(k=k, capacity_factor=capacity_factor, bias=b_t, nodes=nodes, max_nodes=max_nodes)
    errs = _moe_errors(layer, x, dy, router_w, w1, w2, y, xl, aux_total, alpha, (lo, hi), route)
    extra = _moe_bookkeeping(x, router_w, Ts, E, h, dtype, layer, aux_total, route)
    if dtype == "float64":
        _moe_sim_errors(errs, x, router_w, w1, w2, y, aux_total, alpha, (lo, hi), route)
    if rate is not None:
        extra["bias_changed"] = _moe_bias_update(errs, layer, rate)
    formula = cost.moe_a2a_bytes(k, Ts[r], h, n, e=_elem(dtype)) if Ts[r] else 0.0
    return _result("moe", case, n, errs, fwd, bwd, formula, seconds, **extra)


def _moe_layer(h, E, d_ff, k, capacity_factor, router_w, w1, w2, alpha, nodes, max_nodes, bias,
               dev):
    """The layer under test, with the run's weights and routing bias, on ``dev``."""
    from .moe import ExpertParallelMoE
    layer = ExpertParallelMoE(h, E, d_ff, k, capacity_factor=capacity_factor, router_w=router_w,
                              w1=w1, w2=w2, alpha=alpha, nodes=nodes, max_nodes=max_nodes).to(dev)
    if bias is not None:
        layer.bias.copy_(bias)
    return layer


def _moe_bias_update(errs, layer, rate) -> bool:
    """The layer's bias update against the simulation's; whether the bias changed."""
    from ..sim.moe import update_expert_bias as sim_update
    before = layer.bias.detach().cpu().clone()
    new = layer.update_bias(rate).detach().cpu().clone()
    errs.value("bias", new.numpy(), sim_update(before.numpy(), layer.load.cpu().numpy(), rate))
    return bool((new != before).any())


def _moe_inputs(Ts, h, E, k, d_ff, seed, dt, routing):
    """The whole run's tokens ``x``, output gradient ``dy`` and weights, drawn from ``seed``."""
    from .moe import init_moe_weights
    n = len(Ts)
    router_w, w1, w2 = init_moe_weights(h, E, d_ff, seed, dt)
    g = torch.Generator().manual_seed(seed + 7)
    if routing == "uniform":
        x = torch.cat([uniform_router_tokens(Ts[i], h, E, k, i, dt)[0] for i in range(n)])
        router_w = uniform_router_tokens(1, h, E, k, 0, dt)[1]
    elif routing == "random":
        x = torch.randn(sum(Ts), h, generator=g, dtype=dt)
    else:
        raise ValueError(f"routing must be 'uniform' or 'random', got {routing!r}")
    dy = torch.randn(sum(Ts), h, generator=g, dtype=dt)
    return x, dy, router_w, w1, w2


def _moe_errors(layer, x, dy, router_w, w1, w2, y, xl, aux_total, alpha, rows, route) -> "_Errors":
    """This rank's output and gradients against autograd through the single-process layer."""
    from .moe import moe_reference
    n, r = dist.get_world_size(), dist.get_rank()
    lo, hi = rows
    xr, rw, rw1, rw2 = (t.clone().requires_grad_() for t in (x, router_w, w1, w2))
    yr, auxr = moe_reference(xr, rw, rw1, rw2, route["k"], route["capacity_factor"],
                             route["bias"], nodes=route["nodes"], max_nodes=route["max_nodes"],
                             return_aux=True, alpha=alpha)
    ((yr * dy).sum() + auxr).backward()
    El = w1.shape[0] // n
    errs = _Errors()
    errs.tensor("y", y, yr[lo:hi])
    errs.tensor("dx", xl.grad, xr.grad[lo:hi])
    errs.tensor("router_grad", layer.router_w.grad, rw.grad)
    errs.tensor("w1_grad", layer.w1.grad, rw1.grad[r * El:(r + 1) * El])
    errs.tensor("w2_grad", layer.w2.grad, rw2.grad[r * El:(r + 1) * El])
    errs.value("aux", float(aux_total), float(auxr.detach()))
    return errs


def _sim_routing(x, router_w, route):
    """The router's logits (float64 NumPy) and the simulation's top-k experts for them."""
    from ..sim.moe import route_topk as sim_route
    bias_np = None if route["bias"] is None else route["bias"].numpy()
    logits = (x.double() @ router_w.double()).numpy()
    experts, _ = sim_route(logits, route["k"], bias_np, nodes=route["nodes"],
                           max_nodes=route["max_nodes"])
    return logits, experts


def _moe_bookkeeping(x, router_w, Ts, E, h, dtype, layer, aux_total, route) -> dict:
    """Drops and remote copies counted independently with :mod:`lesson10.sim.moe`, next to
    what the layer reports."""
    from ..sim.moe import keep_within_capacity
    n, r = dist.get_world_size(), dist.get_rank()
    nodes, El = route["nodes"], E // n
    _, experts = _sim_routing(x, router_w, route)
    N, k = sum(Ts), route["k"]
    cap = cost.expert_capacity(N, E, k, route["capacity_factor"])
    kept = keep_within_capacity(experts, E, cap)
    home = experts // El                                          # (N, k) rank of each expert
    owner = np.repeat(np.arange(n), Ts)[:, None]                  # (N, 1) rank of each token
    return {"capacity": cap, "ref_dropped": int((~kept).sum()),
            "dropped_mine": int(((owner == r) & ~kept).sum()),
            "remote_sent": int(((owner == r) & (home != r) & kept).sum()),
            "remote_received": int(((owner != r) & (home == r) & kept).sum()),
            "row_bytes": h * _elem(dtype), "copies": N * k, "T_mine": Ts[r],
            "dropped": int(layer.dropped), "load": layer.load.tolist(),
            "counts": layer.counts.tolist(), "aux_value": float(aux_total),
            "w_grad_zero": [bool((layer.w1.grad[e] == 0).all()) for e in range(El)],
            "nodes_used": int(max((len(set((row // (E // nodes)).tolist())) for row in experts),
                                  default=0)) if nodes else None}


def _moe_sim_errors(errs, x, router_w, w1, w2, y, aux_total, alpha, rows, route) -> None:
    """float64 only: the output and the aux loss against :mod:`lesson10.sim.moe`."""
    from ..sim.moe import moe_reference as sim_reference, switch_aux_loss as sim_aux
    lo, hi = rows
    logits, experts = _sim_routing(x, router_w, route)
    bias_np = None if route["bias"] is None else route["bias"].numpy()
    experts_np = [(w1[e].numpy(), w2[e].numpy()) for e in range(w1.shape[0])]
    ys = sim_reference(x.numpy(), router_w.numpy(), experts_np, route["k"],
                       route["capacity_factor"], bias_np, nodes=route["nodes"],
                       max_nodes=route["max_nodes"])
    errs.value("sim", y.cpu().numpy(), ys[lo:hi])
    p = np.exp(logits - logits.max(1, keepdims=True))
    errs.value("sim_aux", float(aux_total), sim_aux(p / p.sum(1, keepdims=True), experts, alpha))
