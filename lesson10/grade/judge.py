"""The judge: scores a submission without running any of its code in this process.

For every exercise of the course notebook, the judge runs the exercise's check logic
itself, ``EXERCISES[id].body(proxy, rng)``, with ``rng`` seeded from ``os.urandom`` (the
worker never sees it). ``proxy(*args)`` sends the arguments to the worker
(:mod:`.worker`), which calls the student's function of that name under the reference
guard and sends back the result and the arguments as the call left them (copied back
into the judge's arrays, so a check can verify its inputs were not changed). A callable
argument (the ``op`` of ``sp_forward``) stays here: the worker calls it back.

Each exercise has its own time limit and the notebook a total one. A hang or a crash
costs that exercise only: the worker is killed (its whole process group) and a new one
starts for the next exercise. A cell that kills or hangs a worker while the cells run is
skipped by the next worker, so the exercises around it still count.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np

from ..checks import CheckFailed
from ..checks.core import _StudentError
from . import course, sandbox, wire
from .guard import reference_fingerprints
from .worker import RemoteError, remote_error


class Lost(BaseException):
    """The worker hung or died during a call (BaseException: passes through the checks)."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class Violation(BaseException):
    """The student's function called the course's reference or switched off the guard."""


class Missing(BaseException):
    """The notebook defines no function of that name."""


class WorkerFailure(Exception):
    """The worker could not be started at all: the grader's or the machine's fault."""


class Worker:
    """One worker process and its pipes; ``start()`` runs the notebook's cells in it."""

    def __init__(self, cells, *, package: sandbox.Package, tmp: Path, workdir: Path,
                 memory: int, cell_timeout: float, fingerprints: list[str], tag: str = ""):
        self.cells, self.package, self.tmp, self.workdir = cells, package, tmp, workdir
        self.tag = tag
        self.memory, self.cell_timeout, self.fingerprints = memory, cell_timeout, fingerprints
        self.skip: set[int] = set()
        self.gave_up = False
        self.proc = None
        self.conn = None
        self.notes: list[str] = []

    def start(self, deadline: float) -> bool:
        """A fresh worker with the cells run (skipping those that broke earlier ones).
        False when the notebook's time ran out first."""
        while not self.gave_up:
            self.kill()
            bad = self._start_once(deadline)
            if bad is None:
                return True
            if bad == "deadline" or bad in self.skip:      # no progress: give up
                self.kill()
                self.gave_up = True
            self.skip.add(bad)
        return False

    def _start_once(self, deadline: float):
        j_read, w_write = os.pipe()
        w_read, j_write = os.pipe()
        argv = sandbox.memory_bootstrap() + [str(w_read), str(w_write), str(self.memory)]
        try:
            self.proc = subprocess.Popen(argv, pass_fds=(w_read, w_write), cwd=self.workdir,
                                         env=sandbox.child_env({sandbox.TAG_ENV: self.tag}),
                                         start_new_session=True,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)
        finally:
            os.close(w_read)
            os.close(w_write)
        self.conn = wire.Conn(j_read, j_write, nonblocking_write=True)
        blob = self.package.modules()
        try:
            self.conn._write(len(blob).to_bytes(8, "big") + blob, time.monotonic() + 60)
            hello, _ = self.conn.recv(time.monotonic() + 60)
        except (wire.Timeout, wire.Closed, wire.WireError) as exc:
            raise WorkerFailure(f"the grading worker did not start ({exc})") from None
        if hello.get("op") != "hello" or hello.get("package") != sandbox.MEMORY_ROOT:
            raise WorkerFailure(f"the grading worker imported lesson10 from the wrong place: "
                                f"{hello.get('package')!r}")
        cells = [(i, src) for i, src in self.cells if i not in self.skip]
        roots = [sandbox.MEMORY_ROOT, str(self.package.source)]
        self.conn.send({"op": "setup", "cells": cells, "roots": roots,
                        "fingerprints": self.fingerprints}, deadline=time.monotonic() + 30)
        current, started = None, 0.0
        while True:
            limit = deadline if current is None else min(deadline, started + self.cell_timeout)
            try:
                msg, _ = self.conn.recv(limit)
            except wire.Timeout:
                if current is None or time.monotonic() >= deadline:
                    return "deadline"
                self.notes.append(f"cell {current} ran over {self.cell_timeout:g} s in the "
                                  f"grading worker: skipped")
                return current
            except (wire.Closed, wire.WireError):
                if current is None:
                    raise WorkerFailure("the grading worker died before running any cell") from None
                self.notes.append(f"cell {current} killed the grading worker: skipped")
                return current
            if msg.get("op") == "cell":
                current, started = msg.get("index"), time.monotonic()
            elif msg.get("op") == "ready":
                return None
            elif msg.get("op") == "fatal":
                if current is None:            # before any student code: the grader's fault
                    raise WorkerFailure(f"the grading worker failed: {msg.get('message')}")
                self.notes.append(f"cell {current} broke the grading worker: skipped")
                return current

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            self.proc = None
        if self.conn is not None:
            for fd in (self.conn.rfd, self.conn.wfd):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.conn = None

    # ----------------------------------------------------------------- one call
    def call(self, name: str, args, kwargs, allowed, deadline: float):
        callables: list = []
        token = os.urandom(16).hex()        # a reply without it was not written by the worker
        try:
            tree, blobs = wire.encode([list(args), dict(kwargs)], callables)
            self.conn.send({"op": "call", "name": name, "args": tree, "allowed": list(allowed),
                            "token": token}, blobs, deadline)
            while True:
                msg, blobs = self.conn.recv(deadline)
                op = msg.get("op")
                if op == "callback":
                    self._callback(callables, msg, blobs, deadline)
                    continue
                break
        except wire.Timeout:
            self.kill()
            raise Lost("timed out", f"{name} did not finish within the exercise's time "
                                    f"limit") from None
        except (wire.Closed, wire.WireError) as exc:
            self.kill()
            raise Lost("crashed", f"the process running {name} died or broke the protocol "
                                  f"({exc}): os._exit, a signal, or out of memory") from None
        if msg.get("token") != token:
            self.kill()
            raise Lost("crashed", f"the process running {name} answered out of turn (something "
                                  f"wrote to the grader's pipe)")
        if msg.get("violation"):
            raise Violation(f"{name} {msg['violation']}")
        if op == "missing":
            raise Missing(f"the notebook defines no function named {name}")
        if op == "error":
            raise remote_error(str(msg.get("type", "Error")), str(msg.get("message", "")))
        if op != "result":
            self.kill()
            raise Lost("crashed", f"unexpected answer from the worker: {op!r}")
        try:
            result, (new_args, new_kwargs) = wire.decode(msg["value"], blobs,
                                                         make_fn=lambda i, n: None)
        except (wire.WireError, ValueError, TypeError) as exc:
            raise remote_error("ValueError", f"the grader cannot read the result: {exc}") from None
        _copy_back(list(args), new_args)
        _copy_back(kwargs, new_kwargs)
        return result

    def _callback(self, callables, msg, blobs, deadline) -> None:
        try:
            fn = callables[int(msg["id"])]
            args, kwargs = wire.decode(msg["args"], blobs)
        except (IndexError, KeyError, ValueError, TypeError) as exc:
            raise wire.WireError(f"bad callback: {exc}") from None
        try:
            value = fn(*args, **kwargs)
            tree, out = wire.encode(value)
            self.conn.send({"op": "return", "value": tree}, out, deadline)
        except (wire.Timeout, wire.Closed):
            raise
        except Exception as exc:  # noqa: BLE001 - the error goes back to the student's code
            self.conn.send({"op": "raise", "type": type(exc).__name__,
                            "message": str(exc)[:2000]}, (), deadline)


def _copy_back(orig, new) -> None:
    """Write the worker's view of the arguments after the call into the judge's objects."""
    if isinstance(orig, np.ndarray):
        if isinstance(new, np.ndarray) and new.shape == orig.shape and orig.flags.writeable:
            try:
                np.copyto(orig, new, casting="unsafe")
            except (TypeError, ValueError):
                pass
    elif isinstance(orig, (list, tuple)) and isinstance(new, (list, tuple)):
        for i, (o, n) in enumerate(zip(list(orig), new)):
            if isinstance(o, (np.ndarray, list, tuple, dict)):
                _copy_back(o, n)
            elif isinstance(orig, list) and type(o) in (int, float, str, bool, type(None)) \
                    and o != n:
                orig[i] = n
        if isinstance(orig, list) and len(new) != len(orig) and not any(callable(o) for o in orig):
            orig[:] = new
    elif isinstance(orig, dict) and isinstance(new, dict):
        for k, n in new.items():
            if k in orig and isinstance(orig[k], (np.ndarray, list, dict)):
                _copy_back(orig[k], n)


def judge(nb: dict, notebook_id: str, *, package: sandbox.Package, tmp: Path, workdir: Path,
          memory: int, cell_timeout: float, exercise_timeout: float, deadline: float,
          fingerprints: list[str], tag: str = "") -> tuple[list[dict], list[str]]:
    """``(one entry per exercise, notes)`` for a notebook known to be ``notebook_id``."""
    worker = Worker(course.worker_cells(nb), package=package, tmp=tmp, workdir=workdir,
                    memory=memory, cell_timeout=cell_timeout, fingerprints=fingerprints, tag=tag)
    entries = []
    try:
        for ex in course.exercises(notebook_id):
            entries.append(_judge_one(worker, ex, exercise_timeout, deadline))
    finally:
        worker.kill()
    return entries, worker.notes


def _entry(ex, status: str, message: str) -> dict:
    passed = status == "passed"
    return {"exercise": ex.id, "status": status, "passed": passed,
            "points": ex.points if passed else 0, "max_points": ex.points, "message": message}


def _judge_one(worker: Worker, ex, exercise_timeout: float, deadline: float) -> dict:
    name = course.function_name(ex.id)
    if time.monotonic() >= deadline or (not worker.alive() and not worker.start(deadline)):
        return _entry(ex, "timed out", "the notebook's total time limit ran out (or its cells "
                                       "kept breaking the worker) before this exercise was "
                                       "judged")
    limit = min(deadline, time.monotonic() + exercise_timeout)
    allowed = course.ALLOWED_CALLS.get(ex.id, ())

    def proxy(*args, **kwargs):
        return worker.call(name, args, kwargs, allowed, limit)

    proxy.__name__ = proxy.__qualname__ = name
    rng = np.random.default_rng(int.from_bytes(os.urandom(16), "little"))
    try:
        verified = ex.body(proxy, rng)
    except NotImplementedError:
        return _entry(ex, "not attempted", f"{name} still raises NotImplementedError")
    except CheckFailed as exc:
        return _entry(ex, "failed", str(exc))
    except _StudentError as exc:
        return _entry(ex, "failed", f"check_{ex.id} failed: {exc}")
    except Violation as exc:
        return _entry(ex, "failed", f"{exc}: not allowed, write your own")
    except Missing as exc:
        return _entry(ex, "missing", str(exc))
    except Lost as exc:
        limit_note = f" ({exercise_timeout:g} s)" if exc.status == "timed out" else ""
        return _entry(ex, exc.status, exc.message + limit_note)
    except RemoteError as exc:
        return _entry(ex, "failed", f"{name} raised {type(exc).__name__}: {exc}")
    except (wire.WireError, WorkerFailure):
        raise
    except Exception as exc:  # noqa: BLE001 - a check that choked on a strange answer
        return _entry(ex, "failed", f"check_{ex.id} could not use the answer: "
                                    f"{type(exc).__name__}: {str(exc)[:300]}")
    return _entry(ex, "passed", str(verified))


_FINGERPRINTS: dict[str, list[str]] = {}


def fingerprints_of(package: sandbox.Package) -> list[str]:
    key = str(package.source)
    if key not in _FINGERPRINTS:
        _FINGERPRINTS[key] = reference_fingerprints(key)
    return _FINGERPRINTS[key]
