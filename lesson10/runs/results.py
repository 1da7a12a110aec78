"""The result of one checked run (the schema of :mod:`lesson10.runs.workers`), and the
timing and error bookkeeping every checked run shares."""
from __future__ import annotations

import contextlib
import functools
import time

import numpy as np
import torch
import torch.distributed as dist

from .. import topology
from ..spmd import comm
from ..spmd.device import current_device, synchronize, torch_dtype

__all__ = ["TOL", "Errors", "max_over_ranks", "elem_size", "make_result", "timed_step",
           "on_topology"]

#: largest error accepted, by dtype, relative to the size of the values compared:
#: ``|got - want| <= TOL * max(1, max |want|)`` for each compared tensor
TOL = {"float64": 1e-9, "float32": 1e-4, "bfloat16": 5e-2}


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| (0.0 for empty tensors), on the CPU in float64."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).abs().max()) if a.numel() else 0.0


class Errors(dict):
    """``{name: largest |got - want|}``, and in ``scale`` the largest ``|want|`` of each name:
    what the tolerance is relative to."""

    def __init__(self):
        super().__init__()
        self.scale: dict[str, float] = {}

    def tensor(self, name: str, got: torch.Tensor | None, want: torch.Tensor | None) -> None:
        """``got`` against ``want`` (a gradient that autograd never filled in is an error)."""
        if got is None or want is None:
            raise RuntimeError(f"{name}: no tensor to compare (a gradient was never computed)")
        want = want.detach().double().cpu()
        self[name] = _err(got, want)
        self.scale[name] = float(want.abs().max()) if want.numel() else 0.0

    def value(self, name: str, got, want) -> None:
        """NumPy arrays or numbers."""
        got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
        self[name] = float(np.abs(got - want).max(initial=0.0))
        self.scale[name] = float(np.abs(want).max(initial=0.0))


def max_over_ranks(values: dict) -> dict:
    """Every number in ``values`` replaced by its maximum over all ranks (one all-reduce,
    outside any byte counter: bookkeeping, not the method's traffic)."""
    keys = sorted(values, key=repr)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=current_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return dict(zip(keys, t.cpu().tolist()))


def elem_size(dtype: str) -> int:
    return torch.empty((), dtype=torch_dtype(dtype)).element_size()


def make_result(method, case, n, errs: Errors, fwd, bwd, formula_fwd, seconds, **extra) -> dict:
    both = max_over_ranks({**{("e", k): v for k, v in errs.items()},
                            **{("s", k): v for k, v in errs.scale.items()}, ("t", ""): seconds})
    seconds = both[("t", "")]
    err = {k: both[("e", k)] for k in errs}
    scale = {k: both[("s", k)] for k in errs}
    rel = {k: err[k] / max(1.0, scale[k]) for k in errs}
    max_err = max(err.values()) if err else 0.0
    worst = max(rel, key=lambda name: rel[name]) if rel else None
    max_rel = rel[worst] if rel else 0.0
    tol = TOL[case["dtype"]]
    mine = torch.tensor([fwd.intra, fwd.inter, bwd.intra, bwd.inter, fwd.wire_inter,
                         bwd.wire_inter], dtype=torch.int64, device=current_device())
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)                       # bookkeeping: outside any byte counter
    links = torch.stack(every).cpu().T.tolist()        # (6, world)
    return {"method": method, "case": case, "n": n, "rank": dist.get_rank(),
            "err": err, "max_err": max_err, "scale": scale, "rel_err": rel, "max_rel_err": max_rel,
            "worst": worst, "tol": tol, "ok": bool(max_rel <= tol),
            "fwd": fwd.activation, "bwd": bwd.activation,
            "fwd_by_op": dict(fwd.by_op), "bwd_by_op": dict(bwd.by_op),
            "fwd_link": {"intra": fwd.intra, "inter": fwd.inter}, "fwd_by_link": dict(fwd.by_link),
            "bwd_link": {"intra": bwd.intra, "inter": bwd.inter},
            "link_by_rank": dict(zip(("fwd_intra", "fwd_inter", "bwd_intra", "bwd_inter",
                                      "fwd_wire_inter", "bwd_wire_inter"), links)),
            "wire_model": bool(fwd.wire_model or bwd.wire_model), "backend": dist.get_backend(),
            "formula_fwd": formula_fwd, "time_s": seconds, **extra}


def timed_step(forward, dout):
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


def on_topology(worker):
    """A worker that also takes ``node_size=``: it then runs as if the ranks were on nodes of
    that many (:func:`lesson10.topology.assume`), so one machine shows which bytes would
    cross a network. Every result says the topology it ran on: ``node_size``, ``nodes``."""
    @functools.wraps(worker)
    def run(*args, node_size=None, **kwargs):
        with topology.assume(node_size) if node_size else contextlib.nullcontext():
            try:
                topo = topology.current()        # the same on every rank: all refuse, none hangs
            except ValueError as e:
                return {"method": kwargs.get("method", worker.__name__.replace("check_", "")),
                        "case": {**kwargs, "node_size": node_size}, "error": str(e)}
            res = worker(*args, **kwargs)
        if node_size:
            res["case"]["node_size"] = node_size
        res["node_size"], res["nodes"] = topo.node_size, topo.nodes
        return res
    return run
