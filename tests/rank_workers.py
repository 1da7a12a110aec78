"""Worker functions that only the tests use: who-am-I, fault injectors and probes.

A spawned rank imports its worker by module and name; pytest puts tests/ on sys.path
(and multiprocessing passes sys.path to the ranks), so ``rank_workers.fail_on`` is
found there. Nothing here belongs in the package: fault injectors (a rank that
raises, exits or sleeps for an hour) and probes that collect error messages.

``torchrun --nproc-per-node N tests/rank_workers.py`` runs :func:`all_reduce_rank` under
torchrun (a smoke test of :func:`lesson10.spmd.torchrun.init_from_env`).
"""
from __future__ import annotations

import importlib
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from lesson10.spmd import ExpertParallelMoE, SequenceParallelBlock
from lesson10.spmd.launch import current_device as _dev
from lesson10.spmd.moe import init_moe_weights, moe_reference
from lesson10.spmd.sp import ReferenceBlock, sp_shard


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


def lose_connection_on(rank: int, log_dir: str) -> None:
    """Every rank notes that it ran; rank ``rank`` then raises what gloo says when a peer
    closes a connection, after the start (so launch must not start the ranks again)."""
    with open(os.path.join(log_dir, f"ran-{dist.get_rank()}-{os.getpid()}"), "w"):
        pass
    if dist.get_rank() == rank:
        raise RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:1")
    x = torch.ones(1, device=_dev())
    dist.all_reduce(x)


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



def comm_cases() -> dict:
    """Each comm wrapper once in float64 and float32: results and bytes recorded."""
    from lesson10.spmd import comm

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


def ulysses_mismatch(b: int = 1, c: int = 4, a: int = 4, d: int = 8) -> str:
    """Rank 0 passes one token more than the others: every rank must get a ValueError."""
    from lesson10.spmd.ulysses import ulysses_attention
    cc = c + (1 if dist.get_rank() == 0 else 0)
    q = torch.randn(b, cc, a, d, device=_dev())
    try:
        ulysses_attention(q, q, q)
    except ValueError as e:
        return str(e)
    return "no error"


def shard_cases(cases: list[tuple]) -> list[dict]:
    """For each ``(s, layout)`` shard a tensor whose entries are their global
    token ids and gather it back. Returns the ids this rank holds, the round trip's
    exactness, and the error message when ``s`` does not fit the layout."""
    out = []
    for s, layout in cases:
        from lesson10.spmd.shard import gather_sequence, shard_sequence
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
    """The exceptions ``ring_attention`` raises for bad input (``type: message``)."""
    from lesson10.spmd.ring import ring_attention
    r = dist.get_rank()
    cases = {
        "odd_zigzag": lambda: ring_attention(*(torch.randn(1, 3, 2, 4) for _ in range(3)), layout="zigzag"),
        "heads": lambda: ring_attention(torch.randn(1, 4, 4, 4), torch.randn(1, 4, n_heads_bad, 4),
                                        torch.randn(1, 4, n_heads_bad, 4)),
        "kv_mismatch": lambda: ring_attention(torch.randn(1, 4, 2, 4), torch.randn(1, 4, 2, 4),
                                              torch.randn(1, 6, 2, 4)),
        "layout": lambda: ring_attention(*(torch.randn(1, 4, 2, 4) for _ in range(3)), layout="spiral"),
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


def paced_ring(bandwidth: float, nbytes: int) -> dict:
    """A ring shift of ``nbytes`` on a link paced at ``bandwidth`` bytes/s: the time of the
    shift alone (no compute to hide it), and the wait left after ``2 nbytes / bandwidth``
    seconds of (sleeping) compute; plus a tiny ``bench cstar`` sweep (structure only)."""
    from lesson10.bench.cstar import cstar_sweep
    from lesson10.spmd.ring import RingComm

    x = torch.ones(nbytes // 4, dtype=torch.float32, device=_dev()) * (dist.get_rank() + 1)
    ring = RingComm(None, bandwidth=bandwidth)
    dist.barrier()
    t0 = time.perf_counter()
    got = ring.shift([x]).wait()[0]
    alone = time.perf_counter() - t0
    dist.barrier()
    shift = ring.shift([x])
    time.sleep(2 * nbytes / bandwidth)                  # compute that covers the transfer
    t1 = time.perf_counter()
    shift.wait()
    hidden_wait = time.perf_counter() - t1
    sweep = cstar_sweep(a=2, a_kv=1, d=8, target=16, factors=(0.5, 2), reps=1)
    return {"alone": alone, "hidden_wait": hidden_wait,
            "received": float(got[0]), "sweep": sweep}


def clock_syncs() -> dict:
    """How often the c* measurements and the ring's timings wait for the device before they
    read a clock. The wait functions are replaced by counters (on CPU they do nothing, so only
    counting can show that a GPU run would synchronise): ``cstar`` for the F and W measurements
    (2 reps each), ``ring_timed`` / ``ring_plain`` for one ring forward with / without timings."""
    from lesson10.bench import cstar
    from lesson10.spmd import ring as ring_mod

    calls = {"cstar": 0, "ring": 0}

    def count(key):
        def fake(*args):
            calls[key] += 1
        return fake

    saved = cstar.synchronize, ring_mod.synchronize_device
    cstar.synchronize, ring_mod.synchronize_device = count("cstar"), count("ring")
    try:
        cstar._measure_flops(8, 2, 2, 4, torch.float32, reps=2)
        cstar._measure_bandwidth(1024, None, reps=2)
        q = torch.randn(1, 8, 2, 4, device=_dev())
        with ring_mod.ring_options(timings=[]):
            ring_mod.ring_attention(q, q, q, causal=True)
        timed = calls["ring"]
        ring_mod.ring_attention(q, q, q, causal=True)
    finally:
        cstar.synchronize, ring_mod.synchronize_device = saved
    return {"cstar": calls["cstar"], "ring_timed": timed, "ring_plain": calls["ring"] - timed,
            "rounds": dist.get_world_size()}


def unseen_layout(s: int = 24, seed: int = 5, causal: bool = True, docs=None,
                  node_size: int = 2) -> dict:
    """Every attention method of the registry (:data:`lesson10.runs.registry.METHODS`) with
    a layout none was written for: a random permutation of the tokens (each rank's positions
    in no order), passed as ``layout=`` positions; and the striped layout by name. Largest
    error of each rank's output and gradients against autograd through plain attention on
    the whole sequence; USP takes its default ``ulysses_size`` (None) from the topology,
    nodes of ``node_size``. Also ``shard_sequence`` / ``gather_sequence`` with the positions."""
    import numpy as np

    from lesson10 import topology
    from lesson10.runs import registry
    from lesson10.spmd import gather_sequence, shard_sequence
    from lesson10.spmd.attention import attention

    n, r = dist.get_world_size(), dist.get_rank()
    g = torch.Generator().manual_seed(seed)
    q, dout = (torch.randn(1, s, 8, 4, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(1, s, 4, 4, generator=g, dtype=torch.float64) for _ in range(2))
    doc = None if docs is None else torch.as_tensor(np.repeat(np.arange(len(docs)), docs))
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    o_ref, _ = attention(*ref, causal=causal, doc_ids=doc)
    o_ref.backward(dout)
    perm = np.random.default_rng(seed).permutation(s)
    layouts = {"permutation": perm.reshape(n, -1)[r].tolist(),
               "striped": np.arange(r, s, n).tolist()}
    errors = {}
    with topology.assume(node_size):
        for lay_name, pos in layouts.items():
            layout = torch.as_tensor(pos) if lay_name == "permutation" else lay_name
            for method in registry.attention_names():
                fn = registry.get(method).spmd_function()
                loc = [t[:, pos].clone().requires_grad_() for t in (q, k, v)]
                o = fn(*loc, causal=causal, layout=layout, group=None, doc_ids=doc)
                o.backward(dout[:, pos])
                errs = [float((o - o_ref[:, pos]).abs().max())]
                errs += [float((t.grad - full.grad[:, pos]).abs().max()) for t, full in zip(loc, ref)]
                errors[f"{method}/{lay_name}"] = max(errs)
            mine = shard_sequence(q, layout)
            errors[f"shard/{lay_name}"] = float((mine - q[:, pos]).abs().max())
            errors[f"gather/{lay_name}"] = float((gather_sequence(mine, layout) - q).abs().max())
    return {"positions": layouts["permutation"], "errors": errors,
            "methods": list(registry.attention_names())}


def bench_nodes(configs: list, reps: int = 1) -> list:
    """:func:`lesson10.bench.nodes.time_dispatch` on nodes of 2 ranks (bench nodes' worker)."""
    from lesson10.bench.nodes import time_dispatch
    return time_dispatch(configs, reps, node_size=2)


def sp_operator_pairs() -> dict:
    """Megatron's four SP/TP operators on rank r's ``x_r = (r + 1) * base``, back-propagating
    ``dy_r = (r + 1) * ones``: ``{op: {"y", "dx", "fwd", "bwd"}}`` (bytes of each pass)."""
    from lesson10.spmd.comm import count_bytes
    from lesson10.spmd.sp import copy_to_tp, gather_from_sp, reduce_from_tp, reduce_scatter_to_sp

    r, n = dist.get_rank(), dist.get_world_size()
    b, s, h = 2, 4 * n, 3
    base = torch.arange(b * s * h, dtype=torch.float64).reshape(b, s, h)
    out = {}
    for name, fn, shape in (("copy_to_tp", copy_to_tp, (b, s, h)),
                            ("reduce_from_tp", reduce_from_tp, (b, s, h)),
                            ("gather_from_sp", gather_from_sp, (b, s // n, h)),
                            ("reduce_scatter_to_sp", reduce_scatter_to_sp, (b, s, h))):
        x = ((r + 1) * base[:, :shape[1]]).clone().requires_grad_(True)
        with count_bytes() as c:
            y = fn(x)
            fwd = c.sent
            y.backward(torch.full_like(y, float(r + 1)))
        out[name] = {"y": y.detach(), "dx": x.grad, "fwd": fwd, "bwd": c.sent - fwd}
    return out


# --------------------------------------------------------------------------- group=
GB, GS, GH, GFFN = 2, 8, 8, 16                 # SequenceParallelBlock inside a group of 2 ranks
GROUP_MOE = dict(h=8, E=4, d_ff=6, k=2, T=6, cf=1.0, alpha=0.5)


def _maxerr(a, b):
    return float((a.detach() - b.detach()).abs().max())


def _plain_block(ref, x):
    """The block written out with torch.nn.functional (p = 0): x + W2 gelu(W1 LN(x) + b1) + b2."""
    z = F.layer_norm(x, (x.shape[-1],), ref.ln.weight, ref.ln.bias, ref.ln.eps)
    return x + F.linear(F.gelu(F.linear(z, ref.fc1.weight, ref.fc1.bias)), ref.fc2.weight, ref.fc2.bias)


def _group_sp_errors(group, r, t, seed, sp, p):
    """SequenceParallelBlock inside ``group`` against the reference block on its data."""
    ref = ReferenceBlock(GH, GFFN, p, seed=seed, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(GB, GS, GH, generator=g, dtype=torch.float64)
    dy = torch.randn(GB, GS, GH, generator=g, dtype=torch.float64)
    xr = x.clone().requires_grad_()
    yr = ref(xr)
    yr.backward(dy)
    plain = _maxerr(_plain_block(ref, x), yr) if p == 0 else 0.0
    blk = SequenceParallelBlock(GH, GFFN, sequence_parallel=sp, p=p, group=group, reference=ref)
    if sp:
        xl, dyl, tok = sp_shard(x, group), sp_shard(dy, group), slice(r * GS // t, (r + 1) * GS // t)
    else:
        xl, dyl, tok = x.clone(), dy, slice(None)
    xl.requires_grad_()
    y = blk(xl)
    y.backward(dyl)
    rows = slice(r * GFFN // t, (r + 1) * GFFN // t)
    rg = {n: q.grad for n, q in ref.named_parameters()}
    want = {"ln.weight": rg["ln.weight"], "ln.bias": rg["ln.bias"],
            "fc1.weight": rg["fc1.weight"][rows], "fc1.bias": rg["fc1.bias"][rows],
            "fc2.weight": rg["fc2.weight"][:, rows], "fc2.bias": rg["fc2.bias"]}
    got = {n: q.grad for n, q in blk.named_parameters()}
    assert set(got) == set(want)
    return {"out": _maxerr(y, yr[:, tok]), "dx": _maxerr(xl.grad, xr.grad[:, tok]),
            "grads": max(_maxerr(got[n], want[n]) for n in want), "plain": plain}


def _group_moe_errors(group, r, t, seed):
    """ExpertParallelMoE inside ``group`` against moe_reference on the group's tokens."""
    h, E, d_ff, k, T, cf, alpha = (GROUP_MOE[key] for key in ("h", "E", "d_ff", "k", "T", "cf", "alpha"))
    router_w, w1, w2 = init_moe_weights(h, E, d_ff, seed, torch.float64)
    g = torch.Generator().manual_seed(seed + 7)
    x = torch.randn(t * T, h, generator=g, dtype=torch.float64)      # the group's tokens
    dy = torch.randn(t * T, h, generator=g, dtype=torch.float64)
    layer = ExpertParallelMoE(h, E, d_ff, k, capacity_factor=cf, group=group, router_w=router_w,
                              w1=w1, w2=w2, alpha=alpha)
    xl = x[r * T:(r + 1) * T].clone().requires_grad_()
    y = layer(xl)
    ((y * dy[r * T:(r + 1) * T]).sum() + layer.aux_loss).backward()
    aux = layer.aux_loss.detach().clone()
    dist.all_reduce(aux, group=group)
    xr, rw, rw1, rw2 = (q.clone().requires_grad_() for q in (x, router_w, w1, w2))
    yr, auxr = moe_reference(xr, rw, rw1, rw2, k, cf, return_aux=True, alpha=alpha)
    ((yr * dy).sum() + auxr).backward()
    El = E // t
    mine = slice(r * El, (r + 1) * El)
    return {"y": _maxerr(y, yr[r * T:(r + 1) * T]), "dx": _maxerr(xl.grad, xr.grad[r * T:(r + 1) * T]),
            "router": _maxerr(layer.router_w.grad, rw.grad), "w1": _maxerr(layer.w1.grad, rw1.grad[mine]),
            "w2": _maxerr(layer.w2.grad, rw2.grad[mine]), "aux": abs(float(aux) - float(auxr)),
            "dropped": layer.dropped}


def split_groups(size: int = 2, part: str = "sp") -> dict:
    """In each rank: the world split into independent groups of ``size`` consecutive ranks,
    each with its own data (seed 100 * group); ``part`` ``"sp"``: SequenceParallelBlock (TP and
    TP + SP, p = 0 and 0.3) inside this rank's group, ``"moe"``: ExpertParallelMoE; errors
    against the single-process reference over the group's data, and the group's rank/size."""
    n, rank = dist.get_world_size(), dist.get_rank()
    groups = [dist.new_group(list(range(i, i + size))) for i in range(0, n, size)]
    group, r = groups[rank // size], rank % size
    seed = 100 * (rank // size)
    out = {"group_rank": dist.get_rank(group), "group_size": dist.get_world_size(group)}
    if part == "sp":
        out["sp"] = {(sp, p): _group_sp_errors(group, r, size, seed, sp, p)
                     for sp in (False, True) for p in (0.0, 0.3)}
    else:
        out["moe"] = _group_moe_errors(group, r, size, seed)
    return out


def _randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(len(shape)), dtype=dtype)


def _bad_input_calls(rank: int) -> dict:
    """``{case: call}``: the multi-process bad inputs; each raises the same error on every
    rank (before or inside a shape check that all ranks join) or runs to the end on every
    rank, so no case leaves a rank waiting in a collective."""
    from lesson10.spmd import (
        ExpertParallelMoE,
        gather_sequence,
        ring_attention,
        shard_sequence,
        ulysses_attention,
    )
    from lesson10.spmd.moe import init_moe_weights
    q, x = _randn(1, 4, 2, 3), _randn(1, 8, 2, 3)
    rw, w1, w2 = init_moe_weights(4, 4, 8)

    def no_tokens():
        layer = ExpertParallelMoE(4, 4, 8, 2, capacity_factor=1.0)
        y = layer(_randn(0, 4))
        return tuple(y.shape), float(layer.aux_loss), layer

    return {
        "ring int": lambda: ring_attention(q.long(), q.long(), q.long()),
        "ring shards differ": lambda: ring_attention(*[_randn(1, 4 + 2 * rank, 2, 3)] * 3),
        "ring empty": lambda: tuple(ring_attention(*[_randn(1, 0, 2, 3)] * 3).shape),
        "ulysses misspelled layout": lambda: ulysses_attention(q, q, q, causal=False, layout="zigzog"),
        "ulysses more ranks than kv heads": lambda: ulysses_attention(q, q[:, :, :1], q[:, :, :1]),
        "shard dim out of range": lambda: shard_sequence(x, "zigzag", dim=7),       # was dim 3
        "shard numpy": lambda: shard_sequence(x.numpy(), "zigzag"),
        "shard gather of shards that differ":      # gloo used to abort the process
            lambda: gather_sequence(_randn(1, 4 + 2 * rank, 2, 3), "contiguous"),
        "moe k float": lambda: ExpertParallelMoE(4, 4, 8, 2.0),
        "moe E % Ne": lambda: ExpertParallelMoE(4, 3, 8, 1),
        "moe cf nan": lambda: ExpertParallelMoE(4, 4, 8, 2, capacity_factor=float("nan")),
        "moe alpha nan": lambda: ExpertParallelMoE(4, 4, 8, 2, alpha=float("nan")),
        "moe dtype str": lambda: ExpertParallelMoE(4, 4, 8, 2, dtype="float32"),
        "moe numpy weights": lambda: ExpertParallelMoE(4, 4, 8, 2, router_w=rw.numpy(),
                                                       w1=w1.numpy(), w2=w2.numpy()),
        "moe x float64": lambda: ExpertParallelMoE(4, 4, 8, 2)(_randn(5, 4, dtype=torch.float64)),
        "moe no tokens": lambda: no_tokens()[:2],
        "moe update_bias nan": lambda: no_tokens()[2].update_bias(float("nan")),
    }


def bad_input_cases(prefix: str) -> dict:
    """In each rank: ``{case: (outcome, text)}`` for the bad-input cases whose name starts
    with ``prefix`` (the module's tests parametrize over them); outcome ``"ok"`` and the
    result, or the exception's type name and message."""
    res = {}
    for name, call in _bad_input_calls(dist.get_rank()).items():
        if not name.startswith(prefix):
            continue
        try:
            res[name] = ("ok", call())
        except Exception as e:  # noqa: BLE001 - the outcome is what we test
            res[name] = (type(e).__name__, str(e))
    return res


def bad_input_test(expected: dict):
    """A test of a module of ``tests/`` (assign it to a ``test_...`` name there), one case
    per entry of ``expected`` = ``{case of bad_input_cases: words its ValueError says}``;
    the module's ``RANK_JOBS["bad_input"]`` runs the cases on 2 ranks."""
    import pytest

    @pytest.mark.parametrize("case", list(expected))
    def test(rank_results, case):
        outs = rank_results(2, "bad_input")
        misses = [(r, res[case]) for r, res in enumerate(outs)
                  if res[case][0] != "ValueError" or expected[case] not in res[case][1]]
        assert not misses, misses
    return test


def inexact_rows(outs: list, n_cases: int) -> list:
    """The rows of each rank's ``check_attention`` results that are not exact in the output
    and the three gradients (or ``["count"]`` when a rank did not return ``n_cases`` rows)."""
    if any(len(rows) != n_cases for rows in outs):
        return ["count"]
    return [row for rows in outs for row in rows
            if "error" in row or not row["ok"] or set(row["err"]) != {"out", "dq", "dk", "dv"}]


def run_jobs(jobs: dict) -> dict:
    """In each rank: ``{name: (worker, kwargs)}`` -> ``{name: worker(**kwargs)}``, where a
    worker is a name in :mod:`lesson10.runs.workers` or in this module (the shared launch
    of ``conftest.rank_results``)."""
    from lesson10.runs import workers
    out = {}
    for name, (worker, kwargs) in jobs.items():
        fn = getattr(workers, worker, None) or globals()[worker]
        if isinstance(kwargs, list):                  # a list of cases: one result each
            out[name] = [fn(**kw) for kw in kwargs]
        else:
            out[name] = fn(**kwargs)
    return out


if __name__ == "__main__":  # under torchrun
    from lesson10.spmd.torchrun import init_from_env, shutdown

    rank, world = init_from_env(quiet=True)
    total = float(all_reduce_rank()[0])
    print(f"rank {rank}/{world} backend={dist.get_backend()} sum={total:g}", flush=True)
    shutdown()


def moe_interleaved_group(node_size: int = 2) -> dict:
    """ExpertParallelMoE on groups of 4 ranks in nodes of ``node_size``: (0, 2) and (1, 3)
    have one rank on each node, in node order (two-level works); (0, 1, 2) has two ranks on
    one node and one on the other, so it does not fill its nodes in blocks (``two_level`` is
    refused, ``auto`` falls back to flat). torch orders a group's ranks itself."""
    from lesson10 import topology
    from lesson10.spmd.moe import ExpertParallelMoE
    rank = dist.get_rank()
    pairs = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    triple = dist.new_group([0, 1, 2])
    dist.new_group([3])          # every rank in as many groups: see lesson10.spmd.usp.usp_groups
    out = {}
    with topology.assume(node_size):
        out["pair"] = ExpertParallelMoE(4, 4, 8, 2, group=pairs[rank % 2]).dispatch
        if rank < 3:
            try:
                ExpertParallelMoE(4, 6, 8, 2, group=triple, dispatch="two_level")
                out["triple"] = "built"
            except ValueError as e:
                out["triple"] = str(e)
            out["triple_auto"] = ExpertParallelMoE(4, 6, 8, 2, group=triple).dispatch
    return out


def usp_after_an_uneven_group() -> list:
    """World USP right after a group that leaves rank 3 out (so rank 3 knows one group fewer,
    which is what torch's names for locally synchronised groups depend on): the rows of
    ``check_attention``; then a group of rank 3 alone evens the count for the jobs after."""
    from lesson10.runs import workers
    dist.new_group([0, 1, 2])
    rows = [workers.check_attention(method="usp", s=16, a=4, a_kv=4, d=4, ulysses_size=u)
            for u in (1, 2)]
    dist.new_group([3])
    return rows


def entry_with_start_fault(fault: str, *entry_args):
    """The launcher's rank body (``lesson10.spmd.launch._entry``) with one start that loses a
    connection: the first rank to remove the file ``fault`` fails while joining the group, as
    gloo does when a peer closes a connection under load. Tests put it in place with
    ``monkeypatch.setattr(launch_module, "_entry", functools.partial(entry_with_start_fault,
    path))``; the package itself holds no test hook."""
    L = importlib.import_module("lesson10.spmd.launch")
    real = L.dist.TCPStore

    def store(*args, **kwargs):
        try:
            os.remove(fault)
        except OSError:
            return real(*args, **kwargs)
        raise RuntimeError("Gloo connectFullMesh failed with [injected by a test] "
                           "Connection closed by peer [127.0.0.1]:1")
    L.dist.TCPStore = store
    return L._entry(*entry_args)
