"""The judge: runs one notebook's cells in a sandbox and scores each exercise at its check cell.

No student code runs in this process. The sandbox's runner (:mod:`.runner`) runs the
cells and reports each one's output; when a cell calls ``checks.check_<exercise>(fn)``
the judge gives it a private channel, the runner forks, and the judge runs the course's
check itself, ``EXERCISES[id].body(proxy, rng)``, where ``proxy(*args)`` calls ``fn``
in the fork (:class:`Channel`) and ``rng`` comes from the batch's seed (secret unless
``--seed``). What the check passes in (an ``op``, a ring network, an attention kernel)
stays here and is called back, so the judge sees and counts how the method works.

One notebook's runs, the protocol with the runner and its time limits, are in
:mod:`.session`; this module judges one call of a check.
"""
from __future__ import annotations

import time

import numpy as np

from ...checks import parts as checks_parts
from ...checks.returns import ReturnRefused
from ...checks.verdict import Status, Verdict, judge_body
from . import course, wire

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
    if type_name == "ReturnRefused":          # the return rule's refusal, said as the check cell does
        return ReturnRefused(message)
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
        return wire.relink(result, msg.get("aliases"), args)   # an input handed back stays one

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
    """The report's entry of ``ex`` (see :meth:`lesson10.checks.verdict.Verdict.as_dict`)."""
    return Verdict.of(ex, status, message).as_dict()


def judge_exercise(channel: Channel, ex, rng, limit: float, timeout: float) -> dict:
    """Run the course's check of ``ex`` with ``proxy`` calling the student's function; an
    exercise with parts (:mod:`lesson10.checks.parts`) is judged part by part, each on the
    same draws, and scores the points of the parts it passes."""
    if not getattr(ex, "parts", ()):
        return _judge_once(channel, ex, rng, limit, timeout)
    import copy
    results = []
    for part, points in ex.parts:
        with checks_parts.judging(part) as state:
            e = _judge_once(channel, ex, copy.deepcopy(rng), limit, timeout)
        if e["passed"] and not state["cases"]:
            e = entry(ex, "grader error", f"no case of the part {part!r} was drawn")
        results.append({"part": part, "status": e["status"], "passed": e["passed"],
                        "points": points if e["passed"] else 0, "max_points": points,
                        "message": e["message"], **({"mistake": e["mistake"]}
                                                    if e.get("mistake") else {})})
    return combine_parts(ex, results)


def combine_parts(ex, parts: list[dict]) -> dict:
    """One exercise's entry from its parts' verdicts: the points of the parts passed, the
    status ``passed`` when all are, else the status of the first part lost; the message
    gives each part's verdict and message."""
    lost = [p for p in parts if not p["passed"]]
    e = entry(ex, lost[0]["status"] if lost else "passed", "\n".join(
        f"{p['part']}: {p['status']} ({p['points']}/{p['max_points']})"
        + (f"\n{p['message']}" if p["message"] else "") for p in parts))
    e["points"] = sum(p["points"] for p in parts)
    e["parts"] = parts
    mistakes = [p["mistake"] for p in parts if p.get("mistake")]
    if mistakes:
        e["mistake"] = mistakes[0]
    return e


def _judge_once(channel: Channel, ex, rng, limit: float, timeout: float) -> dict:
    with checks_parts.recording() as seen:
        e = _judge_body(channel, ex, rng, limit, timeout)
    if not e["passed"]:
        found = checks_parts.mistake_in(e["message"], seen)
        if found:
            e["mistake"] = found
    return e


def _judge_body(channel: Channel, ex, rng, limit: float, timeout: float) -> dict:
    """The check cell's ladder (:func:`~lesson10.checks.verdict.judge_body`) with ``proxy``
    calling the student's function, and what crosses the process boundary (the fork hung or
    died; an error raised in the sandbox)."""
    name = course.function_name(ex.id)

    def proxy(*args, **kwargs):
        return channel.call(args, kwargs, limit)

    proxy.__name__ = proxy.__qualname__ = name
    try:
        verdict = judge_body(ex, proxy, rng, name=name, passthrough=(RemoteError,))
    except Lost as exc:
        note = f" ({timeout:g} s)" if exc.status == Status.TIMED_OUT else ""
        verdict = Verdict.of(ex, exc.status, exc.message + note)
    except RemoteError as exc:
        verdict = Verdict.of(ex, Status.FAILED, f"{name} raised {type(exc).__name__}: {exc}")
    return verdict.as_dict()


def verdict_text(e: dict) -> str:
    """What the check cell shows in the graded run."""
    head = {"passed": "passed", "not attempted": "not attempted"}.get(e["status"], e["status"])
    return (f"[grader] check_{e['exercise']}: {head} ({e['points']}/{e['max_points']})\n"
            f"{e['message']}")
