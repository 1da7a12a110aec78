"""Start N ranks on one machine and collect their results.

SPMD in one call::

    from lesson10.spmd.launch import launch
    outs = launch(my_worker, 4, x)      # my_worker(x) runs in ranks 0..3
    outs[2]                             # what rank 2 returned

What :func:`launch` does for you:

* spawns ``nprocs`` fresh Python processes (the ``spawn`` start method, so it also
  works from a Jupyter kernel and with CUDA);
* rendezvous on 127.0.0.1 through a ``TCPStore`` the parent opens on a free port
  (no race for the port), and ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` /
  ``MASTER_ADDR`` / ``MASTER_PORT`` set as ``torchrun`` would;
* backend ``"auto"``: NCCL with one GPU per rank when there are at least ``nprocs``
  GPUs, else gloo on CPU (it says which);
* ``torch.set_num_threads(cpu_count // nprocs)`` per rank, so N ranks do not fight
  for the cores;
* faults: an exception in a rank becomes one :class:`RankError` in the caller that
  names the rank and carries its traceback; a rank that hangs (a collective nobody
  answers) ends in :class:`LaunchTimeout` after ``timeout`` seconds because the
  parent watches a deadline itself, or earlier in a :class:`RankError` when a
  collective waits longer than ``peer_timeout`` for a peer; in every case all ranks
  are killed and joined, so no process is left behind.

The worker function must be importable by a fresh process: a module-level function
of a module (:mod:`lesson10.runs.workers` holds the checked runs of every method). A
function typed into a notebook cell is not, and gives a clear error.

Under ``torchrun`` the processes already exist: they join the group with
:func:`lesson10.spmd.torchrun.init_from_env` instead.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import sys
import time
import traceback
from multiprocessing.connection import wait

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..errors import Lesson10Error
from .device import DTYPES, current_device, synchronize, synchronize_device, torch_dtype

__all__ = [
    "launch", "RankError", "LaunchTimeout", "choose_backend",
    "current_device", "DTYPES", "torch_dtype",
    "synchronize", "synchronize_device", "backend_reason", "check_peer_timeout",
    "is_peer_error",
]


class RankError(Lesson10Error, RuntimeError):
    """An exception raised inside one rank, re-raised in the caller.

    ``rank``: which rank failed; ``exc_type``: the name of the exception class
    there (e.g. ``"ValueError"``); ``remote_traceback``: that rank's traceback
    text; ``original``: the exception object itself when it could be pickled
    (also chained as ``__cause__``).
    """

    def __init__(self, rank: int, exc_type: str, remote_traceback: str,
                 original: BaseException | None = None, others: str = "",
                 stages: list | None = None, ran: list | None = None):
        self.rank = rank
        self.stages = list(stages or [])  # per reported error: "start", "run" or None (died)
        self.ran = list(ran or [])        # the ranks that had called fn
        self.exc_type = exc_type
        self.remote_traceback = remote_traceback
        self.original = original
        msg = f"rank {rank} raised {exc_type}:\n{remote_traceback.rstrip()}"
        if others:
            msg += f"\n(then also: {others})"
        super().__init__(msg)


class LaunchTimeout(Lesson10Error, TimeoutError):
    """Some ranks did not finish within ``timeout`` seconds (they were killed)."""

    def __init__(self, timeout: float, ranks: list[int]):
        self.timeout = timeout
        self.ranks = ranks
        super().__init__(
            f"rank(s) {ranks} did not finish within timeout={timeout:g} s and were killed. "
            "Usually a collective that not every rank calls (or calls with other shapes); "
            "if the work is just slow, pass a larger timeout=.")



@contextlib.contextmanager
def _children_import_this_lesson10():
    """Put the folder this process imported ``lesson10`` from first on the children's
    ``sys.path`` while spawning (``spawn`` hands them a copy of it): a rank then runs the same
    package as its parent even when something put another ``lesson10`` earlier on the path
    (the grader's stand-in package, a folder of that name in the working directory)."""
    pkg = sys.modules.get("lesson10")
    where = getattr(pkg, "__file__", None)
    home = os.path.dirname(os.path.dirname(os.path.abspath(where))) if where else None
    if home is None or (sys.path and sys.path[0] == home):
        yield
        return
    sys.path.insert(0, home)
    try:
        yield
    finally:
        try:
            sys.path.remove(home)
        except ValueError:
            pass


@contextlib.contextmanager
def _main_without_missing_file():
    """Hide ``__main__.__file__`` while spawning when it names no file (``python - <<EOF``).

    ``spawn`` re-runs the parent's main script in every child; for a script read from
    stdin that path (``"<stdin>"``) does not exist and every rank would die at start.
    The worker itself is imported from its module, so the children do not need it.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    hide = path is not None and not os.path.exists(path)
    if hide and main is not None:
        del main.__file__
    try:
        yield
    finally:
        if hide and main is not None:
            main.__file__ = path

# --------------------------------------------------------------------- helpers
def choose_backend(nprocs: int, backend: str = "auto") -> str:
    """``"nccl"`` or ``"gloo"`` for ``nprocs`` ranks on this machine.

    ``auto``: NCCL when CUDA has at least one GPU per rank, else gloo (CPU).
    Asking for NCCL with fewer GPUs than ranks is a ``ValueError``.
    """
    if not isinstance(nprocs, int) or nprocs < 1:
        raise ValueError(f"nprocs must be a positive int, got {nprocs!r}")
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "auto":
        return "nccl" if n_gpu >= nprocs and dist.is_nccl_available() else "gloo"
    if backend == "nccl":
        if n_gpu < nprocs:
            raise ValueError(
                f"backend='nccl' needs one GPU per rank: {nprocs} ranks but {n_gpu} GPU(s) "
                f"visible. Use nprocs <= {n_gpu}, or backend='gloo' (CPU) / 'auto'.")
        return "nccl"
    if backend == "gloo":
        return "gloo"
    raise ValueError(f"backend must be 'auto', 'gloo' or 'nccl', got {backend!r}")


def backend_reason(nprocs: int, backend: str = "auto") -> str:
    """One line on the backend :func:`choose_backend` takes for ``nprocs`` ranks, and why: in
    particular why gloo on the CPU when there are GPUs, but fewer than ranks."""
    chosen = choose_backend(nprocs, backend)
    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if chosen == "nccl":
        return f"nccl: {nprocs} ranks, one GPU each ({n_gpu} GPU(s) visible)"
    if backend == "gloo":
        return "gloo on the CPU, as asked"
    if n_gpu == 0:
        return "gloo on the CPU: no GPU visible"
    if n_gpu < nprocs:
        return (f"gloo on the CPU, although {n_gpu} GPU(s) are visible: NCCL needs one GPU per rank "
                f"(two ranks cannot share a GPU), and {nprocs} ranks would need {nprocs}")
    return "gloo on the CPU: this torch build has no NCCL"


def _check_importable(fn) -> None:
    if not callable(fn):
        raise TypeError(f"fn must be a function, got {type(fn).__name__}")
    mod = getattr(fn, "__module__", None)
    qual = getattr(fn, "__qualname__", getattr(fn, "__name__", "?"))
    hint = ("Each rank is a fresh Python process that imports the worker by name, so it "
            "must be a module-level function of an importable module: move it into a .py "
            "file (e.g. my_workers.py next to the notebook), import it, and pass that.")
    if "<lambda>" in qual or "<locals>" in qual:
        raise ValueError(f"worker {qual!r} is a lambda or a nested function. {hint}")
    if mod == "__main__":
        main = sys.modules.get("__main__")
        interactive = (getattr(main, "__file__", None) is None
                       or "ipykernel" in sys.modules or hasattr(sys, "ps1"))
        if interactive:
            raise ValueError(
                f"worker {qual!r} is defined in a notebook / interactive session (__main__). {hint}")
    try:
        pickle.dumps(fn)
    except (pickle.PickleError, TypeError, AttributeError) as e:  # pragma: no cover - depends on the object
        raise ValueError(f"worker {qual!r} cannot be pickled by reference ({e}). {hint}") from None


def _to_cpu(obj):
    """Tensors -> detached CPU tensors, recursively through lists/tuples/dicts."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_to_cpu(v) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def _set_env(rank: int, world: int, local_rank: int, port: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(local_rank),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))


# ---------------------------------------------------------------- child side
def _entry(rank, nprocs, port, backend, timeout, threads, fn, args, kwargs, conn):
    """Body of one spawned rank: init, run ``fn``, send ``("ok", bytes)`` or
    ``("err", (type name, traceback, pickled exception, stage, when))``; ``stage`` is
    ``"start"`` while the rank joins the group and ``"run"`` once ``fn`` was called; ``when``
    is ``time.monotonic()`` as the error was caught (one clock for every process of a
    machine), so the parent names the rank that failed first, not the one heard first."""
    stage = "start"
    try:
        _set_env(rank, nprocs, rank, port)
        torch.set_num_threads(threads)
        if backend == "nccl":
            torch.cuda.set_device(rank)
        store = dist.TCPStore("127.0.0.1", port, nprocs + 1, is_master=False,
                              timeout=datetime.timedelta(seconds=timeout))
        dist.init_process_group(backend, store=store, rank=rank, world_size=nprocs,
                                timeout=datetime.timedelta(seconds=timeout))
        # every rank's mesh is whole before any rank runs fn: a rank that finished joining
        # and ran ahead could close its connections while a slower one still builds its
        # own (gloo: "Connection closed by peer"), and that start could not be tried again
        dist.barrier()
        stage = "run"
        conn.send(("run", None))        # the parent then knows fn ran here: no second start
        out = fn(*args, **kwargs)
        try:
            payload = pickle.dumps(_to_cpu(out))
        except Exception as e:
            raise TypeError(f"the return value of {fn.__name__} cannot be pickled: {e}") from e
        conn.send(("ok", payload))
    except BaseException as e:  # noqa: BLE001 - everything goes back to the caller
        when = time.monotonic()
        tb = traceback.format_exc()
        try:
            exc = pickle.dumps(e)
        except Exception:  # noqa: BLE001 - an unpicklable error still reports its traceback
            exc = None
        try:
            conn.send(("err", (type(e).__name__, tb, exc, stage, when)))
        except Exception:  # noqa: BLE001 - the caller is gone: nobody is left to tell
            pass
    finally:
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        finally:
            conn.close()


_TRANSIENT = ("connectFullMesh", "Connection closed by peer", "Connection reset by peer",
              "Connection refused")                  # what a start lost on the network says


def _failed_on_the_network_at_start(err: RankError) -> bool:
    """True when no rank called ``fn`` and each error came from joining the group, on a lost
    connection (gloo's full mesh, the store): then a new start is safe."""
    return (bool(err.stages) and not err.ran and all(st == "start" for st in err.stages)
            and any(t in err.remote_traceback for t in _TRANSIENT))


# --------------------------------------------------------------- parent side
def launch(fn, nprocs: int, *args, backend: str = "auto", timeout: float = 300.0,
           threads: int | None = None, quiet: bool = False, peer_timeout: float | None = None,
           **kwargs) -> list:
    """Run ``fn(*args, **kwargs)`` in ``nprocs`` new ranks; return their results in rank order.

    ``backend``: ``"auto"`` | ``"gloo"`` | ``"nccl"`` (see :func:`choose_backend`).
    ``timeout``: seconds for the whole run (start included; 300: room for notebook 06's 4 ranks
    on 2 slow, busy cores); past it every rank is killed and :class:`LaunchTimeout` is raised.
    ``peer_timeout``: the process group's timeout,
    how long one collective (or the start) waits for a peer before that rank raises (default
    ``timeout``). ``threads``: torch threads per rank (default ``cpu_count // nprocs``, at least
    1). ``quiet``: do not print the chosen backend. Tensors come back detached, on the CPU.
    Any exception in a rank raises :class:`RankError` here, except one: a start that fails on
    a lost connection while the ranks build their group (gloo under heavy load), before any
    rank called ``fn``, is tried once more within the same ``timeout``, and it says so.
    """
    _check_importable(fn)
    asked, backend = backend, choose_backend(nprocs, backend)
    timeout = check_peer_timeout(timeout, "timeout")
    peer_timeout = timeout if peer_timeout is None else check_peer_timeout(peer_timeout)
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be None (automatic) or an int >= 1, got {threads!r}")
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // nprocs)
    if not quiet:
        where = "one GPU per rank" if backend == "nccl" else "CPU"
        print(f"launch: {nprocs} rank(s), backend={backend} ({where}), {threads} thread(s) per rank")
        if backend == "gloo" and torch.cuda.is_available() and torch.cuda.device_count():
            print(f"launch: {backend_reason(nprocs, asked)}")

    deadline = time.monotonic() + timeout
    for attempt in (1, 2):
        try:
            return _launch_once(fn, nprocs, args, kwargs, backend, peer_timeout, threads,
                                deadline - time.monotonic())
        except RankError as e:
            # Under load a gloo rank can lose a connection while the mesh is built
            # ("Connection closed by peer"); no rank has run fn yet, so start them all again.
            if attempt == 2 or not _failed_on_the_network_at_start(e) or deadline - time.monotonic() < 1:
                raise
            print(f"launch: rank {e.rank} lost a connection while the ranks joined the group "
                  f"({e.remote_traceback.strip().splitlines()[-1][:160]}); "
                  f"starting all {nprocs} rank(s) once more", file=sys.stderr, flush=True)
    raise AssertionError("unreachable")  # pragma: no cover


def _launch_once(fn, nprocs, args, kwargs, backend, peer_timeout, threads, timeout):
    """One start of ``nprocs`` ranks with their own store; see :func:`launch`."""
    # The parent owns the rendezvous store: port 0 lets the OS pick a free port.
    store = dist.TCPStore("127.0.0.1", 0, nprocs + 1, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout))
    port = store.port
    ctx = mp.get_context("spawn")
    procs, conns, finished = [], [], False
    try:
        with _main_without_missing_file(), _children_import_this_lesson10():
            for rank in range(nprocs):
                recv, send = ctx.Pipe(duplex=False)
                p = ctx.Process(target=_entry, name=f"lesson10-rank{rank}", daemon=True,
                                args=(rank, nprocs, port, backend, peer_timeout, threads, fn, args,
                                      kwargs, send))
                p.start()
                send.close()  # the child holds the only writer: EOF when it dies
                procs.append(p)
                conns.append(recv)
        results = _collect(procs, conns, timeout)
        finished = True
        return results
    finally:
        if finished:  # let the ranks tear down their process group (a few seconds at most)
            end = time.monotonic() + 5.0
            for p in procs:
                p.join(max(0.0, end - time.monotonic()))
        for p in procs:  # after an error, a timeout or Ctrl-C: kill at once
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join()
        for c in conns:
            c.close()
        del store


def _collect(procs, conns, timeout):
    n = len(procs)
    deadline = time.monotonic() + timeout
    results = [None] * n
    done = [False] * n
    errors = []  # (rank, exc_type, traceback, pickled exception, stage, when) as they arrive
    ran = []     # the ranks that called fn

    def receive(r):
        try:
            kind, body = conns[r].recv()
            if kind == "run":
                ran.append(r)
                return
        except (EOFError, OSError):
            code = procs[r].exitcode
            if code is None:
                procs[r].join(1.0)
                code = procs[r].exitcode
            errors.append((r, "ProcessDied",
                           f"rank {r} exited (exit code {code}) without sending a result "
                           "(killed, out of memory, os._exit, or it failed while starting: see its stderr; "
                           "a script that calls launch() needs an `if __name__ == '__main__':` guard)",
                           None, None, float("-inf")))   # no word, no time: taken as first
        else:
            if kind == "ok":
                results[r] = pickle.loads(body)
            else:
                errors.append((r, *body))
        done[r] = True

    while not all(done):
        left = deadline - time.monotonic()
        if left <= 0:
            raise LaunchTimeout(timeout, [r for r in range(n) if not done[r]])
        ready = wait([conns[r] for r in range(n) if not done[r]], timeout=left)
        for c in ready:
            receive(conns.index(c))
        if errors:
            # Give the other ranks a moment to report (they usually fail in the collective).
            grace = time.monotonic() + 0.5
            while not all(done) and time.monotonic() < grace:
                for c in wait([conns[r] for r in range(n) if not done[r]], timeout=0.1):
                    receive(conns.index(c))
            # the rank that failed first is the cause (a rank that died without a word counts
            # as first); the others mostly lost it as a peer (gloo: "Connection closed by
            # peer"), and may be heard first on a busy machine
            errors.sort(key=lambda e: e[5])
            r, name, tb, exc = errors[0][:4]
            original = None
            if exc is not None:
                try:
                    original = pickle.loads(exc)
                except Exception:  # noqa: BLE001 - any error class may fail to rebuild here
                    original = None
            others = "; ".join(f"rank {r2} {n2}: {t2.strip().splitlines()[-1]}"
                               for r2, n2, t2, *_ in errors[1:])
            raise RankError(r, name, tb, original, others,
                            stages=[e[4] for e in errors], ran=ran) from original
    return results


def check_peer_timeout(seconds, name: str = "peer_timeout") -> float:
    """``seconds`` as a float when it is a finite number > 0 (a process group's timeout, or
    another limit called ``name``), else a ``ValueError`` that says so."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0 \
            or seconds == float("inf"):
        raise ValueError(f"{name} must be a finite number of seconds > 0, got {seconds!r}")
    return float(seconds)


PEER_ERROR_MARKS = ("timed out", "timeout", "connection closed", "connection reset",
                    "broken pipe", "connection refused", "socket closed")


def is_peer_error(exc: BaseException) -> bool:
    """True for the error a collective raises when a peer stopped answering: the process
    group's timeout passed, or a peer's connection closed (it died)."""
    kinds = tuple(k for k in (getattr(dist, "DistError", None),) if k is not None)
    text = str(exc).lower()
    return (isinstance(exc, kinds) if kinds else False) or (
        isinstance(exc, RuntimeError) and any(m in text for m in PEER_ERROR_MARKS))
