"""One checked multi-process run of a method, from the command line.

    python -m lesson10 run ring --nproc 4 --seq 1024          # starts 4 ranks (gloo / NCCL)
    torchrun --nproc-per-node 8 -m lesson10.run ring --seq 65536   # this process is one rank

Methods: those of :data:`lesson10.runs.registry.METHODS` (``sp``: TP and TP + SP; ``ring``,
``ulysses``, ``allgather``, ``usp``; ``moe``: uniform routing, then a random router with
``--capacity-factor`` (default 1.25), ``--experts E`` (default max(4, 2N)) and ``--topk k``
(default 2)). The whole case is checked in this process before any rank starts
(:mod:`lesson10.runs.validate`): a refusal is one line on stderr and exit status 2. Each run
is a worker of
:mod:`lesson10.runs.workers`: it compares outputs and gradients with a single-process
reference and prints the time, the largest error and the bytes each rank sent next to
the lesson's formula. An error is judged relative to the size of the values it is in
(``|got - want| <= tol * max(1, |want|)``, tol by dtype: float32 1e-4), so long sequences
and large gradients pass in float32 as they should.

Exit status: 0 every checked run passed; 1 a run's error is above its tolerance; 2 the
case was refused (the message says what and why), or the arguments are wrong.
3: a peer stopped answering (``--peer-timeout``), 4: the run passed ``--timeout``. Under
torchrun every rank computes the verdict and exits with the largest status of all ranks
(only rank 0 prints the report), so ``torchrun`` fails on every node when a check fails or
is rejected anywhere.

Two time limits:

* ``--timeout SECONDS`` (default 600): the whole run's wall-clock limit. ``python -m
  lesson10 run`` kills every rank past it; under torchrun a watchdog in each rank does it.
  Either way the message says that ``--timeout`` was hit, and the status is 4.
* ``--peer-timeout SECONDS`` (default 60): the process group's timeout, how long the start or
  one collective waits for another rank. A peer that died, hangs or was cut off surfaces
  within about that long on every rank still running: each prints that a peer stopped
  answering within ``--peer-timeout`` and exits with status 3. Raise it only for steps that
  really take longer than a minute between two collectives.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading

__all__ = ["main", "main_rank", "add_size_args", "cases", "report", "verdict", "all_ranks_max",
           "peer_lost_message", "start_watchdog", "PEER_TIMEOUT", "PEER_LOST", "TIMED_OUT"]

from .registry import METHODS as _REGISTRY

METHODS = tuple(_REGISTRY)


#: under torchrun, how long a refused rank other than a node's first waits before it exits
REFUSAL_WAIT_S = 30.0

def add_size_args(p: argparse.ArgumentParser) -> None:
    """The size options ``run`` and ``bench`` share (parsed without importing torch)."""
    from .validate import DTYPE_NAMES
    p.add_argument("--seq", type=int, default=4096, help="whole sequence length s")
    p.add_argument("--heads", type=int, default=8, help="query heads a")
    p.add_argument("--kv-heads", type=int, default=None, help="K/V heads (GQA); default = heads")
    p.add_argument("--dim", type=int, default=64, help="head dim d")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default="float32", choices=DTYPE_NAMES)
    p.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    p.add_argument("--timeout", type=float, default=600.0,
                   help="the run's total wall-clock limit in seconds (default 600)")


def _parser(prog: str) -> argparse.ArgumentParser:
    listing = "; ".join(f"{m.name}: {m.summary}" for m in _REGISTRY.values())
    from .validate import Parser, parse_capacity_factor
    p = Parser(prog=prog, description=f"one checked multi-process run. Methods: {listing}")
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
    p.add_argument("--experts", type=int, default=None,
                   help="moe: experts E, a multiple of the ranks N_e (default max(4, 2 N_e))")
    p.add_argument("--topk", type=int, default=None,
                   help="moe: experts per token k, 1 <= k <= E (default 2)")
    p.add_argument("--capacity-factor", type=_capacity(parse_capacity_factor), default=1.25,
                   help="moe: the capacity factor CF > 0 of the random-router run, or 'none' "
                        "(dropless); the uniform-router run is dropless (default 1.25)")
    p.add_argument("--node-size", type=int, default=None,
                   help="pretend nodes of this many ranks (default: torchrun's LOCAL_WORLD_SIZE, "
                        "else one node): bytes are then split into inside / across nodes")
    add_size_args(p)
    p.add_argument("--peer-timeout", type=float, default=PEER_TIMEOUT,
                   help="seconds the start or one collective waits for another rank (the "
                   "process group's timeout, default %(default)g): a dead or hung peer ends "
                   "every other rank within about this long, with exit status 3")
    p.set_defaults(seq=1024, dtype="float32")
    return p


def _capacity(parse):
    """An argparse ``type`` from a parser that raises :class:`~.validate.Refused`."""
    def convert(text):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return convert


#: ``--peer-timeout``'s default, seconds; exit statuses of a torchrun rank besides 0, 1, 2
PEER_TIMEOUT = 60.0
PEER_LOST, TIMED_OUT = 3, 4


def cases(args, n: int) -> list[tuple]:
    """``(worker name, kwargs)`` for each checked run of ``args.method`` on ``n`` ranks."""
    ns = getattr(args, "node_size", None)
    topo = {"node_size": ns} if ns is not None else {}
    if _REGISTRY[args.method].worker == "check_attention":
        extra = {"ulysses_size": args.ulysses_size} if args.method == "usp" else {}
        a_kv = args.heads if args.kv_heads is None else args.kv_heads
        return [("check_attention", dict(
            method=args.method, b=args.batch, s=args.seq, a=args.heads,
            a_kv=a_kv, d=args.dim, causal=not args.no_causal,
            layout=args.layout, dtype=args.dtype, overlap=not args.no_overlap, **extra, **topo))]
    h = args.heads * args.dim
    if args.method == "sp":
        return [("check_sp", dict(b=args.batch, s=args.seq, h=h, ffn=4 * h, p=0.1,
                                  sequence_parallel=sp, blocks=1, dtype=args.dtype, **topo))
                for sp in (False, True)]
    from .validate import moe_case
    c = moe_case(args, n)
    base = dict(T=c.T, h=c.h, E=c.config.E, d_ff=c.d_ff, k=c.config.k, dtype=args.dtype,
                max_nodes=args.max_nodes, dispatch=args.dispatch, **topo)
    return [("check_moe", dict(base, routing="uniform")),
            ("check_moe", dict(base, routing="random", capacity_factor=c.config.capacity_factor))]


def _case(res: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in res["case"].items() if v is not None and v is not False)


def report(res: dict) -> str:
    """A few lines on one result of :mod:`lesson10.runs.workers` (rank 0's)."""
    if "error" in res:
        return (f"{res['method']}: REJECTED, the method refused this case before running it: "
                f"{res['error']}\n  case: {_case(res)}")
    from ..spmd.comm import SIDE_OPS
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
        lines.append(f"    across nodes:    {_ints(by['fwd_inter'])} / {_ints(by['bwd_inter'])}"
                     "  (activations, the lesson's ring model)")
        if "fwd_wire_inter" in by:
            lines.append(f"    on the wire across nodes: {_ints(by['fwd_wire_inter'])} / "
                         f"{_ints(by['bwd_wire_inter'])}  ({_wire_note(res)})")
        want = res.get("link_expected")
        if want:
            lines.append(f"    {res.get('dispatch', '')} dispatch, rank 0 from the routing: inside "
                         f"{want['intra']:,}, across {want['inter']:,} forward")
    return lines


def _wire_note(res: dict) -> str:
    """What the "on the wire" figure is: gloo's algorithms, or the model (NCCL's unknown)."""
    if res.get("wire_model"):
        return (f"model: {res.get('backend') or 'the backend'} picks its algorithm at run time; "
                "side traffic included")
    return ("gloo's algorithms: its reduce-scatter is an all-reduce; side traffic included; "
            "the kernel's counters agree within 5%")


def main(argv=None) -> int:
    """``python -m lesson10 run METHOD --nproc N [sizes]``; under torchrun the same, one rank
    per process (see :func:`lesson10.spmd.torchrun.init_from_env`): every rank returns the
    largest exit status of all ranks, only rank 0 prints. The whole case is checked first,
    in this process, before torch is imported or any rank starts
    (:func:`lesson10.runs.validate.check_run`): a refusal is one line and exit status 2."""
    from .validate import Refused, check_run, refuse
    torchrun = _is_torchrun()
    prog = "torchrun ... -m lesson10.run" if torchrun else "python -m lesson10 run"
    args = _parser(prog).parse_args(argv)
    n = int(os.environ.get("WORLD_SIZE", "1")) if torchrun else args.nproc
    try:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", n)) if torchrun else n
        check_run(args, n, local)
    except Refused as e:
        if not torchrun or os.environ.get("LOCAL_RANK", "0") == "0":
            return refuse(prog, e)
        # the node's first rank says why; the others let it go first (torchrun ends them
        # once it has exited), so a loaded machine never kills that rank before it speaks
        import time
        time.sleep(REFUSAL_WAIT_S)
        return 2
    if torchrun:
        return main_rank(args)
    from ..spmd.launch import LaunchTimeout, RankError, is_peer_error, launch
    from .workers import run_checks
    try:
        results = launch(run_checks, args.nproc, cases(args, args.nproc), backend=args.backend,
                         timeout=args.timeout, peer_timeout=args.peer_timeout)[0]
    except LaunchTimeout as e:
        print(f"the run did not finish within --timeout {args.timeout:g} s (its total "
              f"wall-clock limit): {e}", file=sys.stderr)
        return TIMED_OUT
    except RankError as e:
        if not is_peer_error(e):
            raise
        print(peer_lost_message(e.rank, args.peer_timeout, e), file=sys.stderr)
        return PEER_LOST
    except ValueError as e:                 # e.g. NCCL asked for with too few GPUs
        return refuse(prog, e)
    for res in results:
        print(report(res))
    line, status = verdict(results)
    print(line)
    return status


def _is_torchrun() -> bool:
    """:func:`lesson10.spmd.torchrun.is_torchrun` without importing torch."""
    return "TORCHELASTIC_RUN_ID" in os.environ or all(
        v in os.environ for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def main_rank(args) -> int:
    """The body of one torchrun rank: init (process-group timeout ``args.peer_timeout``), the
    checked runs, this rank's verdict, then the largest status over all ranks (one all-reduce,
    after the runs, outside their byte counts). Rank 0 prints the report. A peer that stops
    answering ends this process at once (``os._exit``) with :data:`PEER_LOST` and a message,
    and leaves :func:`lesson10.runs.agent.stop_agent_later` to end a torchrun agent that would
    hang on a lost rendezvous store (a node's first rank leaves one when it exits 0 too, for
    torchrun's exit barrier); ``args.timeout`` is enforced by :func:`start_watchdog`."""
    import torch.distributed as dist

    from ..spmd.launch import is_peer_error
    from ..spmd.torchrun import init_from_env, shutdown
    from .agent import AGENT_GRACE, AT_EXIT_BARRIER, stop_agent_later, torchrun_agent
    from .workers import run_checks
    rank = int(os.environ.get("RANK", "0"))
    agent = torchrun_agent()
    watchdog = start_watchdog(args.timeout, rank)
    try:
        init_from_env(args.backend, peer_timeout=args.peer_timeout)
        results = run_checks(cases(args, dist.get_world_size()))
        line, status = verdict(results)
        worst = all_ranks_max(status)
    except Exception as e:
        if not is_peer_error(e):
            raise
        print(peer_lost_message(rank, args.peer_timeout, e), file=sys.stderr, flush=True)
        sys.stdout.flush()
        stop_agent_later(agent, rank)
        # at once: tearing down a process group whose peer is gone can hang, or abort
        # ("terminate called without an active exception") at interpreter exit
        os._exit(PEER_LOST)
    watchdog.cancel()
    shutdown()
    if worst == 0 and os.environ.get("LOCAL_RANK", "0") == "0":   # torchrun's exit barrier next
        stop_agent_later(agent, rank, args.peer_timeout + AGENT_GRACE, AT_EXIT_BARRIER)
    if rank == 0:
        for res in results:
            print(report(res))
        print(line)
        if worst != status:
            print(f"another rank's verdict was worse: exit status {worst}")
    return worst


def all_ranks_max(status: int) -> int:
    """The largest ``status`` over all ranks of the default process group (an all-reduce)."""
    import torch
    import torch.distributed as dist

    from ..spmd.device import current_device
    t = torch.tensor([status], dtype=torch.int64, device=current_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def peer_lost_message(rank: int, peer_timeout: float, exc: BaseException) -> str:
    """What a rank prints when a collective gave up on a peer."""
    text = str(exc).strip()
    first = (text.splitlines() or [type(exc).__name__])[0]
    hint = ""
    if "127.0." in text or "connecting" in text.lower() or "connectfullmesh" in text.lower():
        hint = (" If this happens at the start on several machines: the ranks announce an address "
                "the others cannot reach (a hostname that resolves to 127.0.x.x): set "
                "GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME to the interface between the nodes.")
    return (f"rank {rank}: a peer stopped answering: no reply within --peer-timeout "
            f"{peer_timeout:g} s, or its connection closed (a rank or node died, hangs or was "
            f"cut off). This rank gives up with exit status {PEER_LOST}. "
            f"({type(exc).__name__}: {first[:300]}){hint}")


def start_watchdog(seconds: float, rank: int) -> threading.Timer:
    """A daemon timer that ends this process with :data:`TIMED_OUT` after ``seconds`` (the run's
    ``--timeout``), saying which limit was hit; ``.cancel()`` it when the run is done."""
    def fire():
        print(f"rank {rank}: the run did not finish within --timeout {seconds:g} s (its total "
              f"wall-clock limit); stopping with exit status {TIMED_OUT}. A peer that stops "
              "answering ends the run sooner, within --peer-timeout.", file=sys.stderr,
              flush=True)
        os._exit(TIMED_OUT)
    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    return timer


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

