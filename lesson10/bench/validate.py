"""The whole case of ``python -m lesson10 bench WHAT``, checked before any rank starts.

The same rules and one-line refusals as ``run`` (:mod:`lesson10.runs.validate`): positive
sizes, every ``--nproc`` against each benchmark's divisibility and head limits, the MoE's
``E``, ``k`` and capacity factors, a writable ``--out``, ``--twohost``'s namespaces and
``--rate``, and the memory the ranks of one launch need against what this machine has.
No torch is imported here.
"""
from __future__ import annotations

from pathlib import Path

from .. import layouts, topology
from ..runs.validate import (
    ELEM,
    Refused,
    check_memory,
    check_moe,
    check_out,
    finite,
    optional,
    positive,
    rule,
)

__all__ = ["check_bench", "attention_sizes", "ulysses_fits"]


def check_bench(args) -> Path:
    """Refuse ``args`` of ``bench`` (:class:`Refused`, one line); returns the ``--out`` folder."""
    for n in args.nproc:
        positive("--nproc", n)
    for flag in ("reps", "heads", "dim", "batch", "tokens", "experts", "topk", "cstar_heads"):
        positive(f"--{flag.replace('_', '-')}", getattr(args, flag))
    for flag in ("seq", "hidden", "ffn", "kv_heads", "node_size"):
        optional(f"--{flag.replace('_', '-')}", getattr(args, flag))
    finite("--timeout", args.timeout)
    if args.bandwidth is not None:
        finite("--bandwidth", args.bandwidth, "bytes/s")
    positive("--target", args.target, 2)
    positive("--block", args.block, 2)
    whats = ["ring", "ulysses", "moe", "sp"] if args.what == "all" else [args.what]
    for what in whats:
        _CHECKS.get(what, lambda a: None)(args)
    return check_out(args.out)


def attention_sizes(args, what: str) -> tuple[int, int, int]:
    """``(s, a, a_kv)`` of ``bench ring|ulysses`` (K/V heads default: all) or ``compare``
    (default: a quarter of the heads, GQA)."""
    a = args.heads
    default_kv = max(1, a // 4) if what == "compare" else a
    return args.seq or 4096, a, args.kv_heads or default_kv


def ulysses_fits(a: int, a_kv: int, n: int) -> bool:
    """Whether Ulysses runs on ``n`` ranks (whole K/V heads per rank: USP's limit, u = N)."""
    try:
        topology.check_heads(a, a_kv, n, n)
    except ValueError:
        return False
    return True


def _attention(args, what: str) -> None:
    s, a, a_kv = attention_sizes(args, what)
    e = ELEM[args.dtype]
    if a % a_kv:
        raise Refused(f"bench {what}: {a} query heads are not a multiple of --kv-heads {a_kv} "
                      f"(GQA); use a --kv-heads that divides --heads")
    for n in args.nproc:
        unit = layouts.layout_unit(n, "zigzag")
        if s % unit:
            raise Refused(f"bench {what}: the zig-zag layout cuts --seq {s} into {unit} pieces on "
                          f"{n} ranks, so --seq must be a multiple of {unit}; use --seq "
                          f"{(s // unit + 1) * unit}")
        if what == "ulysses" and not ulysses_fits(a, a_kv, n):
            raise Refused(f"bench ulysses: on N = {n} ranks every rank needs whole heads, so "
                          f"--heads {a} and --kv-heads {a_kv} must be multiples of {n}; use "
                          f"--nproc dividing {a_kv}, or more heads")
        if what == "compare" and args.node_size is not None:
            rule("bench compare: --node-size", topology.Topology, n, min(args.node_size, n))
        c, b, d = s // n, args.batch, args.dim
        rank = e * b * (c * (a + 2 * a_kv) * d * 10 + 3 * a * c * c)
        one = e * b * (s * (a + 2 * a_kv) * d * 8 + 3 * a * s * s)     # SDPA over all s, rank 0
        check_memory(rank + one / n, n, f"bench {what} at --seq {s} on {n} ranks",
                     "a smaller --seq (or --batch, --heads)")


def _moe(args) -> None:
    from ..runs.validate import parse_capacity_factor
    cfs = [rule("bench moe: --capacity-factor", parse_capacity_factor, c)
           for c in args.capacity_factor]
    E, k, T, e = args.experts, args.topk, args.tokens, ELEM[args.dtype]
    h, f = args.hidden or 256, args.ffn or 512
    for n in args.nproc:
        for cf in cfs:
            check_moe(args, n, E, k, cf, where="bench moe")
        rank = e * (T * (6 * h + k * (3 * h + 3 * f)) + 4 * (E // n) * h * f)
        dense = e * (n * T * (6 * h + k * (3 * h + 3 * f) + 4 * E) + 4 * E * h * f)
        check_memory(rank + dense / n, n, f"bench moe at --tokens {T} on {n} ranks",
                     "fewer --tokens (or a smaller --hidden, --ffn)")


def _sp(args) -> None:
    s, h = args.seq or 2048, args.hidden or 512
    f, e = args.ffn or 4 * h, ELEM[args.dtype]
    for n in args.nproc:
        if s % n or f % n:
            raise Refused(f"bench sp: --seq {s} tokens and the ffn width {f} must be multiples of "
                          f"the TP degree t = {n}; change --seq / --ffn or --nproc")
        check_memory(e * (args.batch * s * (6 * h + 4 * f // n) + 4 * h * f // n), n,
                     f"bench sp at --seq {s} on {n} ranks", "a smaller --seq (or --hidden)")


def _nodes(args) -> None:
    E, k = args.experts, args.topk
    check_moe(args, 4, E, k, None, where="bench nodes (4 ranks)")
    rule("bench nodes (2 nodes, --max-nodes 1)", topology.check_nodes, E, k, 2, 1)
    h, f, T, e = args.hidden or 256, args.ffn or 512, args.tokens, ELEM[args.dtype]
    check_memory(e * (T * (6 * h + k * (3 * h + 3 * f)) + E * h * f), 4,
                 f"bench nodes at --tokens {T}", "fewer --tokens")
    if args.twohost:
        from .nodes import twohost_harness
        try:
            harness = twohost_harness()
        except SystemExit as e:
            raise Refused(str(e)) from None
        why = harness.namespaces_unavailable()
        if why:
            raise Refused(f"bench nodes --twohost: cannot make two hosts here: {why}; leave out "
                          "--twohost for the one-machine table")
        rule("bench nodes --twohost: --rate", harness.parse_rate, args.rate)


def _cstar(args) -> None:
    a = args.cstar_heads
    if a % (args.kv_heads or a):
        raise Refused(f"bench cstar: --cstar-heads {a} are not a multiple of --kv-heads "
                      f"{args.kv_heads}; use a --kv-heads that divides them")


def _memory(args) -> None:
    a, d, c, e = args.heads, args.dim, args.block, ELEM[args.dtype]
    if c % 2:
        raise Refused(f"bench memory: the zig-zag ring cuts each rank's --block {c} tokens into "
                      f"two chunks; use an even --block, e.g. {c + 1}")
    for n in args.nproc:
        check_memory(e * (12 * c * a * d + 3 * a * c * c), n, f"bench memory at --block {c}",
                     "a smaller --block")


_CHECKS = {"ring": lambda a: _attention(a, "ring"), "ulysses": lambda a: _attention(a, "ulysses"),
           "compare": lambda a: _attention(a, "compare"), "moe": _moe, "sp": _sp,
           "nodes": _nodes, "cstar": _cstar, "memory": _memory}
