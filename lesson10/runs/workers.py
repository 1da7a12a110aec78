"""One checked run per method on real ranks: notebook 06, ``python -m lesson10 run`` and the tests.

Pass a worker to :func:`lesson10.spmd.launch.launch`; it runs inside every rank::

    from lesson10.runs import workers
    from lesson10.spmd import launch
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
activation bytes this rank sent (side traffic left out, see
:data:`lesson10.spmd.comm.SIDE_OPS`), ``fwd_by_op`` / ``bwd_by_op``: every byte by op;
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
import warnings

import numpy as np
import torch
import torch.distributed as dist

from .. import cost
from ..spmd.attention import attention
from ..spmd.comm import SIDE_OPS
from ..spmd.device import current_device, torch_dtype
from .moe_checks import check_moe, uniform_router_tokens
from .results import TOL, Errors, elem_size, make_result, on_topology, timed_step

__all__ = ["hello", "check_attention", "check_sp", "check_moe", "run_checks",
           "uniform_router_tokens", "SIDE_OPS", "TOL"]


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
    """The registry's record of an attention method (:mod:`lesson10.runs.registry`)."""
    from . import registry as methods
    if method not in methods.attention_names():
        raise ValueError(f"method must be one of {sorted(methods.attention_names())}, got "
                         f"{method!r}")
    return methods.get(method)


@on_topology
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
    ``ulysses_size``: USP's Ulysses degree (``formula_fwd = cost.usp_bytes``; ``None``: the
    ranks per node, and the extra ``ulysses_size`` says which ran; ``warnings``: e.g. a
    Ulysses group that spans nodes); ``docs``: document lengths (summing to ``s``) for a
    document mask (ring, allgather, usp).
    Extras: ``tokens`` (this rank's global positions), ``kv_heads_sent``.
    """
    case = dict(locals())                                  # the arguments, as passed
    from ..spmd.ring import ring_options
    from ..spmd.shard import local_positions, shard_sequence
    record = _attention_method(method)
    fn = record.spmd_function()
    layout = case["layout"] = layout or record.default_layout
    group, n, which = _split_world(split)
    dt, dev = torch_dtype(dtype), current_device()
    q, k, v, dout = _attention_inputs(b, s, a, a_kv, d, dt, seed + 1000 * which)
    if docs is not None and (method == "ulysses" or sum(docs) != s or min(docs) < 1):
        return {"method": method, "case": case,
                "error": f"docs: document lengths >= 1 summing to s = {s}, for the ring, "
                         f"allgather or usp (got {docs} with {method})"}
    doc = None if docs is None else torch.as_tensor(np.repeat(np.arange(len(docs)), docs))
    o_ref, ref = _attention_reference(q, k, v, dout, causal, doc)
    notes: list[str] = []
    try:
        if method == "usp":                            # the default u comes from the topology
            ulysses_size = _ulysses_size(ulysses_size, a_kv, group, notes)
        kw = _method_kwargs(method, replicate_kv, impl, ulysses_size, doc)
        pos = local_positions(s, layout, group)
        loc = [shard_sequence(t.to(dev), layout, group).detach().requires_grad_() for t in (q, k, v)]
        with ring_options(overlap=overlap), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "usp_attention: ulysses_size")   # in `notes` already
            o, fwd, bwd, seconds = timed_step(
                lambda: fn(*loc, causal=causal, layout=layout, group=group, **kw),
                shard_sequence(dout.to(dev), layout, group))
    except ValueError as e:
        return {"method": method, "case": case, "error": str(e)}
    errs = Errors()
    errs.tensor("out", o, o_ref[:, pos])
    for name, mine, full in zip(("dq", "dk", "dv"), loc, ref):
        errs.tensor(name, mine.grad, None if full.grad is None else full.grad[:, pos])
    sent_kv = math.lcm(a_kv, n) if method == "ulysses" and replicate_kv and a_kv % n else a_kv
    opts = {"ulysses_size": ulysses_size} if method == "usp" else {}
    formula = record.bytes_fwd(s, a * d, n, g=a / sent_kv, e=elem_size(dtype), **opts) * b
    return make_result(method, case, n, errs, fwd, bwd, formula, seconds, tokens=pos.tolist(),
                       kv_heads_sent=sent_kv, warnings=notes, **opts)


def _attention_inputs(b, s, a, a_kv, d, dt, seed):
    """The whole run's ``q (b, s, a, d)``, ``k, v (b, s, a_kv, d)`` and ``dout``, from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    q, dout = (torch.randn(b, s, a, d, generator=g, dtype=torch.float64).to(dt) for _ in range(2))
    k, v = (torch.randn(b, s, a_kv, d, generator=g, dtype=torch.float64).to(dt) for _ in range(2))
    return q, k, v, dout


def _attention_reference(q, k, v, dout, causal, doc):
    """Full attention in float64 on the same (rounded) inputs, forward and backward:
    ``(out, [q, k, v])`` with the gradients in ``.grad``."""
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    q_ref, k_ref, v_ref = ref
    o_ref, _ = attention(q_ref, k_ref, v_ref, causal=causal, doc_ids=doc)
    o_ref.backward(dout.double())
    return o_ref, ref


def _ulysses_size(ulysses_size, a_kv, group, notes: list) -> int:
    """USP's ``u`` (the default from the topology when ``None``); its warnings into ``notes``."""
    from ..spmd.usp import choose_ulysses_size
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        u = choose_ulysses_size(ulysses_size, a_kv, group)
    notes.extend(str(w.message) for w in caught)
    return u


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
    """The method's own keyword arguments (see :data:`lesson10.runs.registry.METHODS` options)."""
    kw = {"replicate_kv": replicate_kv} if method == "ulysses" else {"impl": impl}
    if method == "usp":
        kw["ulysses_size"] = ulysses_size
    if doc is not None:
        kw["doc_ids"] = doc
    return kw


# ----------------------------------------------------------------------- SP
@on_topology
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
    ``formula_fwd = cost.comm_bytes("sp", s, h, t, e) * b * blocks / 2``. Extras:
    ``tokens_per_rank`` of the LayerNorm input, ``dropped``
    (the fraction of block 0's outputs its dropout zeroed, in the reference).
    """
    case = dict(locals())                                  # the arguments, as passed
    from ..spmd.sp import ReferenceBlock, SequenceParallelBlock, sp_shard
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

        y, fwd, bwd, seconds = timed_step(forward, dyl.to(dev))
    except ValueError as e:
        return {"method": "sp", "case": case, "error": str(e)}
    errs = Errors()
    errs.tensor("out", y, yr[:, tok])
    errs.tensor("dx", xl.grad, None if xr.grad is None else xr.grad[:, tok])
    _sp_grad_errors(errs, mods, refs64, slice(r * ffn // t, (r + 1) * ffn // t))
    formula = cost.comm_bytes("sp", s, h, t, e=elem_size(dtype)) * b * blocks / 2
    return make_result("sp", case, t, errs, fwd, bwd, formula, seconds, tokens_per_rank=xl.shape[1],
                   dropped=dropped)


def _sp_grad_errors(errs, mods, refs64, rows: slice) -> None:
    """Every weight gradient of the blocks against this rank's shard of the reference's."""
    for i, (m, ref) in enumerate(zip(mods, refs64)):
        want = {"ln.weight": ref.ln.weight.grad, "ln.bias": ref.ln.bias.grad,
                "fc1.weight": ref.fc1.weight.grad[rows], "fc1.bias": ref.fc1.bias.grad[rows],
                "fc2.weight": ref.fc2.weight.grad[:, rows], "fc2.bias": ref.fc2.bias.grad}
        got = dict(m.named_parameters())
        for k in want:
            errs.tensor(f"grad {i}.{k}", got[k].grad, want[k])
