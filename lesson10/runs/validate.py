"""The whole case of ``run`` and ``bench``, checked in the parent before any rank starts.

A refusal is a :class:`Refused` (a ValueError) whose message is one line: the limit that was
broken and what to use instead. The rules are the lesson's, from where they already live:
counts and numbers and the MoE configuration (:mod:`lesson10.rules`: ``1 <= k <= E``, a
capacity factor > 0, ``E`` a multiple of ``N_e``), worded here with the flags' names, the
sequence layouts (:func:`lesson10.layouts.layout_unit`), USP's group shapes and head limit
and node-limited routing (:mod:`lesson10.topology`). Ulysses is
USP with ``ulysses_size = N`` (every rank in one Ulysses group), so its head limit is
:func:`lesson10.topology.check_heads` with ``u = N``.

Memory: :func:`need_bytes` estimates what one rank of a checked run holds (the float64
single-process reference dominates: the ``b a s^2`` attention scores, the MoE layer over all
``N`` tokens), and :func:`check_memory` refuses a case whose ranks together need more than
this machine has available (``/proc/meminfo``'s MemAvailable, a cgroup's limit, or
``os.sysconf``). Nothing here imports torch, so a refusal takes well under a second.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .. import layouts, rules, topology
from ..errors import Lesson10Error
from ..rules import MoEConfig

__all__ = ["Refused", "Parser", "DTYPE_NAMES", "ELEM", "positive", "check_run", "check_attention",
           "check_sp", "check_moe", "moe_case", "MoECase", "moe_config", "need_bytes",
           "memory_available", "check_memory", "check_out", "refuse", "nodes_of",
           "parse_capacity_factor", "finite", "optional", "rule"]

#: the dtypes of the workers and benchmarks (``lesson10.spmd.device.DTYPES``), bytes per number
ELEM = {"float64": 8, "float32": 4, "bfloat16": 2}
DTYPE_NAMES = tuple(sorted(ELEM))


class Refused(Lesson10Error, ValueError):
    """A case refused before any rank starts; the message is one line."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (exit status 2)."""

    def error(self, message):  # argparse's hook
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def refuse(prog: str, exc: Exception) -> int:
    """Print ``exc`` as the one line of a refusal on stderr; returns exit status 2."""
    text = " ".join(str(exc).split())
    print(f"{prog}: refused: {text}", file=sys.stderr, flush=True)
    return 2


def positive(flag: str, value, lo: int = 1) -> int:
    """``value`` if it is an integer >= ``lo`` (:func:`lesson10.rules.count`); else
    :class:`Refused` naming ``flag``."""
    try:
        return rules.count(flag, value, lo)
    except ValueError as e:
        raise Refused(str(e)) from None


def optional(flag: str, value, lo: int = 1, meaning: str = "") -> None:
    """``None`` (the option not given) or an integer >= ``lo``: 0 never means the default."""
    try:
        if value is not None:
            rules.count(flag, value, lo)
    except ValueError as e:
        raise Refused(f"{e}" + (f" (leave it out for {meaning})" if meaning else "")) from None


def rule(where: str, fn, *args):
    """Call one of the lesson's rules; its ValueError becomes a :class:`Refused` ``where: ...``."""
    try:
        return fn(*args)
    except ValueError as e:
        raise Refused(f"{where}: {e}") from None


def parse_capacity_factor(text: str):
    """``--capacity-factor``: a number > 0, or ``none`` (dropless); :class:`Refused` otherwise."""
    if str(text).lower() in ("none", "dropless"):
        return None
    try:
        cf = float(text)
        MoEConfig(1, 1, cf)                              # the lesson's rule: CF > 0
    except ValueError:
        raise Refused(f"must be a number > 0 (copies an expert may take, per k N / E) or "
                      f"'none' (dropless), got {text!r}") from None
    return cf


# --------------------------------------------------------------------------- run
def nodes_of(args, n: int) -> topology.Topology:
    """The topology a run of ``n`` ranks has: ``--node-size``, else torchrun's
    ``LOCAL_WORLD_SIZE``, else one node."""
    size = getattr(args, "node_size", None)
    if size is None and os.environ.get("LOCAL_WORLD_SIZE", "").strip().isdigit():
        size = int(os.environ["LOCAL_WORLD_SIZE"])
    size = n if size is None else size
    try:
        return topology.Topology(n, min(size, n))
    except ValueError as e:
        raise Refused(f"--node-size {size}: {e}") from None


def check_run(args, n: int, local: int | None = None) -> None:
    """Everything ``run METHOD`` needs of ``args`` on ``n`` ranks, then the method's own rules
    (:meth:`lesson10.runs.registry.Method.validate`) and the memory of the ``local`` ranks on
    this machine (default ``n``); :class:`Refused` else."""
    from . import registry
    positive("--nproc", n)
    for flag in ("timeout", "peer_timeout"):
        finite(f"--{flag.replace('_', '-')}", getattr(args, flag))
    for flag in ("seq", "heads", "dim", "batch"):
        positive(f"--{flag}", getattr(args, flag))
    optional("--kv-heads", args.kv_heads, meaning="as many K/V heads as query heads")
    optional("--node-size", args.node_size, meaning="one node, or torchrun's LOCAL_WORLD_SIZE")
    optional("--ulysses-size", args.ulysses_size, meaning="the ranks per node")
    optional("--max-nodes", args.max_nodes, meaning="no node limit")
    if args.dtype not in ELEM:
        raise Refused(f"--dtype must be one of {', '.join(DTYPE_NAMES)}, got {args.dtype!r}")
    nodes_of(args, n)
    registry.get(args.method).validate(args, n)
    check_memory(need_bytes(args, n), local or n, f"run {args.method} on {n} ranks",
                 "a smaller --seq (or --batch, --heads, --dim)")


def check_attention(args, n: int) -> None:
    """ring, ulysses, allgather, usp: GQA, the layout's divisibility of ``s``, head limits."""
    from . import registry
    m = registry.get(args.method)
    a, a_kv, s = args.heads, args.kv_heads or args.heads, args.seq
    if a % a_kv:
        raise Refused(f"{m.name}: {a} query heads are not a multiple of --kv-heads {a_kv} "
                      f"(GQA shares each K/V head among whole groups of query heads); use a "
                      f"--kv-heads that divides --heads")
    layout = args.layout or m.default_layout
    layout = rule(f"{m.name}: --layout", layouts.layout_name, layout)
    if m.layouts is not None and layout not in m.layouts:
        raise Refused(f"{m.name}: --layout {layout} is not one of its layouts; use one of "
                      f"{', '.join(m.layouts)}")
    unit = layouts.layout_unit(n, layout)
    if s % unit:
        up = (s // unit + 1) * unit
        raise Refused(f"{m.name}: the {layout} layout cuts --seq {s} into {unit} equal pieces "
                      f"on {n} ranks, so --seq must be a multiple of {unit}; use --seq {up}"
                      + (f" or {s // unit * unit}" if s > unit else ""))
    if m.name == "ulysses":
        try:
            topology.check_heads(a, a_kv, n, n)
        except ValueError:
            raise Refused(f"ulysses: every one of the N = {n} ranks needs whole K/V heads, so "
                          f"--kv-heads {a_kv} must be a multiple of N (Ulysses' limit: N <= K/V "
                          f"heads); use --nproc dividing {a_kv}, more --kv-heads, or ring / usp"
                          ) from None
    if m.name == "usp":
        topo = nodes_of(args, n)
        u = args.ulysses_size or topology.default_ulysses_size(range(n), a_kv, topo)
        rule("usp: --ulysses-size", topology.check_ulysses_size, u, n)
        rule("usp", topology.check_heads, a, a_kv, u, n)


def check_sp(args, n: int) -> None:
    """sp: TP splits the attention heads and fc1's ffn = 4h over ``t``, SP the tokens."""
    if args.seq % n:
        raise Refused(f"sp: sequence parallelism gives each of the t = {n} ranks s/t tokens, so "
                      f"--seq {args.seq} must be a multiple of {n}; use --seq "
                      f"{(args.seq // n + 1) * n}")
    if args.heads % n:
        raise Refused(f"sp: Megatron tensor parallelism gives each of the t = {n} ranks whole "
                      f"attention heads, so --heads {args.heads} must be a multiple of {n}; use "
                      f"--heads {(args.heads // n + 1) * n} or --nproc dividing {args.heads}")


@dataclass(frozen=True)
class MoECase:
    """``run moe``'s layer: its :class:`~lesson10.rules.MoEConfig` (``E``, ``k``, the
    capacity factor of the random-router run, ``N_e`` ranks), ``T`` tokens per rank, hidden
    size ``h`` and expert width ``d_ff``."""
    config: MoEConfig
    T: int
    h: int
    d_ff: int


def _moe_choice(args, n: int) -> tuple:
    """``(E, k, cf)`` of ``run moe`` as given: ``--experts`` (default max(4, 2N)), ``--topk``
    (default 2), ``--capacity-factor`` (default 1.25)."""
    E = args.experts if getattr(args, "experts", None) is not None else max(4, 2 * n)
    k = args.topk if getattr(args, "topk", None) is not None else 2
    return E, k, getattr(args, "capacity_factor", 1.25)


def moe_case(args, n: int) -> MoECase:
    """``run moe``'s layer on ``n`` ranks (:func:`_moe_choice`), ``T = s/N`` tokens per rank,
    ``h = max(a d, E)`` (uniform routing needs ``h >= E``), ``d_ff = 2h``; :class:`Refused`
    when the MoE rules refuse it (:func:`moe_config`)."""
    E, k, cf = _moe_choice(args, n)
    config = moe_config(E, k, cf, n)
    h = max(args.heads * args.dim, config.E)
    return MoECase(config, args.seq // n, h, 2 * h)


def _holds(*args) -> bool:
    """Whether ``MoEConfig(*args)`` keeps the lesson's MoE rules."""
    try:
        MoEConfig(*args)
    except ValueError:
        return False
    return True


def moe_config(E, k, cf, n: int, where: str = "moe") -> MoEConfig:
    """``MoEConfig(E, k, cf, N_e=n)``, each rule it breaks refused in the flags' words:
    ``--experts`` and ``--topk`` counts, ``--topk <= --experts``, ``--experts`` a multiple of
    ``N_e`` (so ``E >= N_e``), a capacity factor > 0."""
    E, k = positive("--experts", E), positive("--topk", k)
    if not _holds(E, k):
        raise Refused(f"{where}: --topk {k} is more than the --experts {E} there are (a token "
                      f"picks k distinct experts); use --topk <= {E}")
    if not _holds(E, k, None, n):
        raise Refused(f"{where}: --experts {E} do not split over N_e = {n} ranks (each rank holds "
                      f"E/N_e whole experts, so E >= N_e and a multiple of it); use --experts "
                      f"{max(n, (E // n + 1) * n)} or fewer ranks")
    return rule(f"{where}: --capacity-factor", MoEConfig, E, k, cf, n)


def check_moe(args, n: int, E=None, k=None, cf=None, where: str = "moe") -> None:
    """MoE on ``n`` ranks: the rules of :func:`moe_config`, node-limited routing
    (:func:`lesson10.topology.check_nodes`), and (for ``run``, ``E=None``) ``s`` a multiple of
    ``N_e``."""
    if E is None:
        if args.seq % n:
            raise Refused(f"{where}: --seq {args.seq} tokens do not split evenly over N_e = {n} "
                          f"ranks (T = s/N_e each); use --seq {(args.seq // n + 1) * n}")
        config = moe_case(args, n).config
    else:
        config = moe_config(E, k, cf, n, where)
    max_nodes = getattr(args, "max_nodes", None)
    if where == "moe" and (max_nodes is not None or nodes_of(args, n).nodes > 1):
        count = nodes_of(args, n).nodes
        rule(f"{where}: --max-nodes", topology.check_nodes, config.E, config.k,
             count if config.E % count == 0 else None, max_nodes)


# ------------------------------------------------------------------------- memory
def need_bytes(args, n: int) -> float:
    """About how many bytes one rank of ``run METHOD`` holds at its peak. Every rank builds the
    whole input and the float64 single-process reference: for attention the ``(b, a, s, s)``
    scores, their softmax and gradients (about 5 of them) and ``q, k, v, dout`` with gradients;
    for sp the block's float64 copy over all ``s`` tokens; for moe the layer over all ``N = N_e
    T`` tokens (``k`` copies of each through ``d_ff``) and the weights."""
    b, s, a, d = args.batch, args.seq, args.heads, args.dim
    a_kv = args.kv_heads or a
    if args.method == "sp":
        h = a * d
        return 8.0 * (4 * h * 4 * h * 3 + 2 * b * s * (8 * h + 3 * 4 * h))
    if args.method == "moe":
        c = moe_case(args, n)
        N, h, k, E, f = n * c.T, c.h, c.config.k, c.config.E, c.d_ff
        return 8.0 * (N * h * 8 + N * k * (3 * h + 3 * f) + N * E * 4 + 6 * E * h * f)
    return 8.0 * (5 * b * a * s * s + 8 * b * s * (a + a_kv) * d) + s * s


def memory_available() -> int:
    """Bytes this machine can still give: MemAvailable (``/proc/meminfo``), at most a cgroup's
    remaining limit; ``os.sysconf`` where there is no ``/proc``."""
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return 1 << 62
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit.isdigit():
            avail = min(avail, int(limit) - used)
    except (OSError, ValueError):
        pass
    return max(0, avail)


def _gb(x: float) -> str:
    return f"{x / 1e9:.3g} GB"


def check_memory(per_rank: float, ranks: int, what: str, instead: str) -> None:
    """:class:`Refused` when ``ranks`` ranks of ``per_rank`` bytes exceed :func:`memory_available`."""
    have = memory_available()
    if per_rank * ranks > have:
        raise Refused(f"{what} needs about {_gb(per_rank)} per rank ({_gb(per_rank * ranks)} for "
                      f"the {ranks} rank(s) on this machine), more than the {_gb(have)} of memory "
                      f"available; use {instead}")


# ------------------------------------------------------------------------- --out
def check_out(path) -> Path:
    """``--out``: a folder that exists (or can be made) and takes a file; :class:`Refused` else."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".lesson10-probe-"):
            pass
    except OSError as e:
        raise Refused(f"--out {path}: cannot write there ({e.strerror or e}); use a folder you "
                      f"can write to, e.g. --out benchmarks/results") from None
    return out


def finite(flag: str, value, unit: str = "seconds") -> float:
    """``value`` if it is a finite number > 0 (of ``unit``, :func:`lesson10.rules.number`);
    :class:`Refused` else."""
    try:
        return rules.number(flag, value)
    except ValueError:
        raise Refused(f"{flag} must be a finite number of {unit} > 0, got {value!r}") from None
