"""The registry of the lesson's parallel methods: one record per method, read by everyone.

``python -m lesson10 run`` (its choices, help and cases), :mod:`lesson10.runs.workers`
(which function a checked run calls, and its default layout), the benchmarks, the CLI's
usage text and the README's method table all read :data:`METHODS`; a test checks that
each of them names every method. Adding a method is one record here plus its functions
(see CONTRIBUTING.md).

A record names its functions by import path (``"module:attr"``), so reading the registry
imports neither torch nor the methods themselves.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from .. import cost, topology

__all__ = ["Method", "METHODS", "get", "names", "attention_names"]


@dataclass(frozen=True)
class Method:
    """One parallel method of the lesson.

    ``spmd`` / ``sim``: import paths of its real and simulated function; ``worker``: the
    checked run of :mod:`lesson10.runs.workers` that runs it; ``layouts``: the layouts it
    accepts (``None``: any positions, ``()``: it has no sequence layout); ``default_layout``;
    ``options``: its extra keyword arguments beyond the shared ones; ``bytes_fwd(s, h, n,
    g=1, e=2, **options)``: the lesson's forward bytes per rank (b = 1), from
    :mod:`lesson10.cost`; ``check``: the import path of ``check(args, n)``, which refuses a
    ``run`` case on ``n`` ranks before any rank starts (:mod:`lesson10.runs.validate`).
    """
    name: str
    summary: str
    spmd: str
    sim: str
    worker: str
    bytes_fwd: object
    layouts: tuple | None = ()
    default_layout: str | None = None
    options: tuple = field(default_factory=tuple)
    check: str = "lesson10.runs.validate:check_attention"

    def validate(self, args, n: int) -> None:
        """Refuse ``args`` (``run``'s options) on ``n`` ranks by this method's rules: a
        :class:`lesson10.runs.validate.Refused` with one line (no torch, no rank started)."""
        _load(self.check)(args, n)

    def spmd_function(self):
        """The ``lesson10.spmd`` function (imports torch)."""
        return _load(self.spmd)

    def sim_function(self):
        """The ``lesson10.sim`` function."""
        return _load(self.sim)


def _load(path: str):
    module, attr = path.split(":")
    return getattr(importlib.import_module(module), attr)


def _usp_bytes(s, h, n, g=1, e=2, ulysses_size=None):
    u = topology.usp_ulysses_size(ulysses_size, range(n))     # None: topology's default
    return cost.usp_bytes(s, h, u, n // u, g=g, e=e)


def _moe_bytes(s, h, n, g=1, e=2, k=2):
    return cost.moe_a2a_bytes(k, s // n, h, n, e=e)


_ANY = None               # the method takes any positions (a layout name or a permutation)
METHODS: dict[str, Method] = {m.name: m for m in (
    Method("sp", "Megatron sequence parallelism (TP and TP + SP)",
           "lesson10.spmd.sp:SequenceParallelBlock", "lesson10.sim.sp:sp_forward", "check_sp",
           lambda s, h, n, g=1, e=2: cost.comm_bytes("sp", s, h, n, g=g, e=e),
           check="lesson10.runs.validate:check_sp"),
    Method("ring", "ring attention (context parallelism)",
           "lesson10.spmd.ring:ring_attention", "lesson10.sim.ring:ring_attention",
           "check_attention", lambda s, h, n, g=1, e=2: cost.comm_bytes("ring", s, h, n, g=g, e=e),
           _ANY, "zigzag", ("doc_ids", "impl")),
    Method("ulysses", "DeepSpeed-Ulysses (sequence -> heads all-to-all)",
           "lesson10.spmd.ulysses:ulysses_attention", "lesson10.sim.ulysses:ulysses_attention",
           "check_attention",
           lambda s, h, n, g=1, e=2: cost.comm_bytes("ulysses", s, h, n, g=g, e=e),
           ("contiguous", "zigzag", "striped"), "contiguous", ("replicate_kv",)),
    Method("allgather", "all-gather context parallelism (Llama 3)",
           "lesson10.spmd.allgather:allgather_attention",
           "lesson10.sim.allgather:allgather_attention", "check_attention",
           lambda s, h, n, g=1, e=2: cost.comm_bytes("allgather", s, h, n, g=g, e=e),
           _ANY, "zigzag", ("doc_ids", "impl")),
    Method("usp", "Ulysses inside a node, ring across nodes (USP)",
           "lesson10.spmd.usp:usp_attention", "lesson10.sim.usp:usp_attention",
           "check_attention", _usp_bytes, ("contiguous", "zigzag"), "zigzag",
           ("ulysses_size", "doc_ids", "impl")),
    Method("moe", "MoE expert parallelism (top-k, capacity factor)",
           "lesson10.spmd.moe:ExpertParallelMoE", "lesson10.sim.moe:moe_layer", "check_moe",
           _moe_bytes, (), None, ("capacity_factor", "nodes", "max_nodes"),
           check="lesson10.runs.validate:check_moe"),
)}


def names() -> tuple[str, ...]:
    """Every method's name, in the lesson's order."""
    return tuple(METHODS)


def attention_names() -> tuple[str, ...]:
    """The methods that :func:`lesson10.runs.workers.check_attention` runs."""
    return tuple(n for n, m in METHODS.items() if m.worker == "check_attention")


def get(name: str) -> Method:
    """The record of ``name``; a ValueError that lists the methods otherwise."""
    if name not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {name!r}")
    return METHODS[name]
