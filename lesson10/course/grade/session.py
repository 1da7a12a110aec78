"""One notebook's runs: the judge's side of the runner's protocol, cell by cell.

The runner (:mod:`.runner`) runs the cells in order and says so (``cell``, ``done``); at a
check call it asks for a verdict (``check``): the exercise is judged in a fork
(:func:`.judge.judge_exercise`), or given again the verdict this place got in an earlier
run. Every check call is judged, however many a notebook makes; the last one that ran
counts. What is capped is time: each cell has a limit, each judged call one, the notebook
a total. A cell that hangs or kills the runner is skipped and the sandbox started again
(so is a sandbox whose channels are used up); each check call already judged gets its
verdict again there without being judged again, so only what the broken cell itself
breaks is lost.
"""
from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field

import numpy as np

from ... import scheme
from ...checks import depends, refused
from ...checks.verdict import Status
from . import course, sandbox, wire
from .config import GradeConfig
from .judge import Channel, Failure, entry, judge_exercise, verdict_text


def hidden_seed(seed: int, exercise: str, count: int) -> list[int]:
    """The seed of the judge's hidden cases: the run's seed, the course file's term (a new
    term, new cases; the check cells' fixed seeds stay), the exercise, its call count."""
    term = scheme.current().term
    return [seed, zlib.crc32(term.encode()), zlib.crc32(exercise.encode()), count]

_OUTPUT_LIMIT = 200_000        # characters of one cell's reported output we keep
_NOTEBOOK_OUTPUT = 2_000_000   # ... and of a whole notebook's


# --------------------------------------------------------------------------- one notebook
#: how one sandbox's run of the cells ended: None (every cell ran), the index of the cell
#: that broke it (skipped next time), "deadline", or :data:`RESTART`
Outcome = int | str | None
#: the sandbox's channels are used up: a new sandbox runs the cells again, the check
#: calls already judged get their verdicts again, and the next ones are judged
RESTART = "restart"


@dataclass
class Run:
    """What a notebook's runs produced: verdicts, outputs per cell, notes."""
    verdicts: dict = field(default_factory=dict)     # exercise -> entry of its last check call
    judged: dict = field(default_factory=dict)       # exercise -> times judged
    asked: set = field(default_factory=set)          # exercises whose check call ran
    #: (cell index, n-th check call of that cell) -> the entry it got: a later run (after a
    #: skipped cell or a restart) gives each call the same verdict again, without judging it
    history: dict = field(default_factory=dict)
    outputs: dict = field(default_factory=dict)      # cell index -> {"outputs", "error"}
    notes: list = field(default_factory=list)
    skip: set = field(default_factory=set)
    output_size: int = 0
    sandbox_cpu: float = 0.0         # CPU seconds the sandboxed runner reported (see runner.main)

    def record(self, key: tuple[int, int], e: dict) -> None:
        """The verdict of the check call at ``key``: the exercise's latest."""
        self.history[key] = e
        self.verdicts[e["exercise"]] = e
        self.asked.add(e["exercise"])


def run_notebook(cells, notebook_id: str, settings: GradeConfig, deadline: float, workdir,
                 files=()) -> Run:
    """Run ``cells`` (``[(index, source)]``, every code cell) and judge each exercise of
    ``notebook_id`` at every call of its check (the last one that ran counts). Raises
    :class:`Failure` if no sandbox starts."""
    run = Run()
    exercises = {ex.id: ex for ex in course.exercises(notebook_id)}
    bad = _one_run(cells, exercises, settings, deadline, workdir, files, run)
    while bad is not None:
        if bad == "deadline" or time.monotonic() >= deadline:
            run.notes.append("the notebook's total time limit ran out")
            break
        if bad in run.skip:
            run.notes.append(f"cell {bad} kept breaking the sandbox: grading stopped there")
            break
        if bad != RESTART:
            run.skip.add(bad)
        bad = _one_run(cells, exercises, settings, deadline, workdir, files, run)
    return run


#: what the runner sends that the loop of :class:`_Session` does not handle: each is read
#: at its own place (``hello``/``ready`` by :func:`_start`, ``checked`` after a fork, ``bye``
#: by the sandbox), so in the loop it is out of turn
READ_ELSEWHERE = ("hello", "ready", "checked", "bye")


def _op(msg) -> object:
    return msg.get("op") if isinstance(msg, dict) else None


def _one_run(cells, exercises, settings: GradeConfig, deadline: float, workdir, files,
             run: Run) -> Outcome:
    """One sandbox, the cells run in it (see :data:`Outcome`)."""
    if settings.standin is None:
        raise Failure("no stand-in folder to grade with (GradeConfig.standin)")
    box = sandbox.Sandbox(settings.standin, settings.limits, sandboxed=settings.sandboxed,
                          workdir=workdir)
    conn = wire.Conn(box.main.fileno(), box.main.fileno(), nonblocking_write=True)
    try:
        _start(conn, [(i, s) for i, s in cells if i not in run.skip], files, settings, deadline)
        return _Session(box, conn, exercises, settings, deadline, run).loop(
            [i for i, _ in cells if i not in run.skip])
    finally:
        box.kill()


def _start(conn, cells, files, settings: GradeConfig, deadline: float) -> None:
    """Hello, setup, ready; :class:`Failure` when the runner does not get there."""
    try:
        hello, _ = conn.recv(min(deadline, time.monotonic() + 60))
        if _op(hello) != "hello":
            raise wire.WireError("no hello")
        conn.send({"op": "setup", "cells": [[i, s] for i, s in cells],
                   "files": [list(f) for f in files],
                   "exercise_timeout": settings.exercise_timeout},
                  deadline=time.monotonic() + 30)
        ready, _ = conn.recv(min(deadline, time.monotonic() + 120))
        if _op(ready) != "ready":
            raise wire.WireError(f"the runner failed to start: {str(ready)[:300]}")
    except (wire.Timeout, wire.Closed, wire.WireError) as exc:
        raise Failure(f"the sandbox did not start ({exc})") from None


class _Session:
    """The judge's side of one sandbox's run, one handler per kind of message. Nothing the
    sandbox says is trusted: a message out of turn is the fault of the cell that sent it
    (the one running, else the one that ran last), which is skipped next time."""

    def __init__(self, box, conn, exercises: dict, settings: GradeConfig, deadline: float,
                 run: Run):
        self.box, self.conn, self.exercises = box, conn, exercises
        self.settings, self.deadline, self.run = settings, deadline, run
        self.expected: list[int] = []            # the cells still to come, in order
        self.current: int | None = None          # the cell running
        self.last: int | None = None             # the cell that ran last
        self.started = 0.0                       # when the current cell started (or was checked)
        self.next_channel = 0
        self.checks_in_cell = 0
        self.outcome: Outcome = None
        self.handlers = {"cell": self._on_cell, "done": self._on_done, "check": self._on_check,
                         "finished": self._on_finished, "fatal": self._on_fatal}

    def loop(self, expected: list[int]) -> Outcome:
        self.expected = list(expected)
        while True:
            msg = self._receive()
            if msg is None:
                return self.outcome
            op = _op(msg)
            handler = self.handlers.get(op) if isinstance(op, str) else None
            if handler is None:
                ended = self._out_of_turn(op)
            else:
                ended = handler(msg)
            if ended:
                return self.outcome

    def _end(self, outcome: Outcome, note: str | None = None) -> bool:
        if note:
            self.run.notes.append(note)
        self.outcome = outcome
        return True

    def _receive(self) -> dict | None:
        """The next message, or None when the run ended (a time limit, the process gone)."""
        s = self.settings
        limit = self.deadline if self.current is None else min(self.deadline,
                                                               self.started + s.cell_timeout)
        try:
            msg, _ = self.conn.recv(limit)
            return msg
        except wire.Timeout:
            if self.current is None or time.monotonic() >= self.deadline:
                self._end("deadline")
            else:
                self._end(self.current, f"cell {self.current} ran over {s.cell_timeout:g} s: "
                                        f"skipped")
        except (wire.Closed, wire.WireError):
            if self.current is None and self.last is None:
                self._end(None, "the sandbox ended before the first cell")
            else:
                bad = self.current if self.current is not None else self.last
                self._end(bad, f"cell {bad} ended the notebook's process: skipped")
        return None

    def _out_of_turn(self, op) -> bool:
        blame = self.current if self.current is not None else self.last
        if blame is None:
            return self._end(None, "the notebook's process broke the grader's protocol before "
                                   "its first cell")
        return self._end(blame, f"cell {blame} broke the grader's protocol "
                                f"({str(op)[:20]!r} out of turn): skipped")

    # ------------------------------------------------------------------ the handlers
    def _on_cell(self, msg: dict) -> bool:
        if self.current is not None or not self.expected or msg.get("index") != self.expected[0]:
            return self._out_of_turn("cell")
        self.current = self.last = self.expected.pop(0)
        self.started, self.checks_in_cell = time.monotonic(), 0
        return False

    def _on_done(self, msg: dict) -> bool:
        if self.current is None or msg.get("index") != self.current:
            return self._out_of_turn("done")
        run = self.run
        outs = _outputs(msg.get("outputs"))
        run.output_size += sum(len(o["text"]) for o in outs)
        if run.output_size > _NOTEBOOK_OUTPUT:
            outs = [{"name": "stderr", "text": "[grader: the notebook's output is over "
                                               "its limit; not kept]\n"}]
        run.outputs[self.current] = {"outputs": outs, "error": _error(msg.get("error"))}
        self.current = None
        return False

    def _on_finished(self, msg: dict) -> bool:
        if self.current is not None or self.expected:
            return self._out_of_turn("finished")
        cpu = self.box.finish(self.conn)
        if self.settings.sandboxed:
            self.run.sandbox_cpu += cpu
        return self._end(None)

    def _on_fatal(self, msg: dict) -> bool:
        """The runner failed outside any cell's own error handling (a cell may also forge
        this): the cell running, else the one that ran last, is skipped next time."""
        blame = self.current if self.current is not None else self.last
        what = str(msg.get("message", "")).splitlines()[:1] or ["no message"]
        if blame is None:
            return self._end(None, f"the notebook's process failed before its first cell "
                                   f"({what[0][:200]})")
        return self._end(blame, f"cell {blame} made the notebook's process fail "
                                f"({what[0][:200]}): skipped")

    def _on_check(self, msg: dict) -> bool:
        if self.current is None or not wire.check_shape(msg, self.current):
            return self._out_of_turn("check")      # a forged check is its cell's protocol error
        try:
            ended = self._answer_check(msg, (self.current, self.checks_in_cell))
        except (wire.Timeout, wire.Closed, wire.WireError):
            return self._end(self.current, f"cell {self.current} ended the notebook's process "
                                           f"while it was checked: skipped")
        self.checks_in_cell += 1
        self.started = time.monotonic()          # judging does not count against the cell
        return ended

    # ------------------------------------------------------------------ a check call
    def _answer_check(self, msg: dict, key: tuple[int, int]) -> bool:
        """Answer one ``check`` request with a verdict: given before at this place (a
        later run), or judged now in a fork. True when the channels are used up."""
        ex = self.exercises.get(str(msg.get("exercise")))
        if ex is None:
            self._send({"op": "verdict", "text": f"[grader] check_{str(msg.get('exercise'))[:80]} "
                                                 f"is not an exercise of this notebook: not judged"})
            return False
        given = self.run.history.get(key)
        if given is not None and given["exercise"] == ex.id:
            e = given
        elif not msg.get("callable"):
            e = entry(ex, Status.FAILED, f"check_{ex.id} takes your function itself, e.g. "
                                         f"check_{ex.id}({course.function_name(ex.id)}), not the "
                                         f"result of calling it")
        elif self.next_channel >= sandbox.CHANNELS:
            return self._end(RESTART)
        else:
            e = self._judge(ex, key)
        self.run.record(key, e)
        self._send({"op": "verdict", **e, "text": verdict_text(e)})
        return False

    def _judge(self, ex, key: tuple[int, int]) -> dict:
        """Judge ``ex`` in a fork on the next channel; the verdict is kept before the runner
        says the fork ended (a runner that dies then costs no verdict)."""
        k, self.next_channel = self.next_channel, self.next_channel + 1
        timeout = min(self.settings.exercise_timeout, max(0.0, self.deadline - time.monotonic()))
        self._send({"op": "judge", "channel": k, "timeout": timeout + 1.0,
                    "instead": refused.use_instead(ex.id)})
        count = self.run.judged.get(ex.id, 0)
        rng = np.random.default_rng(hidden_seed(self.settings.seed, ex.id, count))
        channel = Channel(self.box.channels[k], course.function_name(ex.id))
        self.box.channels[k] = _Closed()
        started = time.monotonic()
        try:
            e = judge_exercise(channel, ex, rng, started + timeout, self.settings.exercise_timeout)
        finally:
            channel.close()
        if e["status"] not in ("passed", "not attempted"):     # a helper that failed its check first
            e["message"] = depends.note_for(ex.id, {x: v.get("status") for x, v in
                                                    self.run.verdicts.items()}) + e["message"]
        e["seconds"] = round(time.monotonic() - started, 3)
        self.run.judged[ex.id] = count + 1
        self.run.record(key, e)
        # the runner reports that its fork ended (it kills one that outlives the limit)
        done, _ = self.conn.recv(min(self.deadline, time.monotonic() + timeout + 15))
        if _op(done) != "checked":
            raise wire.WireError("expected 'checked'")
        return e

    def _send(self, msg: dict) -> None:
        self.conn.send(msg, deadline=time.monotonic() + 10)


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
    tb = err.get("traceback")
    tb = tb if isinstance(tb, list) else []
    return {"ename": str(err.get("ename", "Error"))[:100], "evalue": str(err.get("evalue", ""))[:2000],
            "traceback": [str(t)[:2000] for t in tb[:5]]}
