"""The judge <-> runner protocol is one table (``wire.PROTOCOL``): every message the grader
sends is in it with its sender, and every message the runner sends the judge's loop either
handles or reads at its own place; a runner's ``fatal`` ends the run with the cell blamed."""
import ast
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from lesson10.course.grade import session, wire

GRADE = Path(session.__file__).parent
#: who sends the ops of each file's conn.send calls
SENDERS = {"runner.py": {"runner", "fork"}, "session.py": {"judge"}, "judge.py": {"judge"},
           "sandbox.py": {"judge"}}


def sent_ops(path: Path) -> set[str]:
    """The ``"op"`` of every dict literal in ``path`` that has one."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and k.value == "op" and isinstance(v, ast.Constant):
                    out.add(v.value)
    return out


def test_every_message_sent_is_in_the_table_with_its_sender():
    everything = set()
    for name, senders in SENDERS.items():
        ops = sent_ops(GRADE / name)
        assert ops, name
        for op in ops:
            assert op in wire.PROTOCOL, f"{name} sends {op!r}: add it to wire.PROTOCOL"
            assert wire.PROTOCOL[op][0] in senders, (name, op, wire.PROTOCOL[op])
        everything |= ops
    assert set(wire.PROTOCOL) == everything, f"in the table, sent by nobody: {set(wire.PROTOCOL) - everything}"


def _session(messages):
    """A judge's loop over ``messages`` as the runner would send them."""
    queue = list(messages)

    class Conn:
        def recv(self, deadline=None):
            if not queue:
                raise wire.Closed("gone")
            return queue.pop(0), []

        def send(self, msg, blobs=(), deadline=None):
            pass
    run = SimpleNamespace(notes=[], skip=set(), output_size=0, outputs={})
    settings = SimpleNamespace(cell_timeout=60.0, sandboxed=False)
    s = session._Session(SimpleNamespace(channels=[]), Conn(), {}, settings,
                         time.monotonic() + 60, run)
    return s, run


def test_every_runner_message_is_handled_or_read_elsewhere():
    s, _ = _session([])
    runner_main = {op for op, (who, pipe, _) in wire.PROTOCOL.items() if who == "runner" and pipe == "main"}
    handled, elsewhere = set(s.handlers), set(session.READ_ELSEWHERE)
    assert not handled & elsewhere
    assert runner_main == handled | elsewhere, runner_main ^ (handled | elsewhere)


@pytest.mark.parametrize("op", session.READ_ELSEWHERE)
def test_a_message_read_elsewhere_is_out_of_turn_in_the_loop(op):
    s, run = _session([{"op": "cell", "index": 0}, {"op": op}])
    assert s.loop([0]) == 0
    assert run.notes == [f"cell 0 broke the grader's protocol ({op!r} out of turn): skipped"]


def test_a_fatal_runner_blames_the_cell_it_ran():
    s, run = _session([{"op": "cell", "index": 0}, {"op": "done", "index": 0, "outputs": []},
                       {"op": "cell", "index": 1},
                       {"op": "fatal", "cell": 1, "message": "MemoryError: boom\nTraceback ..."}])
    assert s.loop([0, 1]) == 1
    assert run.notes == ["cell 1 made the notebook's process fail (MemoryError: boom): skipped"]
    s, run = _session([{"op": "fatal", "message": "RuntimeError: no shell"}])
    assert s.loop([0]) is None
    assert run.notes == ["the notebook's process failed before its first cell (RuntimeError: no shell)"]
