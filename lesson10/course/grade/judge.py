"""The judge: runs one notebook's cells in a sandbox and scores each exercise at its check cell.

No student code runs in this process. The sandbox's runner (:mod:`.runner`) runs the
cells and reports each one's output; when a cell calls ``checks.check_<exercise>(fn)``
the judge gives it a private channel, the runner forks, and the judge runs the course's
check itself, ``EXERCISES[id].body(proxy, rng)``, where ``proxy(*args)`` calls ``fn``
in the fork (:class:`Channel`) and ``rng`` comes from the batch's seed (secret unless
``--seed``). What the check passes in (an ``op``, a ring network, an attention kernel)
stays here and is called back, so the judge sees and counts how the method works.

Time: each cell has a limit, each judged call one, the notebook a total. A cell that
hangs or kills the runner is skipped and the sandbox started again; exercises already
judged keep their verdict, so only what the broken cell itself breaks is lost.
"""
from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field

import numpy as np

from ...checks import CheckFailed
from ...checks.core import StudentError as _StudentError
from . import course, sandbox, wire

MAX_JUDGED = 3                 # judged calls per exercise (the last one counts)
_OUTPUT_LIMIT = 200_000        # characters of one cell's reported output we keep
_NOTEBOOK_OUTPUT = 2_000_000   # ... and of a whole notebook's
MAX_CALLBACKS = 20_000         # callbacks one judged exercise may make ...
MAX_CALLBACK_BYTES = 512 * 2**20   # ... and bytes it may send through them


class Lost(BaseException):
    """The judged process hung or died (BaseException: passes through the checks)."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class RemoteError(Exception):
    """Base of the exceptions that stand for one raised in the sandbox."""


def remote_error(type_name: str, message: str) -> BaseException:
    """An exception standing for one raised on the other side (never unpickled)."""
    if type_name == "NotImplementedError":
        return NotImplementedError(message)
    cls = type(str(type_name)[:80] or "Error", (RemoteError,), {})
    return cls(message)


class Failure(Exception):
    """The sandbox could not be started at all: the grader's or the machine's fault."""


# --------------------------------------------------------------------------- one judged call
class Channel:
    """The judge's end of the channel to one judged fork."""

    def __init__(self, sock, name: str):
        self.sock, self.name = sock, name
        self.conn = wire.Conn(sock.fileno(), sock.fileno(), nonblocking_write=True)
        self.dead = False
        self.callbacks, self.callback_bytes = 0, 0

    def call(self, args, kwargs, deadline: float):
        if self.dead:
            raise Lost("crashed", f"the process running {self.name} is gone")
        callables: list = []
        try:
            tree, blobs = wire.encode([list(args), dict(kwargs)], callables)
            self.conn.send({"op": "call", "args": tree}, blobs, deadline)
            while True:
                msg, blobs = self.conn.recv(deadline)
                if msg.get("op") != "callback":
                    break
                self._callback(callables, msg, blobs, deadline)
        except wire.Timeout:
            self.dead = True
            raise Lost("timed out", f"{self.name} did not finish within the exercise's time "
                                    f"limit") from None
        except (wire.Closed, wire.WireError) as exc:
            self.dead = True
            raise Lost("crashed", f"the process running {self.name} died or broke the protocol "
                                  f"({exc}): os._exit, a signal, or out of memory") from None
        op = msg.get("op")
        if op == "error":
            raise remote_error(str(msg.get("type", "Error")), str(msg.get("message", "")))
        if op != "result":
            self.dead = True
            raise Lost("crashed", f"unexpected answer from the sandbox: {str(op)[:40]!r}")
        try:
            result, (new_args, new_kwargs) = wire.decode(msg["value"], blobs,
                                                         make_fn=lambda i, n: None)
        except (wire.WireError, ValueError, TypeError, KeyError) as exc:
            raise remote_error("ValueError", f"the grader cannot read the result: {exc}") from None
        _copy_back(list(args), new_args)
        _copy_back(kwargs, new_kwargs)
        return result

    def _callback(self, callables, msg, blobs, deadline) -> None:
        self.callbacks += 1
        self.callback_bytes += sum(len(b) for b in blobs)
        if self.callbacks > MAX_CALLBACKS or self.callback_bytes > MAX_CALLBACK_BYTES:
            raise wire.WireError(f"more than {MAX_CALLBACKS} callbacks or "
                                 f"{MAX_CALLBACK_BYTES // 2**20} MiB through them")
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

    def close(self) -> None:
        try:
            if not self.dead:
                self.conn.send({"op": "end"}, (), time.monotonic() + 1)
        except (wire.Timeout, wire.Closed, wire.WireError):
            pass
        self.sock.close()


def _copy_back(orig, new) -> None:
    """Write the sandbox's view of the arguments after the call into the judge's objects
    (so a check sees an input its function changed in place)."""
    if isinstance(orig, np.ndarray):
        if isinstance(new, np.ndarray) and new.shape == orig.shape and orig.flags.writeable:
            try:
                np.copyto(orig, new, casting="unsafe")
            except (TypeError, ValueError):
                pass
    elif isinstance(orig, (list, tuple)) and isinstance(new, (list, tuple)):
        for i, (o, n) in enumerate(zip(list(orig), new)):
            if isinstance(orig, list) and isinstance(o, np.ndarray) and not (
                    isinstance(n, np.ndarray) and n.shape == o.shape):
                orig[i] = n                    # the caller's list now holds something else
            elif isinstance(o, (np.ndarray, list, tuple, dict)):
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


def entry(ex, status: str, message: str) -> dict:
    passed = status == "passed"
    return {"exercise": ex.id, "status": status, "passed": passed,
            "points": ex.points if passed else 0, "max_points": ex.points, "message": message}


def judge_exercise(channel: Channel, ex, rng, limit: float, timeout: float) -> dict:
    """Run the course's check of ``ex`` with ``proxy`` calling the student's function."""
    name = course.function_name(ex.id)

    def proxy(*args, **kwargs):
        return channel.call(args, kwargs, limit)

    proxy.__name__ = proxy.__qualname__ = name
    try:
        verified = ex.body(proxy, rng)
    except NotImplementedError:
        return entry(ex, "not attempted", f"{name} still raises NotImplementedError")
    except CheckFailed as exc:
        return entry(ex, "failed", str(exc))
    except _StudentError as exc:
        return entry(ex, "failed", f"check_{ex.id} failed: {exc}")
    except Lost as exc:
        note = f" ({timeout:g} s)" if exc.status == "timed out" else ""
        return entry(ex, exc.status, exc.message + note)
    except RemoteError as exc:
        return entry(ex, "failed", f"{name} raised {type(exc).__name__}: {exc}")
    except Exception as exc:  # noqa: BLE001 - a check that choked on a strange answer
        return entry(ex, "failed", f"check_{ex.id} could not use the answer: "
                                   f"{type(exc).__name__}: {str(exc)[:300]}")
    return entry(ex, "passed", str(verified))


def verdict_text(e: dict) -> str:
    """What the check cell shows in the graded run."""
    head = {"passed": "passed", "not attempted": "not attempted"}.get(e["status"], e["status"])
    return (f"[grader] check_{e['exercise']}: {head} ({e['points']}/{e['max_points']})\n"
            f"{e['message']}")


# --------------------------------------------------------------------------- one notebook
@dataclass
class Settings:
    standin: object                      # the stand-in folder (Path)
    limits: sandbox.Limits
    cell_timeout: float
    exercise_timeout: float
    sandboxed: bool
    seed: int


@dataclass
class Run:
    """What a notebook's runs produced: verdicts, outputs per cell, notes."""
    verdicts: dict = field(default_factory=dict)     # exercise -> entry (latest judged)
    judged: dict = field(default_factory=dict)       # exercise -> times judged
    asked: set = field(default_factory=set)          # exercises whose check call ran
    outputs: dict = field(default_factory=dict)      # cell index -> {"outputs", "error"}
    notes: list = field(default_factory=list)
    skip: set = field(default_factory=set)
    output_size: int = 0
    sandbox_cpu: float = 0.0         # CPU seconds the sandboxed runner reported (see runner.main)


def run_notebook(cells, notebook_id: str, settings: Settings, deadline: float, workdir,
                 files=()) -> Run:
    """Run ``cells`` (``[(index, source)]``, every code cell) and judge each exercise of
    ``notebook_id`` at its check cell. Raises :class:`Failure` if no sandbox starts."""
    run = Run()
    exercises = {ex.id: ex for ex in course.exercises(notebook_id)}
    while True:
        bad = _one_run(cells, exercises, settings, deadline, workdir, files, run)
        if bad is None:
            return run
        if bad == "deadline" or bad in run.skip:
            run.notes.append("the notebook's total time limit ran out" if bad == "deadline" else
                             f"cell {bad} kept breaking the sandbox: grading stopped there")
            return run
        run.skip.add(bad)


def _one_run(cells, exercises, settings: Settings, deadline: float, workdir, files, run: Run):
    """One sandbox, the cells run in it. None when they all ran, else the index of the cell
    that broke it (skipped next time), or "deadline"."""
    box = sandbox.Sandbox(settings.standin, settings.limits, sandboxed=settings.sandboxed,
                          workdir=workdir)
    conn = wire.Conn(box.main.fileno(), box.main.fileno(), nonblocking_write=True)
    next_channel = 0
    current, started = None, 0.0
    replay = set(run.verdicts)          # judged in an earlier run: keep those verdicts
    try:
        try:
            hello, _ = conn.recv(min(deadline, time.monotonic() + 60))
            if hello.get("op") != "hello":
                raise wire.WireError("no hello")
            conn.send({"op": "setup", "cells": [[i, s] for i, s in cells if i not in run.skip],
                       "files": [list(f) for f in files],
                       "exercise_timeout": settings.exercise_timeout},
                      deadline=time.monotonic() + 30)
            ready, _ = conn.recv(min(deadline, time.monotonic() + 120))
            if ready.get("op") != "ready":
                raise wire.WireError(f"the runner failed to start: {str(ready)[:300]}")
        except (wire.Timeout, wire.Closed, wire.WireError) as exc:
            raise Failure(f"the sandbox did not start ({exc})") from None
        expected = [i for i, _ in cells if i not in run.skip]    # the order cells must come in
        last = None                              # the cell that ran last (blamed between cells)
        while True:
            limit = deadline if current is None else min(deadline, started + settings.cell_timeout)
            try:
                msg, _ = conn.recv(limit)
            except wire.Timeout:
                if current is None or time.monotonic() >= deadline:
                    return "deadline"
                run.notes.append(f"cell {current} ran over {settings.cell_timeout:g} s: skipped")
                return current
            except (wire.Closed, wire.WireError):
                if current is None and last is None:
                    run.notes.append("the sandbox ended before the first cell")
                    return None
                bad = current if current is not None else last
                run.notes.append(f"cell {bad} ended the notebook's process: skipped")
                return bad
            # nothing the sandbox says is trusted: a message out of turn is its cell's fault
            op = msg.get("op") if isinstance(msg, dict) else None
            blame = current if current is not None else last
            if op == "cell" and current is None and expected and msg.get("index") == expected[0]:
                current, started = expected.pop(0), time.monotonic()
                last = current
            elif op == "done" and current is not None and msg.get("index") == current:
                outs = _outputs(msg.get("outputs"))
                run.output_size += sum(len(o["text"]) for o in outs)
                if run.output_size > _NOTEBOOK_OUTPUT:
                    outs = [{"name": "stderr", "text": "[grader: the notebook's output is over "
                                                       "its limit; not kept]\n"}]
                run.outputs[current] = {"outputs": outs, "error": _error(msg.get("error"))}
                current = None
            elif op == "check" and current is not None and wire.check_shape(msg, current):
                try:
                    next_channel = _check(msg, conn, box, next_channel, exercises, settings,
                                          deadline, run, replay)
                except (wire.Timeout, wire.Closed, wire.WireError):
                    run.notes.append(f"cell {current} ended the notebook's process while it was "
                                     f"checked: skipped")
                    return current
                started = time.monotonic()          # judging does not count against the cell
            elif op == "finished" and current is None and not expected:
                cpu = box.finish(conn)
                if settings.sandboxed:
                    run.sandbox_cpu += cpu
                return None
            elif blame is None:
                run.notes.append("the notebook's process broke the grader's protocol before "
                                 "its first cell")
                return None
            else:
                run.notes.append(f"cell {blame} broke the grader's protocol "
                                 f"({str(op)[:20]!r} out of turn): skipped")
                return blame
    finally:
        box.kill()


def _check(msg, conn, box, next_channel, exercises, settings, deadline, run: Run,
           replay: set) -> int:
    """Answer one ``check`` request: judge the exercise in a fork, send the verdict."""
    ex = exercises.get(str(msg.get("exercise")))
    reply = None
    if ex is not None and ex.id in replay:
        replay.discard(ex.id)
        e = run.verdicts[ex.id]
        reply = {"op": "verdict", **e, "text": verdict_text(e)}
    elif ex is None:
        reply = {"op": "verdict", "text": f"[grader] check_{msg.get('exercise')} is not an "
                                          f"exercise of this notebook: not judged"}
    elif not msg.get("callable"):
        e = entry(ex, "failed", f"check_{ex.id} takes your function itself, e.g. "
                                f"check_{ex.id}({course.function_name(ex.id)}), not the result "
                                f"of calling it")
        run.verdicts[ex.id] = e
        run.asked.add(ex.id)
        reply = {"op": "verdict", **e, "text": verdict_text(e)}
    elif run.judged.get(ex.id, 0) >= MAX_JUDGED or next_channel >= sandbox.CHANNELS:
        e = run.verdicts.get(ex.id)
        text = f"[grader] check_{ex.id} was judged {MAX_JUDGED} times already: the last verdict counts"
        reply = {"op": "verdict", **(e or {}), "text": text}
    if reply is not None:
        conn.send(reply, deadline=time.monotonic() + 10)
        return next_channel
    k = next_channel
    left = max(0.0, deadline - time.monotonic())
    timeout = min(settings.exercise_timeout, left)
    conn.send({"op": "judge", "channel": k, "timeout": timeout + 1.0,
               "instead": course.use_instead(ex.id)}, deadline=time.monotonic() + 10)
    count = run.judged.get(ex.id, 0)
    rng = np.random.default_rng([settings.seed, zlib.crc32(ex.id.encode()), count])
    channel = Channel(box.channels[k], course.function_name(ex.id))
    box.channels[k] = _Closed()
    started = time.monotonic()
    try:
        e = judge_exercise(channel, ex, rng, time.monotonic() + timeout, settings.exercise_timeout)
    finally:
        channel.close()
    e["seconds"] = round(time.monotonic() - started, 3)
    run.judged[ex.id] = count + 1
    run.asked.add(ex.id)
    run.verdicts[ex.id] = e
    # the runner reports that its fork ended (it kills one that outlives the limit)
    try:
        done, _ = conn.recv(min(deadline, time.monotonic() + timeout + 15))
        if done.get("op") != "checked":
            raise wire.WireError("expected 'checked'")
        conn.send({"op": "verdict", **e, "text": verdict_text(e)}, deadline=time.monotonic() + 10)
    except (wire.Timeout, wire.Closed, wire.WireError):
        raise wire.Closed("the runner did not come back from a check") from None
    return k + 1


class _Closed:
    def close(self):
        pass


def _outputs(outs) -> list[dict]:
    kept, size = [], 0
    for o in outs if isinstance(outs, list) else []:
        if not isinstance(o, dict):
            continue
        name = "stderr" if o.get("name") == "stderr" else "stdout"
        text = str(o.get("text", ""))[:max(0, _OUTPUT_LIMIT - size)]
        size += len(text)
        kept.append({"name": name, "text": text})
    return kept


def _error(err):
    if not isinstance(err, dict):
        return None
    tb = err.get("traceback") if isinstance(err.get("traceback"), list) else []
    return {"ename": str(err.get("ename", "Error"))[:100], "evalue": str(err.get("evalue", ""))[:2000],
            "traceback": [str(t)[:2000] for t in tb[:5]]}
