"""Checks of notebook 06: the student's own ``torch.distributed`` code, run on real ranks.

Checked in Jupyter only: the grader's sandbox starts no ranks, so these checks are not
registered exercises (the grader counts notebook 06 among the notebooks without exercises).

A spawned rank cannot import a function typed into a notebook cell, so the check cell copies
the *source* of the student's definition (and the imports of its cell) into a temporary
module; each rank imports that module, runs the student's code there and reports plain data
(:func:`ring_shift_ranks`, :func:`gather_ranks`); the judge (:func:`judge_ring_shift`,
:func:`judge_gather`) turns what the ranks saw into the verdict. torch is imported inside the
functions: the grader imports every module of ``lesson10.checks`` and has no torch.
"""
from __future__ import annotations

import ast
import linecache
import os
import shutil
import tempfile
import textwrap
from pathlib import Path

from .core import fail_check
from .feedback import CheckFailed, show_or_raise
from .nb06_progress import Watchdog, deadlock_text
from .nb06_ranks import gather_ranks, ring_shift_ranks
from .verdict import not_attempted_message

__all__ = ["check_ring_shift", "check_gather_from_sp", "judge_ring_shift", "judge_gather",
           "launch_timeout", "busy_reason", "module_source", "ring_shift_ranks", "gather_ranks"]

RING_RANKS = 3      # on 2 ranks r + 1 and r - 1 are the same rank: a ring sent the wrong way would pass
SP_RANKS = 2
STUB = 'NotImplementedError("your code here'      # what the exercise notebook's stub raises


def _load() -> float:
    """The 1-minute load average (``os.getloadavg``), 0 where there is none (Windows)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def launch_timeout(quiet_seconds: float) -> float:
    """A launch's time limit that follows the machine: ``quiet_seconds`` (what the run may take
    on an idle machine) times ``max(3, 1 + 2 * load per core)``, the load read now (1-minute
    ``os.getloadavg``). It only ends a hang: a slow machine gets more time, never a verdict."""
    per_core = _load() / (os.cpu_count() or 1)
    return float(quiet_seconds) * max(3.0, 1.0 + 2.0 * per_core)


BUSY_LOAD, BUSY_SPREAD = 0.5, 0.25      # load per core, and spread of repeated timings / median


def busy_reason(load: float | None = None, *timings) -> str:
    """Why timings taken on this machine measure the machine's other work as much as the code
    (empty when none): ``load`` (the 1-minute load average before the run, read now if None)
    above :data:`BUSY_LOAD` per core, or one of ``timings`` (lists of repeated times in
    seconds) spread by more than :data:`BUSY_SPREAD` of its median."""
    cores = os.cpu_count() or 1
    load = _load() if load is None else float(load)
    why = [f"load {load:.1f} on {cores} core(s)"] if load > BUSY_LOAD * cores else []
    spreads = []
    for times in timings:
        ts = sorted(float(t) for t in times)
        mid = ts[len(ts) // 2] if ts else 0.0
        if len(ts) >= 2 and mid > 0:
            spreads.append((ts[-1] - ts[0]) / mid)
    if spreads and max(spreads) > BUSY_SPREAD:
        why.append(f"repeated timings {max(spreads):.0%} apart")
    return "; ".join(why)


# --------------------------------------------------------------------------- shipping the code
def _code_of(obj):
    """A code object of ``obj``: a function's own, or the first method's of a class."""
    if hasattr(obj, "__code__"):
        return obj.__code__
    for value in vars(obj).values() if isinstance(obj, type) else ():
        fn = getattr(value, "__func__", value)
        if hasattr(fn, "__code__"):
            return fn.__code__
    raise TypeError(f"{obj!r} is neither a function nor a class with methods: pass the function "
                    f"or class the exercise asks for")


def module_source(obj) -> str:
    """A module holding ``obj``'s definition and the imports of the cell (or file) that defines
    it: what a rank imports. Works for a notebook cell (IPython keeps each cell's text in
    ``linecache``) and for a function or class of a ``.py`` file."""
    code, name = _code_of(obj), obj.__name__
    lines = linecache.getlines(code.co_filename)
    if not lines:
        raise ValueError(f"the source of {name} cannot be found: run the cell that defines it again, "
                         f"then this check")
    text = "".join(lines)
    tree = ast.parse(text)
    imports = [ast.get_source_segment(text, n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    found = None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if first <= code.co_firstlineno <= (node.end_lineno or node.lineno):
                found = "".join(lines[first - 1:node.end_lineno])
    if found is None:
        raise ValueError(f"the definition of {name} is not at the top level of its cell: define it "
                         f"there (not inside a function or an if), run the cell, then this check")
    head = ["import torch", "import torch.distributed as dist"] + [i for i in imports if i]
    return "\n".join(head) + "\n\n\n" + found


def _launch_on_ranks(worker, nprocs: int, obj, exercise: str):
    """Write ``obj``'s module, run ``worker(path, name, folder)`` on ``nprocs`` ranks under a
    :class:`~.nb06_progress.Watchdog`; the ranks' reports, or raises CheckFailed when they did
    not finish (stopped once they made no progress, or past the launch's load-aware limit)."""
    from lesson10.spmd.launch import LaunchTimeout, RankError, launch

    source = module_source(obj)
    if STUB in source:                   # the exercise's stub: nothing to start ranks for
        raise NotImplementedError
    folder = Path(tempfile.mkdtemp(prefix="lesson10-nb06-"))
    try:
        path = folder / f"your_{obj.__name__.lower()}.py"
        path.write_text(source, encoding="utf-8")
        limit, dog = launch_timeout(60), Watchdog(str(folder), nprocs)
        try:
            with dog:
                return launch(worker, nprocs, str(path), obj.__name__, str(folder), backend="gloo",
                              timeout=limit, quiet=True)      # CPU tensors, also where there are GPUs
        except (LaunchTimeout, RankError) as err:
            if dog.stalled is not None:
                what, hint = deadlock_text(dog.stalled, dog.stall)
                fail_check(exercise, f"on {nprocs} ranks", what, show=False, hint=hint)
            if isinstance(err, RankError):
                fail_check(exercise, f"rank {err.rank}", f"the rank stopped: {err.exc_type}", show=False,
                           hint=err.remote_traceback.strip().splitlines()[-1][:300])
            fail_check(exercise, f"on {nprocs} ranks", f"the ranks did not finish within {limit:.0f} s "
                       f"and were stopped", show=False,
                       hint="a rank waits for a message no rank sends, or for a collective another rank "
                            "never calls: every rank must post the same operations")
            raise AssertionError("unreachable") from err    # pragma: no cover
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _verdict(exercise: str, run) -> None:
    """Run ``run()`` (the judge's success text) and print it; show or raise what failed."""
    try:
        text = run()
    except NotImplementedError:
        show_or_raise(not_attempted_message(exercise))
        return
    except CheckFailed as exc:
        show_or_raise(str(exc))
        return
    print(textwrap.fill(text, 100))


def check_ring_shift(ring_shift) -> None:
    """Run ``ring_shift`` on 3 ranks (gloo) and judge it: values, peers, waits, its input.
    Prints the verdict (in a notebook) or raises CheckFailed (elsewhere)."""
    _verdict("ring_shift", lambda: judge_ring_shift(
        _launch_on_ranks(ring_shift_ranks, RING_RANKS, ring_shift, "ring_shift")))


def check_gather_from_sp(cls) -> None:
    """Run the autograd Function ``cls`` on 2 ranks (gloo) and judge its output, its gradient
    and the collectives of its forward and backward against the course's ``gather_from_sp``."""
    _verdict("GatherFromSP", lambda: judge_gather(
        _launch_on_ranks(gather_ranks, SP_RANKS, cls, "gather_from_sp")))


# --------------------------------------------------------------------------- judging
_RING_HINTS = dict({  # a call, not a literal: the stand-in keeps no hint texts
    "raised": "fix the error above; the ranks ran your function as it is in its cell",
    "no_batch": "post the send and the receive with dist.batch_isend_irecv (a list of dist.P2POp): "
                "both are in flight at once, so no rank waits for another to receive first",
    "pair": "one batch_isend_irecv call with one isend and one irecv: a batch that only sends (or "
            "only receives) leaves its partner waiting",
    "direction": "the ring sends to the next rank, r + 1 mod n, and receives from the previous one, "
                 "r - 1 mod n (n and r of the group)",
    "global": "a P2POp's peer is a global rank; inside a group, rank i of the group is global rank "
              "dist.get_global_rank(group, i)",
    "no_wait": "call .wait() on every request batch_isend_irecv returns before you read the "
               "received tensor: until then it may still be empty",
    "input": "receive into a new tensor (torch.empty_like(x)); x is still being sent while the "
             "receive writes",
    "type": "return the received tensor: same shape and dtype as x",
    "values": "return the tensor that arrived from the previous rank, not x or another buffer",
})


def judge_ring_shift(per_rank: list) -> str:
    """The verdict on the ranks' reports of :func:`ring_shift_ranks` (one list per rank, one
    report per case): the success text, or raises CheckFailed / NotImplementedError."""
    reports = [rep for cases in per_rank for rep in cases if rep is not None]
    for rep in sorted(reports, key=lambda r: (r["case"], r["rank"])):
        problem = rep["problem"]
        if problem is None:
            continue
        if problem == "stub":
            raise NotImplementedError
        where = f"rank {rep['rank']} of {rep['where']}"
        show = problem == "values"
        fail_check("ring_shift", where, rep["what"], rep.get("yours"), rep.get("target"),
                   hint=_RING_HINTS[problem], show=show)
    return (f"ring_shift passes on {RING_RANKS} ranks (gloo): every rank got its predecessor's "
            f"tensor, float and integer, on the whole world and on a group of ranks 1..{RING_RANKS - 1}; "
            f"one batch of an isend and an irecv per rank, every request waited, x left as it was")


_SP_HINTS = dict({  # a call, not a literal: the stand-in keeps no hint texts
    "raised": "fix the error above; the ranks ran your class as it is in its cell",
    "grad_count": "backward returns one gradient per input of forward: the gradient of x, shaped "
                  "like x (b, s/t, h), and None for group",
    "out_shape": "forward concatenates the t shards along the sequence dim 1, in rank order",
    "out_values": "forward concatenates the t shards along the sequence dim 1, in rank order",
    "no_sum": "every rank used this rank's tokens downstream: their gradient is the sum of the "
              "t ranks' gradients, so backward must reduce over the ranks",
    "other_chunk": "each rank keeps the summed gradient of its own tokens: chunk r of t along dim 1",
    "grad_values": "backward sums the ranks' gradients and keeps this rank's chunk along dim 1",
    "all_reduce": "an all-reduce sends 2(t-1)/t of the tensor, a reduce-scatter (t-1)/t: each rank "
                  "only needs its own s/t tokens of the sum",
    "forward_ops": "forward's one collective is an all-gather; a sum (all-reduce) of zero-padded "
                   "shards sends twice the bytes",
})


def judge_gather(per_rank: list) -> str:
    """The verdict on the ranks' reports of :func:`gather_ranks`: the success text, or raises
    CheckFailed / NotImplementedError."""
    for rep in per_rank:
        problem = rep["problem"]
        if problem == "stub":
            raise NotImplementedError
        if problem is not None:
            fail_check("gather_from_sp", f"rank {rep['rank']} of {rep['world']}, {rep['where']}",
                       rep["what"], rep.get("yours"), rep.get("target"), hint=_SP_HINTS[problem],
                       show="yours" in rep)
    rep = per_rank[0]
    return (f"GatherFromSP passes on {len(per_rank)} ranks (gloo): forward gathers {rep['shape']} in "
            f"rank order, backward gives each rank the summed gradient of its own tokens, with "
            f"{rep['ops']}; output and gradient match the course's gather_from_sp")
