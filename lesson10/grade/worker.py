"""The worker: the one process where a submission's code runs while it is judged.

Started by :class:`lesson10.grade.judge.Worker` as ``python -I -c``, importing the
package from memory (:func:`lesson10.grade.sandbox.memory_bootstrap`); it talks to the judge over two
pipes (:mod:`.wire`) and its stdin/stdout/stderr go to ``/dev/null`` (output is capped
at nothing). Steps:

1. limit its address space (``resource.setrlimit``), say hello;
2. run the code cells the judge sends, in an IPython ``InteractiveShell`` (magics work),
   with every ``check_*`` function and ``checks.summary`` replaced by a no-op; before
   each cell it tells the judge which one, so a cell that kills or hangs the worker can
   be skipped when the judge starts a new one;
3. serve calls: ``{"op": "call", "name", "args"}`` runs the student's function of that
   name under the reference guard (:mod:`.guard`) and answers with the result, the
   arguments as they are after the call (the judge copies mutations back), or the
   exception's type and message. A callable argument is a stub that asks the judge to
   run it.
"""
from __future__ import annotations

import os
import resource
import sys
import threading
import traceback

from . import wire
from .guard import Guard


def _limit_memory(nbytes: int) -> None:
    if nbytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (nbytes, nbytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _silence() -> None:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def remote_error(type_name: str, message: str) -> BaseException:
    """An exception standing for one raised on the other side (never unpickled)."""
    if type_name == "NotImplementedError":
        return NotImplementedError(message)
    cls = type(str(type_name)[:80] or "Error", (RemoteError,), {})
    return cls(message)


class RemoteError(Exception):
    """Base of the exceptions that stand for one raised in the other process."""


def _neutralise_checks() -> None:
    """The check cells are the student's feedback, not the score: no-ops in here."""
    from .. import checks

    def noop(*args, **kwargs):
        return None

    for name in list(vars(checks)):
        if name.startswith("check_") or name == "summary":
            setattr(checks, name, noop)


_GUARD_STATE = ("allowed", "violation", "active", "_inside", "_kind", "_keep")


def _snapshot(guard) -> list:
    """Identity of the grader's code in this process: every function, class attribute and
    module attribute of ``lesson10.grade.*``, the guard's own attributes and the profile
    functions of ``sys``. A cell that patches any of them shows up as a difference."""
    out = [id(sys.setprofile), id(sys.getprofile), id(sys.addaudithook)]

    def add(key, value):
        out.append((key, id(value)))
        code = getattr(value, "__code__", None)
        if code is not None:
            out.append((key, id(code), id(getattr(value, "__defaults__", None))))

    for name in sorted(m for m in sys.modules if m.startswith("lesson10.grade")):
        for key, value in list(vars(sys.modules[name]).items()):
            add(f"{name}.{key}", value)
            if isinstance(value, type) and value.__module__ == name:
                for k2, v2 in list(vars(value).items()):
                    add(f"{name}.{key}.{k2}", v2)
    for key, value in sorted(vars(guard).items()):
        if key not in _GUARD_STATE:
            add(f"guard.{key}", value)
    return out


class Worker:
    def __init__(self, conn: wire.Conn):
        self.conn = conn
        self.shell = None
        self.guard = None

    def _stub(self, fid: int, name: str):
        conn = self.conn

        def stub(*args, **kwargs):
            callables: list = []
            tree, blobs = wire.encode([list(args), dict(kwargs)], callables)
            conn.send({"op": "callback", "id": fid, "args": tree}, blobs)
            msg, blobs = conn.recv()
            if msg.get("op") == "return":
                return wire.decode(msg["value"], blobs)
            raise remote_error(str(msg.get("type", "Error")), str(msg.get("message", "")))

        stub.__name__ = stub.__qualname__ = name
        return stub

    def run_cells(self, cells) -> None:
        from IPython.core.interactiveshell import InteractiveShell
        from traitlets.config import Config
        config = Config()
        config.HistoryManager.enabled = False        # no history thread, no sqlite file
        self.shell = InteractiveShell.instance(config=config)
        _neutralise_checks()
        for index, source in cells:
            self.conn.send({"op": "cell", "index": index})
            try:
                self.shell.run_cell(source, store_history=False, silent=True)
            except BaseException:  # noqa: BLE001 - a cell's error must not stop the worker
                pass

    def call(self, msg, blobs, tampered: bool = False) -> None:
        name, token = str(msg["name"]), msg.get("token")
        fn = self.shell.user_ns.get(name) if self.shell is not None else None
        if tampered:
            self.conn.send({"op": "error", "type": "RuntimeError", "token": token,
                            "violation": "runs in a notebook that changes the grader's own code "
                                         "(lesson10.grade) or its profiler",
                            "message": "the grader's code was changed"})
            return
        if not callable(fn):
            self.conn.send({"op": "missing", "token": token})
            return
        others = [t for t in sys._current_frames() if t != threading.get_ident()]
        if others:
            self.conn.send({"op": "error", "type": "RuntimeError", "token": token,
                            "violation": f"runs while {len(others)} thread(s) started by the "
                                         f"notebook are alive (code there would run unwatched): "
                                         f"stop them", "message": "threads alive"})
            return
        args, kwargs = wire.decode(msg["args"], blobs, make_fn=self._stub)
        reply, out_blobs = None, []
        self.guard.start(msg.get("allowed", ()))
        try:
            try:
                result = fn(*args, **kwargs)
                tree, out_blobs = wire.encode([result, [list(args), dict(kwargs)]], [])
                reply = {"op": "result", "value": tree}
            except wire.WireError as exc:
                reply = {"op": "error", "type": "ValueError",
                         "message": f"the grader cannot read what {name} returned: {exc}"}
            except BaseException as exc:  # noqa: BLE001 - SystemExit and co. included
                reply = {"op": "error", "type": type(exc).__name__, "message": str(exc)[:4000]}
                out_blobs = []
        finally:
            violation = self.guard.stop()
        reply["violation"] = violation
        reply["token"] = token
        try:
            self.conn.send(reply, out_blobs)
        except wire.WireError as exc:
            self.conn.send({"op": "error", "type": "ValueError", "violation": violation,
                            "token": token, "message": f"what {name} returned is too large: {exc}"})

    def serve(self) -> None:
        base, snap, snap_code, call = None, _snapshot, _snapshot.__code__, Worker.call
        while True:
            msg, blobs = self.conn.recv()
            op = msg.get("op")
            if op == "setup":
                self.guard = Guard(msg.get("roots", []), msg.get("fingerprints", []))
                base = snap(self.guard)
                self.run_cells(msg.get("cells", []))
                self.conn.send({"op": "ready"})
            elif op == "call":
                tampered = snap.__code__ is not snap_code or snap(self.guard) != base
                call(self, msg, blobs, tampered)
            elif op == "exit":
                return


def main() -> None:
    rfd, wfd, memory = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    _limit_memory(memory)
    _silence()
    conn = wire.Conn(rfd, wfd)
    import lesson10
    conn.send({"op": "hello", "package": os.path.dirname(os.path.abspath(lesson10.__file__)),
               "pid": os.getpid()})
    try:
        Worker(conn).serve()
    except wire.Closed:
        pass
    except BaseException:  # noqa: BLE001 - tell the judge, then exit
        try:
            conn.send({"op": "fatal", "message": traceback.format_exc()[-2000:]})
        except BaseException:  # noqa: BLE001
            pass
    os._exit(0)
