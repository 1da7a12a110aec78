"""`run`'s two time limits: ``--timeout`` (the whole run, a watchdog under torchrun) and
``--peer-timeout`` (the process group's, how soon a dead peer surfaces); the messages name them."""
import subprocess
import sys
import time

import pytest

from lesson10.runs import cli as run
from lesson10.spmd.launch import check_peer_timeout, is_peer_error


def test_the_watchdog_says_which_limit_was_hit_and_exits_4():
    # the sleep outlasts any test run: only the watchdog can end it (however slow the start)
    code = "from lesson10.runs.cli import start_watchdog\nimport time\nstart_watchdog(0.5, 3)\ntime.sleep(3600)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == run.TIMED_OUT == 4, proc.stderr
    assert "rank 3" in proc.stderr and "--timeout 0.5 s" in proc.stderr, proc.stderr


def test_a_cancelled_watchdog_does_nothing():
    dog = run.start_watchdog(0.2, 0)
    dog.cancel()
    time.sleep(0.4)   # this process is still here


@pytest.mark.parametrize("argv", [["--peer-timeout", "0"], ["--peer-timeout", "inf"],
                                  ["--timeout", "-1"], ["--peer-timeout", "nan"]])
def test_bad_timeouts_are_argument_errors(argv, capsys):
    assert run.main(["ring", *argv]) == 2
    assert "must be a finite number of seconds > 0" in capsys.readouterr().err


def test_help_documents_both_limits(capsys):
    with pytest.raises(SystemExit):
        run.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--peer-timeout" in out and "total wall-clock limit" in out
    assert "--peer-timeout" in run.__doc__ and "--timeout" in run.__doc__


def test_what_counts_as_a_peer_that_stopped_answering():
    gloo = RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 8000ms for "
                        "recv operation to complete")
    assert is_peer_error(gloo)
    assert is_peer_error(RuntimeError("Connection closed by peer [10.77.0.2]:3456"))
    assert not is_peer_error(ValueError("Ulysses splits heads over 4 ranks"))
    assert not is_peer_error(RuntimeError("shape mismatch"))
    msg = run.peer_lost_message(2, 6.0, gloo)
    assert msg.startswith("rank 2: a peer stopped answering") and "--peer-timeout 6 s" in msg
    assert "exit status 3" in msg and "Timed out waiting" in msg
    assert "GLOO_SOCKET_IFNAME" not in msg + run.peer_lost_message(
        0, 6.0, RuntimeError("Connection closed by peer [10.77.0.2]:3456"))
    loop = RuntimeError("Gloo connectFullMesh failed with timed out connecting: SO_ERROR: "
                        "Connection refused, remote=[127.0.0.1]:24960")
    assert "GLOO_SOCKET_IFNAME" in run.peer_lost_message(0, 6.0, loop)


def test_peer_timeout_must_be_a_positive_number():
    assert check_peer_timeout(5) == 5.0
    for bad in (0, -1, float("inf"), True, "5"):
        with pytest.raises(ValueError, match="peer_timeout"):
            check_peer_timeout(bad)


def test_the_single_machine_form_says_which_limit_was_hit(monkeypatch, capsys):
    import importlib
    launch_mod = importlib.import_module("lesson10.spmd.launch")
    argv = ["ring", "--nproc", "2", "--timeout", "5", "--peer-timeout", "2"]

    def timed_out(*a, **k):
        raise launch_mod.LaunchTimeout(5, [0, 1])
    monkeypatch.setattr(launch_mod, "launch", timed_out)
    assert run.main(argv) == run.TIMED_OUT == 4
    assert "did not finish within --timeout 5 s" in capsys.readouterr().err

    def peer_lost(*a, **k):
        raise launch_mod.RankError(1, "DistBackendError", "RuntimeError: [gloo] Timed out waiting "
                                   "2000ms for recv operation to complete")
    monkeypatch.setattr(launch_mod, "launch", peer_lost)
    assert run.main(argv) == run.PEER_LOST == 3
    err = capsys.readouterr().err
    assert "rank 1: a peer stopped answering" in err and "--peer-timeout 2 s" in err

    def bug(*a, **k):
        raise launch_mod.RankError(0, "ValueError", "ValueError: a bug in a worker")
    monkeypatch.setattr(launch_mod, "launch", bug)
    with pytest.raises(launch_mod.RankError, match="a bug"):
        run.main(argv)


def test_the_watcher_ends_an_agent_that_outlives_its_rank_and_spares_one_that_exits():
    """lesson10.runs.agent: a torchrun agent still running ``grace`` s after its rank lost a
    peer is ended with SIGKILL (and the watcher says so); one that exits in time is left alone."""
    import signal

    from lesson10.runs import agent
    hung = subprocess.Popen(["sleep", "300"])
    quick = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    try:
        watchers = [agent.stop_agent_later((p.pid, agent._start_time(p.pid)), 5, grace=1.0)
                    for p in (hung, quick)]
        assert hung.wait(30) == -signal.SIGKILL
        assert quick.wait(30) == 0
        assert all(w.wait(30) == 0 for w in watchers)
    finally:
        hung.kill()
    assert agent.torchrun_agent() is None          # pytest's parent is no torchrun
    assert agent.stop_agent_later(None, 0) is None
