"""lesson10.checks.nb06_progress: notebook 06's checks find a deadlock in seconds, whatever the
load (issue 47). The watchdog and the reports on made-up rank files (no torch), then on real
gloo ranks: a ring_shift of blocking sends is stopped and named, a slow right one is not."""
import json
import os
import subprocess
import sys
import time
import types

import pytest

from lesson10.checks import CheckFailed
from lesson10.checks import nb06_progress as P

SEND = "a blocking dist.send to rank {}"


def _write(folder, states):
    for r, s in enumerate(states):
        if s is not None:
            (folder / f"rank{r}.json").write_text(json.dumps(s), encoding="utf-8")


def _state(where, done=False, case="ring_shift on the world (float64)", seq=1):
    return {"in": where, "case": case, "done": done, "seq": seq}


def _watch(folder, states, seconds, stall=0.5, change=None):
    """Run a watchdog over ``states`` for ``seconds`` (``change(i)`` rewrites them each 0.1 s);
    the seconds it took to stop them, or None."""
    _write(folder, states)
    start = time.monotonic()
    with P.Watchdog(str(folder), len(states), stall=stall, poll=0.05) as dog:
        i = 0
        while time.monotonic() - start < seconds and not (folder / "stop").exists():
            time.sleep(0.1)
            i += 1
            if change:
                _write(folder, change(i))
    took = time.monotonic() - start
    assert (dog.stalled is not None) == (folder / "stop").exists()
    return took if dog.stalled is not None else None


def test_ranks_that_all_wait_are_stopped_after_the_stall(tmp_path):
    states = [_state(SEND.format((r + 1) % 3)) for r in range(3)]
    took = _watch(tmp_path, states, seconds=10)
    assert took is not None and 0.5 <= took < 5
    assert json.loads((tmp_path / "rank2.json").read_text())["in"] == SEND.format(0)


@pytest.mark.parametrize("states", [
    [_state(SEND.format(1)), _state(None), _state(SEND.format(0))],     # rank 1 computes
    [_state(SEND.format(1)), None, _state(SEND.format(0))],             # rank 1 has not reported
    [_state(None, done=True)] * 3,                                      # all finished
], ids=["one-computes", "one-not-started", "all-done"])
def test_ranks_that_are_not_all_waiting_are_left_alone(tmp_path, states):
    assert _watch(tmp_path, states, seconds=1.5) is None


def test_ranks_that_keep_reporting_are_left_alone(tmp_path):
    """Every rank waits, but one reports a new call each 0.1 s: that is progress."""
    def change(i):
        return [_state(SEND.format(1), seq=i), _state(SEND.format(2)), _state(SEND.format(0))]
    assert _watch(tmp_path, change(0), seconds=2, change=change) is None


def test_the_stall_limit_is_fixed_and_short_whatever_the_load(monkeypatch, tmp_path):
    """The check ends within 30 s of the last report: 15 s of stall plus a poll, not load-scaled."""
    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 64.0, 64.0), raising=False)
    assert P.Watchdog(str(tmp_path), 3).stall == P.STALL_SECONDS <= 20


def test_the_verdict_names_where_each_rank_waits():
    what, hint = P.deadlock_text([_state(SEND.format((r + 1) % 3)) for r in range(3)], 15)
    assert "for 15 s" in what and "in ring_shift on the world (float64)" in what
    for r in range(3):
        assert f"rank {r} was in a blocking dist.send to rank {(r + 1) % 3}" in what
    assert hint.startswith("all 3 ranks are in a blocking `send`") and "batch_isend_irecv" in hint


def test_a_rank_outside_the_group_is_not_counted_as_a_sender():
    states = [_state("the check's wait for the other ranks after case 3"),
              _state(SEND.format(2)), _state(SEND.format(1))]
    what, hint = P.deadlock_text(states, 15)
    assert hint.startswith("both ranks are in a blocking `send`")
    assert "rank 0 was in the check's wait" in what


def test_receives_first_waits_first_and_mixed_waits_get_their_own_hints():
    recv = [_state(f"a blocking dist.recv from rank {r}") for r in (2, 0, 1)]
    assert P.deadlock_text(recv, 15)[1].startswith("all 3 ranks are in a blocking `recv`")
    waits = [_state("the wait() of a request (of an isend, an irecv, ...)")] * 2
    assert P.deadlock_text(waits, 15)[1].startswith("both ranks are in the wait() of a request")
    mixed = [_state("dist.all_reduce"), _state(None, done=True), _state(SEND.format(0))]
    what, hint = P.deadlock_text(mixed, 15)
    assert "rank 1 had finished" in what and "rank 0 was in dist.all_reduce" in what
    assert "blocking `send`" not in hint and "every rank must post the same operations" in hint


def test_progress_reports_the_outer_call_and_nothing_without_a_folder(tmp_path):
    prog = P.Progress(str(tmp_path), 1)
    seen = []
    fake = types.SimpleNamespace(
        send=lambda *a, **k: seen.append(json.loads((tmp_path / "rank1.json").read_text())["in"]),
        recv=lambda *a, **k: seen.append(json.loads((tmp_path / "rank1.json").read_text())["in"]))
    calls = P.watch_calls(fake, prog)
    assert set(calls) == {"send", "recv"}               # what the namespace lacks is left out
    calls["send"]("x", 2)
    calls["send"]("x", group="g", group_dst=0)
    calls["recv"]("x")
    with prog.inside("the wait() of a request"):
        calls["recv"]("x", src=1)                       # inside a wait: the wait is named
    assert seen == [SEND.format(2), "a blocking dist.send to group rank 0",
                    "a blocking dist.recv from any rank", "the wait() of a request"]
    assert json.loads((tmp_path / "rank1.json").read_text())["in"] is None
    P.Progress(None, 0).report("x")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank1.json"]


def test_a_rank_ends_itself_when_the_watchdog_says_stop(tmp_path):
    code = (f"import time; from lesson10.checks.nb06_progress import Progress; "
            f"Progress({str(tmp_path)!r}, 0); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "rank0.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        (tmp_path / "stop").write_text("stalled")
        assert proc.wait(timeout=30) == P.STOPPED_EXIT
    finally:
        if proc.poll() is None:
            proc.kill()


# --------------------------------------------------------------------------- real ranks
def test_a_ring_of_blocking_sends_is_stopped_and_named():
    """gloo blocks in a send until its receiver posts a receive, even for a few elements:
    every rank waits in its send. Before, the check waited out the launch's limit (599.8 s
    on a busy machine) and gave a generic hint."""
    pytest.importorskip("torch")
    import answers_06 as A

    from lesson10.checks import nb06_multiprocess as nb06
    limit, start = nb06.launch_timeout(60), time.monotonic()
    with pytest.raises(CheckFailed) as info:
        nb06.check_ring_shift(A.ring_shift_blocking)
    text = str(info.value)
    assert "the ranks stopped making progress" in text and f"for {P.STALL_SECONDS:.0f} s" in text
    for r in range(3):
        assert f"rank {r} was in a blocking dist.send to group rank {(r + 1) % 3}" in text
    assert "hint: all 3 ranks are in a blocking `send`" in text and "batch_isend_irecv" in text
    assert time.monotonic() - start < limit          # stopped by the watchdog, not the limit


def test_a_slow_right_answer_is_not_stopped(monkeypatch, capsys):
    """Rank 0 computes for 6 s before it posts its batch while its peers wait: with a stall
    limit of 2 s the check still waits for it, since rank 0 is not waiting."""
    pytest.importorskip("torch")
    import answers_06 as A

    from lesson10.checks import nb06_multiprocess as nb06
    monkeypatch.setattr(P, "STALL_SECONDS", 2.0)
    nb06.check_ring_shift(A.ring_shift_slow)
    assert "ring_shift passes on 3 ranks" in capsys.readouterr().out
