"""The rank side of notebook 06's checks: each rank imports the student's module, runs it under
watch and reports plain data (lists, strings) for :mod:`.nb06_multiprocess` to judge.

What the ranks watch, by replacing ``torch.distributed`` functions while the student's code
runs (and putting them back after):

* ``batch_isend_irecv``: each operation's kind and global peer, checked against the ring before
  anything is posted (a wrong peer raises at once on every rank instead of hanging); a received
  tensor is filled only when its request's ``wait()`` is called, so a forgotten wait shows in
  the values on every run, not by chance;
* the collectives (all-gather, reduce-scatter, all-reduce, ...): which ones forward and backward
  call, and the bytes they send at ring-algorithm cost.

A rank never raises: a student's error becomes a report, so every rank finishes. torch is
imported inside the functions (the grader imports this module and has no torch).
"""
from __future__ import annotations

import contextlib
import importlib.util
import itertools
import traceback

from ..errors import Lesson10Error
from .nb06_progress import Progress, watch_calls, watch_waits

_COUNTER = itertools.count()


def load_student(path: str, name: str):
    """``name`` of the module at ``path`` (the student's cell, written by the check)."""
    spec = importlib.util.spec_from_file_location(f"lesson10_nb06_student_{next(_COUNTER)}", path)
    if spec is None or spec.loader is None:             # pragma: no cover - a path we wrote
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def student_error(exc: BaseException, path: str) -> str:
    """``Type: message`` and the lines of the student's module that raised (course frames left out)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == path]
    where = "".join(f"\n    in {f.name}: {(f.line or '').strip()}" for f in frames)
    return f"{type(exc).__name__}: {str(exc)[:400]}{where}"


@contextlib.contextmanager
def replaced(module, **functions):
    """Set ``module.<name>`` to each function while the block runs; put the originals back."""
    saved = {k: getattr(module, k) for k in functions}
    try:
        for k, fn in functions.items():
            setattr(module, k, fn)
        yield saved
    finally:
        for k, fn in saved.items():
            setattr(module, k, fn)


# --------------------------------------------------------------------------- ring_shift
class RingPlanError(Lesson10Error, RuntimeError):
    """The student's batch does not make the ring: raised in their call, before anything is posted."""

    def __init__(self, problem: str, what: str):
        super().__init__(what)
        self.problem, self.what = problem, what


class _Works:
    """The requests of one posted batch, each waited exactly once (a gloo send or receive
    waited a second time waits for a message that never comes)."""

    def __init__(self, works, progress: Progress):
        self.works, self.done, self.progress = list(works), False, progress

    def finish(self, where: str):
        """Wait for every request (``where``: what the rank reports while it waits)."""
        if not self.done:
            self.done = True
            with self.progress.inside(where):
                for w in self.works:
                    w.wait()


class _Request:
    """What the student's ``batch_isend_irecv`` returns for one operation: ``wait()`` waits for
    the whole batch, then fills the received tensor (until then it stays as it was made)."""

    def __init__(self, works: _Works, log, scratch=None, target=None):
        self.works, self.log, self.scratch, self.target, self.done = works, log, scratch, target, False

    def wait(self, timeout=None):
        self.works.finish("the wait() of a request of its batch_isend_irecv")
        if not self.done:
            if self.scratch is not None:
                self.target.copy_(self.scratch)
            self.log["waited"] += 1
        self.done = True
        return True

    def is_completed(self):
        return self.done


def _watched_batch(real, case, log, progress):
    """A ``batch_isend_irecv`` that checks each operation against ``case``'s ring first."""
    def batch_isend_irecv(ops):
        ops = list(ops)
        log["batches"] += 1
        kinds = [getattr(op.op, "__name__", "?") for op in ops]
        if sorted(kinds) != ["irecv", "isend"]:
            raise RingPlanError("pair", f"one batch_isend_irecv call posted {kinds or 'nothing'}; "
                                    f"the ring needs one isend and one irecv")
        for kind, op in zip(kinds, ops):
            want, got = (case["next"], case["prev"]) if kind == "isend" else (case["prev"], case["next"])
            if op.peer != want:
                word = "to" if kind == "isend" else "from"
                problem = "direction" if op.peer == got else "global"
                raise RingPlanError(problem, f"an {kind} {word} global rank {op.peer}; the ring's {kind} "
                                         f"goes {word} global rank {want}")
        posted, requests = [], []
        for kind, op in zip(kinds, ops):
            mine = op
            if kind == "irecv":
                mine = object.__new__(type(op))       # the same operation, into a buffer of ours
                mine.__dict__.update(vars(op))
                mine.tensor = op.tensor.new_zeros(op.tensor.shape)
            posted.append(mine)
        works = _Works(real(posted), progress)
        log["works"].append(works)
        for kind, op, mine in zip(kinds, ops, posted):
            scratch = (mine.tensor, op.tensor) if kind == "irecv" else (None, None)
            requests.append(_Request(works, log, *scratch))
        log["requests"] += len(requests)
        return requests
    return batch_isend_irecv


def _ring_cases(dist, torch):
    """``(label, group, members, dtype, shape)``: the world twice, then ranks 1..n-1."""
    n = dist.get_world_size()
    members = list(range(1, n))
    sub = dist.new_group(members)             # every rank takes part in making it
    world = list(range(n))
    return [("the world (float64)", None, world, torch.float64, (2, 3)),
            ("the world (int64)", None, world, torch.int64, (4,)),
            (f"a group of ranks {members}", sub, members, torch.float32, (3,))]


def _ring_value(torch, rank, dtype, shape, case):
    n = 1
    for d in shape:
        n *= d
    return (100 * rank + 10 * case + torch.arange(n)).to(dtype).reshape(shape)


def _ring_one(torch, dist, fn, path, i, case, watch):
    """Run ``fn`` on one case in this rank; the report (``problem`` None when it is right).
    ``watch``: a dict whose ``"batch"`` the student's batch_isend_irecv calls."""
    label, group, members, dtype, shape = case
    me = dist.get_rank()
    pos = members.index(me)
    ring = {"next": members[(pos + 1) % len(members)], "prev": members[(pos - 1) % len(members)]}
    rep = {"case": i, "rank": me, "where": label, "problem": None, "what": ""}
    log: dict = {"batches": 0, "waited": 0, "requests": 0, "works": []}
    x = _ring_value(torch, me, dtype, shape, i)
    before = x.clone()
    watch["batch"] = _watched_batch(watch["real"], ring, log, watch["progress"])
    watch["progress"].case = f"ring_shift on {label}"
    try:
        y = fn(x) if group is None else fn(x, group)
        y = y.clone() if isinstance(y, torch.Tensor) else y
    except BaseException as exc:
        if not log["works"]:                  # the neighbours wait for this rank's send: post it
            log["works"].append(_Works(watch["real"]([
                dist.P2POp(dist.isend, x.clone(), ring["next"], group),
                dist.P2POp(dist.irecv, torch.empty_like(x), ring["prev"], group)]), watch["progress"]))
        if not isinstance(exc, Exception):
            raise
        return dict(rep, **_ring_error(exc, path))
    finally:
        watch["batch"] = _refuse_batch
        for works in log["works"]:            # nothing left in flight for the next case
            works.finish("the check, waiting for the requests this rank left in flight")
    target = _ring_value(torch, ring["prev"], dtype, shape, i)
    return dict(rep, **_ring_problem(torch, log, x, before, y, target))


def _ring_error(exc: Exception, path: str) -> dict:
    if isinstance(exc, NotImplementedError):
        return {"problem": "stub"}
    if isinstance(exc, RingPlanError):
        return {"problem": exc.problem, "what": exc.what}
    return {"problem": "raised", "what": f"your ring_shift raised {student_error(exc, path)}"}


def _ring_problem(torch, log, x, before, y, target) -> dict:
    if log["batches"] == 0:
        return {"problem": "no_batch", "what": "dist.batch_isend_irecv was never called"}
    if log["waited"] < log["requests"]:
        return {"problem": "no_wait", "what": f"{log['requests'] - log['waited']} of the "
                f"{log['requests']} requests were never waited for"}
    if not torch.equal(x, before):
        return {"problem": "input", "what": "x was changed: after the call it holds other values"}
    if not isinstance(y, torch.Tensor) or y.shape != target.shape or y.dtype != target.dtype:
        got = f"{tuple(y.shape)} {y.dtype}" if isinstance(y, torch.Tensor) else type(y).__name__
        return {"problem": "type", "what": f"returned {got}; the target is {tuple(target.shape)} "
                f"{target.dtype}"}
    if not torch.equal(y, target):
        return {"problem": "values", "what": "the tensor returned is not the previous rank's",
                "yours": y.tolist(), "target": target.tolist()}
    return {"problem": None}


def ring_shift_ranks(path: str, name: str = "ring_shift", progress_dir: str | None = None) -> list:
    """In each rank: the student's ``ring_shift`` on every case; one report per case (None
    where this rank is not in the case's group). After a case that failed on any rank, every
    rank stops (the next case would wait for a rank that stopped). ``progress_dir``: where it
    reports its watched calls (:mod:`.nb06_progress`), or None."""
    import torch
    import torch.distributed as dist
    cases = _ring_cases(dist, torch)
    progress = Progress(progress_dir, dist.get_rank())
    try:
        return _ring_rank(torch, dist, cases, path, name, progress)
    finally:
        progress.report(None, done=True)


def _ring_rank(torch, dist, cases, path: str, name: str, progress: Progress) -> list:
    watch = {"real": dist.batch_isend_irecv, "batch": _refuse_batch, "progress": progress}
    out: list = []
    with replaced(dist, batch_isend_irecv=lambda ops: watch["batch"](ops),
                  **watch_calls(dist, progress, COLLECTIVES)), \
            replaced(dist.Work, **watch_waits(dist.Work, progress)):
        try:
            fn = load_student(path, name)
        except Exception as exc:  # noqa: BLE001
            return [{"case": 0, "rank": dist.get_rank(), "where": "importing your cell",
                     "problem": "raised", "what": f"your cell raised {student_error(exc, path)}"}]
        for i, case in enumerate(cases):
            rep = _ring_one(torch, dist, fn, path, i, case, watch) if dist.get_rank() in case[2] else None
            out.append(rep)
            failed = torch.tensor([int(rep is not None and rep["problem"] is not None)])
            with progress.inside(f"the check's wait for the other ranks after case {i + 1}"):
                dist.all_reduce(failed)
            if int(failed) > 0:
                break
    return out


def _refuse_batch(ops):
    raise RuntimeError("batch_isend_irecv was called outside ring_shift (at the top level of its "
                       "cell?): only define the function there")


# --------------------------------------------------------------------------- GatherFromSP
#: the collectives whose calls the SP check records (the others of torch.distributed too rare)
COLLECTIVES = ("all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
               "all_reduce", "all_to_all", "all_to_all_single", "broadcast")


def _sent_bytes(name: str, args, n: int) -> int:
    """What one call sends per rank at ring-algorithm cost (as :mod:`lesson10.spmd.comm` counts);
    0 where its tensors were passed by keyword."""
    sizes = [a.numel() * a.element_size() for a in args if hasattr(a, "numel")]
    if not sizes:
        return 0
    if name == "all_reduce":
        return 2 * (n - 1) * sizes[0] // n
    if name in ("all_gather", "reduce_scatter", "reduce_scatter_tensor"):
        return (n - 1) * sizes[0]         # the one tensor of all_gather / the output of the others
    if name == "all_gather_into_tensor":
        return (n - 1) * sizes[-1]
    return sizes[0]


def _watched_collective(dist, real, name: str, watch: dict):
    def call(*args, **kwargs):
        n = dist.get_world_size(kwargs.get("group"))
        watch["ops"].append((watch["phase"], name, _sent_bytes(name, args, n)))
        return real(*args, **kwargs)
    return call


def _ops_text(ops, phase: str) -> str:
    mine = [f"{name} of {nbytes} B" for ph, name, nbytes in ops if ph == phase]
    return ", ".join(mine) or "no collective"


def _gather_data(torch, n: int, r: int) -> dict:
    """The case every rank draws alike: the full (b, s, h) input, each rank's downstream
    gradient, this rank's shard, and the course's gather_from_sp output and gradient."""
    from lesson10.spmd.sp import gather_from_sp
    b, s, h = 3, 4 * n, 5
    gen = torch.Generator().manual_seed(606)
    full = torch.randn(b, s, h, generator=gen, dtype=torch.float64)
    ws = torch.randn(n, b, s, h, generator=gen, dtype=torch.float64)
    mine = full.chunk(n, dim=1)[r].contiguous()
    ref = mine.clone().requires_grad_(True)
    ref_out = gather_from_sp(ref, dim=1)
    (ref_out * ws[r]).sum().backward()
    return {"full": full, "ws": ws, "mine": mine, "ref_out": ref_out.detach(), "ref_grad": ref.grad}


def _run_gather(torch, cls, data: dict, r: int, watch: dict, path: str, real: dict) -> dict:
    """Forward and backward of the student's Function; what came out, or the problem."""
    x = data["mine"].clone().requires_grad_(True)
    try:
        watch["phase"] = "forward"
        y = cls.apply(x, None)
        if not isinstance(y, torch.Tensor) or y.shape != data["ref_out"].shape:
            got = tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
            _pay_debts(torch, real, data, r, watch)
            return {"problem": "out_shape", "where": "forward", "what": f"forward returned {got}; the "
                    f"target is {tuple(data['ref_out'].shape)}, (b, s, h)"}
        watch["phase"] = "backward"
        (y * data["ws"][r]).sum().backward()
    except BaseException as exc:
        _pay_debts(torch, real, data, r, watch)
        if not isinstance(exc, Exception):
            raise
        if isinstance(exc, NotImplementedError):
            return {"problem": "stub"}
        text = student_error(exc, path)
        counted = "invalid gradient" in text or "incorrect number of gradients" in text
        return {"problem": "grad_count" if counted else "raised", "where": watch["phase"],
                "what": f"your GatherFromSP raised {text}"}
    finally:
        watch["phase"] = "after"
    return {"problem": None, "y": y.detach(), "grad": x.grad}


def _pay_debts(torch, real: dict, data: dict, r: int, watch: dict) -> None:
    """A rank that stopped early makes the right collectives it still owes its peers (the
    forward's all-gather of its shard, the backward's reduce-scatter of its gradient), so that
    peers with a right answer finish, with right values, and the verdict names this rank's error."""
    made = {ph for ph, _, _ in watch["ops"]}
    n = len(data["ws"])
    if watch["phase"] == "forward" and "forward" not in made:
        real["all_gather"]([torch.empty_like(data["mine"]) for _ in range(n)], data["mine"])
    if "backward" not in made:
        chunks = [c.contiguous() for c in data["ws"][r].chunk(n, dim=1)]
        real["reduce_scatter"](torch.empty_like(chunks[0]), chunks)


def _blocks(torch, y, full, n: int) -> list:
    """Whose shard each of y's n blocks along dim 1 is ("rank q", or "?")."""
    shards = full.chunk(n, dim=1)
    return [next((f"rank {q}" for q in range(n) if torch.equal(blk, shards[q])), "?")
            for blk in y.chunk(n, dim=1)]


_DUAL = {"backward": "a reduce-scatter of that gradient", "forward": "an all-gather of the shards"}


def _gather_problem(torch, got: dict, data: dict, ops: list, n: int, r: int) -> dict:
    """The first thing wrong with a run that returned, or ``{"problem": None}``."""
    y, grad, ref_grad = got["y"], got["grad"], data["ref_grad"]
    if not torch.equal(y, data["ref_out"]):
        return {"problem": "out_values", "where": "forward", "what": "the blocks of the output "
                "along dim 1 are not the ranks' shards in rank order",
                "yours": _blocks(torch, y, data["full"], n), "target": [f"rank {q}" for q in range(n)]}
    if grad is None or not torch.allclose(grad, ref_grad, rtol=1e-12, atol=1e-12):
        chunks = data["ws"].sum(0).chunk(n, dim=1)
        if grad is None:
            return {"problem": "grad_values", "where": "backward", "what": "no gradient reached x"}
        if torch.allclose(grad, data["ws"][r].chunk(n, dim=1)[r]):
            return {"problem": "no_sum", "where": "backward", "what": "x's gradient is this rank's own "
                    "gradient only"}
        if any(torch.allclose(grad, chunks[q]) for q in range(n) if q != r):
            return {"problem": "other_chunk", "where": "backward", "what": "x's gradient is the summed "
                    "gradient of another rank's tokens"}
        return {"problem": "grad_values", "where": "backward", "what": "x's gradient differs from the "
                "course's gather_from_sp", "yours": grad[0, :, 0].tolist(),
                "target": ref_grad[0, :, 0].tolist()}
    for phase, problem in (("backward", "all_reduce"), ("forward", "forward_ops")):
        reduced = sum(b for ph, name, b in ops if ph == phase and name == "all_reduce")
        if reduced:
            return {"problem": problem, "where": phase, "what": f"the values are right, but {phase} "
                    f"sent {_ops_text(ops, phase)} ({_DUAL[phase]} sends {reduced // 2} B)"}
    return {"problem": None}


def gather_ranks(path: str, name: str = "GatherFromSP", progress_dir: str | None = None) -> dict:
    """In each rank: the student's autograd Function on this rank's (b, s/t, h) shard, against
    the course's gather_from_sp; this rank's report. ``progress_dir``: as for ring_shift_ranks."""
    import torch
    import torch.distributed as dist
    progress = Progress(progress_dir, dist.get_rank())
    progress.case = f"{name} forward and backward"
    try:
        return _gather_rank(torch, dist, path, name, progress)
    finally:
        progress.report(None, done=True)


def _gather_rank(torch, dist, path: str, name: str, progress: Progress) -> dict:
    n, r = dist.get_world_size(), dist.get_rank()
    data = _gather_data(torch, n, r)
    rep = {"rank": r, "world": n, "shape": tuple(data["full"].shape), "problem": None, "where": "",
           "what": "", "ops": ""}
    watch: dict = {"phase": "import", "ops": []}
    reported = watch_calls(dist, progress, COLLECTIVES)
    wrapped = {k: _watched_collective(dist, reported[k], k, watch) for k in COLLECTIVES}
    with replaced(dist, **dict(reported, **wrapped)) as real, \
            replaced(dist.Work, **watch_waits(dist.Work, progress)):
        try:
            cls = load_student(path, name)
        except Exception as exc:  # noqa: BLE001
            return dict(rep, problem="raised", where="importing your cell",
                        what=f"your cell raised {student_error(exc, path)}")
        got = _run_gather(torch, cls, data, r, watch, path, real)
    if got["problem"] is not None:
        return dict(rep, **got)
    rep["ops"] = (f"forward: {_ops_text(watch['ops'], 'forward')}; backward: "
                  f"{_ops_text(watch['ops'], 'backward')} per rank")
    return dict(rep, **_gather_problem(torch, got, data, watch["ops"], n, r))
