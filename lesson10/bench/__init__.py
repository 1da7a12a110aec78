"""Benchmarks: timing only.
``python -m lesson10 bench {sim,grade,figures,ring,ulysses,compare,moe,sp,cstar,memory,nodes,all}``.

:mod:`.harness` (interleaved reps, slowest rank, tables) and one module per benchmark:
:mod:`.attention` (ring, Ulysses), :mod:`.moe`, :mod:`.nodes` (the MoE dispatch across
nodes), :mod:`.sp`, :mod:`.cstar` (when the ring's
transfer hides), :mod:`.memory` (a rank's peak memory as N_c grows) on real ranks, and
:mod:`.sim` (the NumPy simulation, no torch). ``bench grade``, ``bench class`` and ``bench
figures`` time the course's own tooling: they live in the repository's
``benchmarks/tooling/`` (:func:`tooling`), not in the package. Tables land in
``benchmarks/results/``.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from .paths import RESULTS_DIR

__all__ = ["main", "RESULTS_DIR"]


#: ``bench WHAT`` of the course's own tools -> its module in the repository's ``benchmarks/tooling/``
TOOLING = {"grade": "grade", "class": "classroom", "figures": "figures"}


def tooling(what: str, root: Path | None = None):
    """The module of ``bench WHAT`` that times the course's own tooling. It lives in the
    course repository (``benchmarks/tooling/``), not in the installed package; a clear error
    when this install has no checkout beside it."""
    import importlib
    import sys
    root = Path(__file__).resolve().parents[2] if root is None else root
    if not (root / "benchmarks" / "tooling" / f"{TOOLING[what]}.py").is_file():
        raise SystemExit(f"bench {what}: this benchmark times the course's own tooling and lives in "
                         f"the course repository (benchmarks/tooling/), not in the installed "
                         f"package; run it from a checkout with an editable install (make test "
                         f"sets one up)")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module(f"benchmarks.tooling.{TOOLING[what]}")


def main(argv=None) -> int:
    """``python -m lesson10 bench {sim,grade,figures,ring,ulysses,moe,sp,all} [--nproc 2 4] [--seq ...]``."""
    argv = list(argv or [])
    if argv[:1] == ["sim"]:
        from .sim import main as sim_main
        return sim_main(argv[1:])
    if argv[:1] and argv[0] in TOOLING:
        return tooling(argv[0]).main(argv[1:])
    from ..runs.cli import add_size_args
    from ..runs.validate import Parser, Refused, refuse
    p = Parser(prog="python -m lesson10 bench",
               description="benchmarks of the real multi-process methods ('bench sim' times "
                           "the NumPy simulation, 'bench grade' the autograder)")
    p.add_argument("what", choices=["ring", "ulysses", "compare", "moe", "sp", "cstar", "memory",
                                    "nodes", "all"])
    p.add_argument("--nproc", type=int, nargs="+", default=[2, 4])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default=str(RESULTS_DIR), help="folder for the tables")
    p.add_argument("--no-plot", action="store_true")
    add_size_args(p)
    p.set_defaults(seq=None)
    _moe_args(p)
    _other_args(p)
    args = p.parse_args(argv)
    from .validate import check_bench
    try:
        out_dir = check_bench(args)
    except Refused as e:
        return refuse(p.prog, e)
    if args.node_size is not None:
        import os
        os.environ["LESSON10_NODE_SIZE"] = str(args.node_size)   # the ranks inherit it
    for what in (["ring", "ulysses", "moe", "sp"] if args.what == "all" else [args.what]):
        _run_one(what, args, out_dir)
    return 0


def _run_one(what: str, args, out_dir: Path) -> None:
    """One benchmark: :mod:`.attention` for ring / ulysses / compare, else its own module."""
    import importlib
    if what == "ulysses" and args.breakdown:     # where a Ulysses step goes, fused vs unfused
        from .ulysses_breakdown import bench_breakdown
        bench_breakdown(args, out_dir)
    elif what in ("ring", "ulysses", "compare"):
        from .attention import bench
        bench(argparse.Namespace(**{**vars(args), "seq": args.seq or 4096}), what, out_dir)
    else:
        importlib.import_module(f"{__name__}.{what}").bench(args, out_dir)


def _moe_args(p) -> None:
    g = p.add_argument_group("moe and sp sizes")
    g.add_argument("--hidden", type=int, default=None, help="h (default: moe 256, sp 512)")
    g.add_argument("--ffn", type=int, default=None, help="d_ff (default: moe 512, sp 4h)")
    g.add_argument("--tokens", type=int, default=2048, help="moe: tokens T per rank")
    g.add_argument("--experts", type=int, default=8, help="moe: experts E (a multiple of N_e)")
    g.add_argument("--topk", type=int, default=2, help="moe: experts per token k (<= E)")
    g.add_argument("--capacity-factor", nargs="+", default=["none", "1.0", "1.25"],
                   help="moe: the capacity factors CF > 0 to time ('none': dropless; default "
                        "none 1.0 1.25)")
    g.add_argument("--breakdown", action="store_true",
                   help="moe: where a step's time goes (router, all-to-alls, expert GEMMs), the "
                        "grouped expert matmul next to the former loop (moe_breakdown.md); "
                        "ulysses: all-to-alls, attention, copies, unfused vs fused and pipelined "
                        "(ulysses_breakdown.md)")


def _other_args(p) -> None:
    g = p.add_argument_group("nodes (flat vs two-level MoE dispatch on 2 nodes of 2 ranks)")
    g.add_argument("--twohost", action="store_true",
                   help="nodes: also run across two network namespaces (root; tc tbf on the link)")
    g.add_argument("--rate", default="200mbit",
                   help="nodes --twohost: the link's rate, tc's units (e.g. 100mbit, 1gbit)")
    g.add_argument("--node-size", type=int, default=None,
                   help="compare: pretend nodes of this many ranks; the table then shows what "
                        "crosses nodes")
    g = p.add_argument_group("cstar (2 ranks) and memory")
    g.add_argument("--bandwidth", type=float, default=None,
                   help="cstar: pace the ring's link at this many bytes/s (default: chosen from "
                        "the measured F so that c* = --target)")
    g.add_argument("--target", type=int, default=256, help="cstar: c* to aim the default pace at")
    g.add_argument("--no-pace", action="store_true",
                   help="cstar: no pacing, measure the real link (NCCL between GPUs); --target "
                        "then only sets the size of the W measurement and of F's block")
    g.add_argument("--causal", action="store_true", help="cstar: causal mask (c* doubles)")
    g.add_argument("--block", type=int, default=4096,
                   help="memory: tokens per rank c (fixed while N_c and s grow)")
    g.add_argument("--cstar-heads", type=int, default=32,
                   help="cstar: query heads (more heads = longer rounds, less timing noise)")
