"""Deadlocks of notebook 06's checks, found in seconds, whatever the load.

Both sides of one small protocol through the check's temporary folder:

* rank side (:class:`Progress`): a rank writes ``rank<r>.json`` each time it enters or
  leaves a watched ``torch.distributed`` call (a blocking ``send``/``recv``, the ``wait()``
  of a request, a collective, the check's own sync), and when it is done; a thread of the
  rank ends it (``os._exit``) once the parent writes ``stop``;
* parent side (:class:`Watchdog`, a thread beside :func:`~lesson10.spmd.launch.launch`):
  when every rank that has not finished waits inside a watched call and no rank has
  reported anything for :data:`STALL_SECONDS`, it writes ``stop`` and keeps where each
  rank waits, for the verdict (:func:`deadlock_text`).

A rank that computes (between calls) is not waiting: a slow answer is never stopped here.
The stall limit is fixed; the load-aware limit of the whole launch still covers the start.
No torch here: the grader imports every module of ``lesson10.checks``.
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path

__all__ = ["STALL_SECONDS", "Progress", "Watchdog", "watch_calls", "watch_waits", "deadlock_text"]

#: seconds with no report from any rank, every unfinished rank waiting, before the stop
STALL_SECONDS = 15.0
STOPPED_EXIT = 75            # the exit code of a rank stopped by the watchdog
#: calls that may wait for a peer, watched besides send, recv, wait() and the checks' collectives
OTHER_CALLS = ("reduce", "gather", "scatter", "all_gather_object", "broadcast_object_list",
               "monitored_barrier")


class Progress:
    """A rank's reports: ``{"in": what it waits in or None, "case": ..., "done": bool,
    "seq": n}`` in ``folder/rank<r>.json``. ``folder=None``: reports go nowhere."""

    def __init__(self, folder: str | None, rank: int):
        self.folder, self.rank, self.case, self.seq = folder, rank, "", 0
        self._stack: list = []
        if folder is not None:
            self.report(None)
            threading.Thread(target=self._obey_stop, daemon=True).start()

    def report(self, where: str | None, done: bool = False) -> None:
        if self.folder is None:
            return
        self.seq += 1
        path = Path(self.folder) / f"rank{self.rank}.json"
        tmp = path.with_suffix(".tmp")
        text = json.dumps({"in": where, "case": self.case, "done": done, "seq": self.seq})
        for _ in range(5):
            try:
                tmp.write_text(text, encoding="utf-8")
                os.replace(tmp, path)           # the parent never reads half a report
                return
            except OSError:                     # the parent reading it just now (Windows)
                time.sleep(0.01)

    @contextlib.contextmanager
    def inside(self, where: str):
        """Report ``where`` while the block runs (a call that may wait for a peer)."""
        self._stack.append(where)
        if len(self._stack) == 1:               # a call inside a call: the outer one is named
            self.report(where)
        try:
            yield
        finally:
            self._stack.pop()
            if not self._stack:
                self.report(None)

    def _obey_stop(self) -> None:
        stop = Path(self.folder or ".") / "stop"
        while not stop.exists():
            time.sleep(0.2)
        os._exit(STOPPED_EXIT)                   # the main thread may be stuck in gloo


# --------------------------------------------------------------------------- rank side: the calls
def _peer(args, kwargs, names) -> str:
    """Whom a ``send``/``recv`` call names: its second argument or one of ``names``."""
    if len(args) > 1 and args[1] is not None:
        return f"rank {args[1]}"
    for key in names:
        if kwargs.get(key) is not None:
            return f"{'group ' if key.startswith('group') else ''}rank {kwargs[key]}"
    return "any rank"


def _reported(progress: Progress, real, describe):
    """``real`` reporting ``describe(args, kwargs)`` to ``progress`` while it runs."""
    def call(*args, **kwargs):
        with progress.inside(describe(args, kwargs)):
            return real(*args, **kwargs)
    return call


def watch_calls(dist, progress: Progress, collectives=()) -> dict:
    """Replacements of ``dist``'s blocking ``send`` and ``recv``, ``barrier`` and
    ``collectives`` that report to ``progress`` while they run (for ``replaced``)."""
    out = {name: _reported(progress, getattr(dist, name),
                           lambda a, k, n=name, w=word, keys=keys: f"a blocking dist.{n} {w} {_peer(a, k, keys)}")
           for name, word, keys in (("send", "to", ("dst", "group_dst")), ("recv", "from", ("src", "group_src")))}
    out.update({name: _reported(progress, getattr(dist, name), lambda a, k, n=name: f"dist.{n}")
                for name in ("barrier", *OTHER_CALLS, *collectives) if hasattr(dist, name)})
    return out


def watch_waits(work_class, progress: Progress) -> dict:
    """A replacement of ``Work.wait`` (every request's) that reports while it waits. (``isend``
    and ``irecv`` themselves stay: ``P2POp`` accepts only the originals.)"""
    return {"wait": _reported(progress, work_class.wait, lambda a, k: "the wait() of a request "
                              "(of an isend, an irecv, a batch_isend_irecv or an async_op)")}


# --------------------------------------------------------------------------- parent side
class Watchdog:
    """Watches the reports of ``nprocs`` ranks in ``folder`` while the ``with`` block runs;
    ``stalled`` is then their last reports (a list, one dict per rank) if it stopped them,
    else None. ``stall``: seconds (default :data:`STALL_SECONDS`, read at the start)."""

    def __init__(self, folder: str, nprocs: int, stall: float | None = None, poll: float = 0.25):
        self.folder, self.nprocs, self.poll = Path(folder), nprocs, poll
        self.stall = STALL_SECONDS if stall is None else float(stall)
        self.stalled: list | None = None
        self._quit = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._quit.set()
        self._thread.join()

    def read(self, before: list | None = None) -> list:
        """Each rank's last report: None where it has written none yet, ``before[r]`` where
        its file cannot be read just now (being replaced, on Windows)."""
        out = []
        for r in range(self.nprocs):
            try:
                out.append(json.loads((self.folder / f"rank{r}.json").read_text(encoding="utf-8")))
            except (OSError, ValueError):
                out.append(before[r] if before else None)
        return out

    @staticmethod
    def waiting(states: list) -> bool:
        """Every rank reported, some are not done, and each of those waits inside a call."""
        if any(s is None for s in states) or all(s["done"] for s in states):
            return False
        return all(s["done"] or s["in"] for s in states)

    def _run(self) -> None:
        seen, since = None, time.monotonic()
        while not self._quit.wait(self.poll):
            states = self.read(seen)
            if states != seen:
                seen, since = states, time.monotonic()
            elif self.waiting(states) and time.monotonic() - since >= self.stall:
                self.stalled = states
                (self.folder / "stop").write_text("stalled", encoding="utf-8")
                return


def deadlock_text(states: list, stall: float) -> tuple[str, str]:
    """``(what, hint)`` of a check whose ranks the watchdog stopped (``states``: its reports)."""
    cases = sorted({s["case"] for s in states if not s["done"] and s["case"]})
    where = "; ".join(f"rank {r} {'had finished' if s['done'] else 'was in ' + s['in']}"
                      for r, s in enumerate(states))
    what = (f"the ranks stopped making progress{' in ' + ', '.join(cases) if cases else ''}: for "
            f"{stall:.0f} s no rank got any further, so they were stopped. {where}")
    yours = [s["in"] for s in states if not s["done"] and not s["in"].startswith("the check")]
    count = "both ranks are" if len(yours) == 2 else f"all {len(yours)} ranks are" if yours[1:] else "the rank is"
    if yours and all(w.startswith("a blocking dist.send") for w in yours):
        return what, (f"{count} in a blocking `send`, so no rank reaches its `recv`: "
                      f"use `isend`/`irecv` or `batch_isend_irecv`, which post the send and the "
                      f"receive at once")
    if yours and all(w.startswith("a blocking dist.recv") for w in yours):
        return what, (f"{count} in a blocking `recv`, so no rank reaches its `send`: "
                      f"use `isend`/`irecv` or `batch_isend_irecv`, which post the send and the "
                      f"receive at once")
    if yours and all(w.startswith("the wait() of a request") for w in yours):
        return what, (f"{count} in the wait() of a request: a rank that waits for its send before it "
                      f"posts its receive waits for a neighbour doing the same. Post both first "
                      f"(`batch_isend_irecv`, or an `isend` and an `irecv`), then wait")
    return what, ("a rank waits for a message no rank sends, or for a collective another rank "
                  "never calls: every rank must post the same operations, sends and receives in "
                  "flight together")
