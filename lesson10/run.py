"""One checked multi-process run of a method, from the command line.

    python -m lesson10 run ring --nproc 4 --seq 1024          # starts 4 ranks (gloo / NCCL)
    torchrun --nproc-per-node 8 -m lesson10.run ring --seq 65536   # this process is one rank

Methods: those of :data:`lesson10.methods.METHODS` (``sp``: TP and TP + SP; ``ring``,
``ulysses``, ``allgather``, ``usp``; ``moe``: uniform routing, then a random router with
capacity factor 1.25). Each run is a worker of
:mod:`lesson10.spmd.workers`: it compares outputs and gradients with a single-process
reference and prints the time, the largest error and the bytes each rank sent next to
the lesson's formula. An error is judged relative to the size of the values it is in
(``|got - want| <= tol * max(1, |want|)``, tol by dtype: float32 1e-4), so long sequences
and large gradients pass in float32 as they should.

Exit status: 0 every checked run passed; 1 a run's error is above its tolerance; 2 the
method rejected the case (the message says what and why), or the arguments are wrong.
"""
from __future__ import annotations

import argparse
import sys

__all__ = ["main", "add_size_args", "cases", "report", "verdict"]

from .methods import METHODS as _REGISTRY

METHODS = tuple(_REGISTRY)


def add_size_args(p: argparse.ArgumentParser) -> None:
    """The size options ``run`` and ``bench`` share."""
    from .spmd.device import DTYPES
    p.add_argument("--seq", type=int, default=4096, help="whole sequence length s")
    p.add_argument("--heads", type=int, default=8, help="query heads a")
    p.add_argument("--kv-heads", type=int, default=None, help="K/V heads (GQA); default = heads")
    p.add_argument("--dim", type=int, default=64, help="head dim d")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    p.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    p.add_argument("--timeout", type=float, default=600.0)


def _parser(prog: str) -> argparse.ArgumentParser:
    listing = "; ".join(f"{m.name}: {m.summary}" for m in _REGISTRY.values())
    p = argparse.ArgumentParser(prog=prog, description=f"one checked multi-process run. "
                                f"Methods: {listing}")
    p.add_argument("method", choices=METHODS)
    p.add_argument("--nproc", type=int, default=2, help="ranks to start (ignored under torchrun)")
    p.add_argument("--layout", default=None, help="contiguous | zigzag | striped (default: the "
                   "method's own, " + ", ".join(f"{m.name} {m.default_layout}"
                                                for m in _REGISTRY.values() if m.default_layout)
                   + ")")
    p.add_argument("--no-causal", action="store_true")
    p.add_argument("--no-overlap", action="store_true")
    p.add_argument("--ulysses-size", type=int, default=None,
                   help="usp: Ulysses degree u (ranks per group; default: the ranks per node)")
    p.add_argument("--max-nodes", type=int, default=None,
                   help="moe: node-limited routing, each token uses experts on at most this "
                        "many nodes (DeepSeek-V3)")
    p.add_argument("--dispatch", default="auto", choices=["auto", "flat", "two_level"],
                   help="moe: flat all-to-all, or two-level (one copy per token per remote node, "
                        "then a fan-out inside the node); auto: two-level across nodes")
    p.add_argument("--node-size", type=int, default=None,
                   help="pretend nodes of this many ranks (default: torchrun's LOCAL_WORLD_SIZE, "
                        "else one node): bytes are then split into inside / across nodes")
    add_size_args(p)
    p.set_defaults(seq=1024, dtype="float32")
    return p


def cases(args, n: int) -> list[tuple]:
    """``(worker name, kwargs)`` for each checked run of ``args.method`` on ``n`` ranks."""
    topo = {"node_size": args.node_size} if getattr(args, "node_size", None) else {}
    if _REGISTRY[args.method].worker == "check_attention":
        extra = {"ulysses_size": args.ulysses_size} if args.method == "usp" else {}
        return [("check_attention", dict(
            method=args.method, b=args.batch, s=args.seq, a=args.heads,
            a_kv=args.kv_heads or args.heads, d=args.dim, causal=not args.no_causal,
            layout=args.layout, dtype=args.dtype, overlap=not args.no_overlap, **extra, **topo))]
    h = args.heads * args.dim
    if args.method == "sp":
        return [("check_sp", dict(b=args.batch, s=args.seq, h=h, ffn=4 * h, p=0.1,
                                  sequence_parallel=sp, blocks=1, dtype=args.dtype, **topo))
                for sp in (False, True)]
    E = max(4, 2 * n)
    base = dict(T=max(E, args.seq // n), h=max(h, E), E=E, d_ff=2 * h, k=2, dtype=args.dtype,
                max_nodes=args.max_nodes, dispatch=args.dispatch, **topo)
    return [("check_moe", dict(base, routing="uniform")),
            ("check_moe", dict(base, routing="random", capacity_factor=1.25))]


def _case(res: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in res["case"].items() if v is not None and v is not False)


def report(res: dict) -> str:
    """A few lines on one result of :mod:`lesson10.spmd.workers` (rank 0's)."""
    if "error" in res:
        return (f"{res['method']}: REJECTED, the method refused this case before running it: "
                f"{res['error']}\n  case: {_case(res)}")
    from .spmd.comm import SIDE_OPS
    side = {k: v for k, v in res["fwd_by_op"].items() if k in SIDE_OPS}
    errs = ", ".join(f"{k} {v:.1e}" for k, v in res["err"].items())
    w = res["worst"]
    worst = (f"; relative to the values' size, worst {w}: {res['max_rel_err']:.1e} "
             f"(values up to {res['scale'][w]:.1e})") if w else ""
    return "\n".join([
        f"{res['method']} on N={res['n']} ranks: {_case(res)}",
        f"  fwd+bwd time (slowest rank): {1e3 * res['time_s']:.1f} ms",
        f"  max |error| vs single-process reference: {res['max_err']:.2e} "
        f"-> {'OK' if res['ok'] else 'FAILED, above the tolerance'}{worst}",
        f"    (tolerance {res['tol']:g} x max(1, |value|) for each of: {errs})",
        f"  bytes sent per rank, forward: {res['fwd']:,} ({_formula_name(res)}: "
        f"{res['formula_fwd']:,.0f})" + (f"; besides: {side}" if side else ""),
        f"  bytes sent per rank, backward: {res['bwd']:,}", *_link_lines(res)])


def _ints(values) -> str:
    return "[" + ", ".join(f"{v:,}" for v in values) + "]"


def _formula_name(res: dict) -> str:
    return ("the lesson's formula for the flat dispatch" if res.get("dispatch") == "two_level"
            else "lesson's formula")


def _link_lines(res: dict) -> list[str]:
    """Where the bytes went, when the ranks span nodes; USP's ``u`` and warnings."""
    lines = []
    if res.get("ulysses_size"):
        lines.append(f"  ulysses_size u = {res['ulysses_size']} (ring of {res['n'] // res['ulysses_size']})")
    lines += [f"  warning: {w}" for w in res.get("warnings", [])]
    if (res.get("nodes") or 1) > 1:
        by = res["link_by_rank"]
        lines.append(f"  on {res['nodes']} nodes of {res['node_size']} ranks, bytes each rank sent "
                     f"(forward / backward):")
        lines.append(f"    inside its node: {_ints(by['fwd_intra'])} / {_ints(by['bwd_intra'])}")
        lines.append(f"    across nodes:    {_ints(by['fwd_inter'])} / {_ints(by['bwd_inter'])}")
        want = res.get("link_expected")
        if want:
            lines.append(f"    {res.get('dispatch', '')} dispatch, rank 0 from the routing: inside "
                         f"{want['intra']:,}, across {want['inter']:,} forward")
    return lines


def main(argv=None) -> int:
    """``python -m lesson10 run METHOD --nproc N [sizes]``; under torchrun the same, one rank
    per process (see :func:`lesson10.spmd.launch.init_from_env`)."""
    from .spmd.launch import init_from_env, is_torchrun, launch, shutdown
    from .spmd.workers import run_checks
    torchrun = is_torchrun()
    args = _parser("torchrun ... -m lesson10.run" if torchrun else "python -m lesson10 run").parse_args(argv)
    if torchrun:
        import torch.distributed as dist
        init_from_env(args.backend, timeout=args.timeout)
        try:
            results = run_checks(cases(args, dist.get_world_size()))
            if dist.get_rank() != 0:
                return 0
        finally:
            shutdown()
    else:
        results = launch(run_checks, args.nproc, cases(args, args.nproc), backend=args.backend,
                         timeout=args.timeout)[0]
    for res in results:
        print(report(res))
    line, status = verdict(results)
    print(line)
    return status


def verdict(results: list[dict]) -> tuple[str, int]:
    """The last line of ``run`` and its exit status (0 passed, 1 a check failed, 2 rejected)."""
    rejected = [r for r in results if "error" in r]
    failed = [r for r in results if "error" not in r and not r["ok"]]
    if rejected:
        return (f"REJECTED: {len(rejected)} of {len(results)} case(s) refused by "
                f"{rejected[0]['method']}: {rejected[0]['error']}", 2)
    if failed:
        names = ", ".join(f"{r['method']} ({r['worst']} {r['max_rel_err']:.1e} > {r['tol']:g})" for r in failed)
        return f"FAILED: {len(failed)} of {len(results)} checked run(s) above tolerance: {names}", 1
    return f"{len(results)} checked run(s) passed: OK", 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
