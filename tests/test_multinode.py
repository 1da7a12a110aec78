"""torchrun across two hosts: two network namespaces joined by a veth (``make test-multinode``, root).

Every method of the registry runs as ``torchrun --nnodes 2 --nproc-per-node 2 -m lesson10.run``
on both hosts (the static form; one run with the c10d rendezvous), and each node's exit status
and output are checked: node 0 prints the report and the verdict, node 1 prints no report, and
both fail when the case is rejected or a peer stops answering. Skipped where namespaces cannot
be made (not root, no ``ip``); the namespaces and every process in them are removed at the end,
also when a test fails.
"""
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import twohost
from twohost import TwoHosts, namespaces_unavailable, torchrun_two

from lesson10.runs.registry import METHODS

pytestmark = pytest.mark.multinode

#: small enough for two cores: four ranks of every method in a few seconds each
SMALL = ["--seq", "64", "--heads", "4", "--dim", "8", "--peer-timeout", "30", "--timeout", "120"]
REPORT = "bytes sent per rank"


def _need_hosts() -> None:
    why = namespaces_unavailable()
    if why:
        pytest.skip(f"no two hosts here: {why}")


@pytest.fixture(scope="module")
def hosts():
    _need_hosts()
    with TwoHosts() as h:
        yield h
    assert not set(h.names) & set(_netns()), "the namespaces were left behind"


@pytest.fixture(scope="module")
def run_s(hosts) -> float:
    """Seconds one small ring run across the two hosts takes here and now (four ranks started
    on two nodes): the calibration of the limits that must let a start through, since
    ``--peer-timeout`` bounds the ranks' joining too (machines differ 4x, and this one is shared)."""
    res = torchrun_two(hosts, ["ring", *SMALL], timeout=600)
    assert res.status == (0, 0), _show(res)
    return res.wall_s


def _peer_timeout(run_s: float) -> int:
    """A peer timeout that a slow start never hits: 6 s, or one whole small run where that is longer."""
    return max(6, math.ceil(run_s))


def _netns() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.split()]


def _show(res) -> str:
    return "\n".join(f"--- node {i} (status {res.status[i]}):\n{res.output[i][-3000:]}"
                     for i in range(2))


def _exit_code(out: str) -> set[int]:
    """The worker exit codes that torchrun's failure report names."""
    return {int(c) for c in re.findall(r"exitcode\s*:\s*(-?\d+)", out)}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_passes_across_two_hosts(hosts, method):
    res = torchrun_two(hosts, [method, *SMALL], timeout=240)
    assert res.status == (0, 0), _show(res)
    node0, node1 = res.output
    assert "on N=4 ranks" in node0 and REPORT in node0, _show(res)
    assert node0.rstrip().splitlines()[-1].endswith("passed: OK"), _show(res)
    assert REPORT not in node1 and "passed" not in node1, _show(res)
    # the exit barrier's watchers (lesson10.runs.agent) ended with their agents, silently.
    # torch itself may log "Error waiting on exit barrier" on node 1 when node 0's agent, which
    # holds the store, leaves the barrier first (a race a loaded machine makes likely); both
    # statuses are 0 then, and the watcher's words are what must be absent
    from lesson10.runs.agent import AT_EXIT_BARRIER, LOST_PEER
    assert "its torchrun agent" not in node0 + node1, _show(res)
    assert AT_EXIT_BARRIER not in node0 + node1 and LOST_PEER not in node0 + node1, _show(res)
    # the ranks of node 1 really are elsewhere: their traffic went over the veth
    assert res.sent[0] > 1000 and res.sent[1] > 1000, res.sent
    assert not hosts.pids(0) and not hosts.pids(1)


def test_a_rejected_case_fails_on_both_nodes(hosts):
    # Ulysses cuts heads over the 4 ranks: 2 query heads cannot be cut 4 ways. Every rank
    # checks the case before it joins the process group (nothing hangs, nothing starts):
    # the first rank of each node says why in one line, every worker exits with status 2
    res = torchrun_two(hosts, ["ulysses", *SMALL, "--heads", "2", "--kv-heads", "1"], timeout=240)
    assert res.status[0] not in (0, None) and res.status[1] not in (0, None), _show(res)
    for out in res.output:
        assert out.count("refused: ulysses:") == 1 and "K/V heads" in out, _show(res)
        # (torchrun's own ChildFailedError report is a traceback of torchrun, not of the ranks)
        assert not re.search(r'File ".*lesson10/(runs|spmd)/', out) and REPORT not in out, _show(res)
        assert 2 in _exit_code(out) and _exit_code(out) <= {2, -signal.SIGTERM}, _show(res)


def _stop_node(record: dict, node: int = 1, match: str = "-u -m lesson10.run"):
    """A ``during`` for torchrun_two: once rank 0 has its process group (it prints
    ``init_from_env``), SIGSTOP the processes of ``node`` whose command line has ``match``
    (default its workers; ``"python"``: the whole node, its torchrun too); ``record``: their
    pids and when (s after start)."""
    start = time.monotonic()

    def stop(hosts, procs, paths):
        end = time.monotonic() + 120
        while b"init_from_env" not in paths[0].read_bytes() and time.monotonic() < end:
            time.sleep(0.1)
        time.sleep(0.1)          # a run at these sizes can end within half a second
        record["pids"] = hosts.signal(node, signal.SIGSTOP, match=match)
        record["at"] = time.monotonic() - start
    return stop


def _stop_node_1(record: dict):
    return _stop_node(record)


def test_a_stopped_peer_ends_node_0_within_the_peer_timeout(hosts, run_s):
    peer_timeout, slack = _peer_timeout(run_s), max(25, 2 * run_s)
    stopped = {}
    # --seq 4096: long enough that the stop lands mid-run, not after the verdict
    res = torchrun_two(hosts, ["moe", *SMALL, "--seq", "4096", "--peer-timeout", str(peer_timeout)],
                       timeout=180, during=_stop_node_1(stopped), grace=2)
    assert len(stopped["pids"]) == 2, (stopped, _show(res))   # node 1's two workers
    assert res.status[0] not in (0, None), _show(res)
    assert res.exit_s[0] - stopped["at"] < peer_timeout + slack, (res.exit_s, stopped)
    node0 = res.output[0]
    assert "a peer stopped answering" in node0 and f"--peer-timeout {peer_timeout} s" in node0, _show(res)
    assert 3 in _exit_code(node0) and _exit_code(node0) <= {3, -signal.SIGTERM}, _show(res)
    assert REPORT not in node0
    # node 1 (stopped) was killed at the end, with everything else in the namespaces
    assert not hosts.pids(0) and not hosts.pids(1)


def test_a_peer_agent_stopped_after_the_run_does_not_hold_node_0_at_the_exit_barrier(hosts, run_s):
    """SIGSTOP of node 1's torchrun alone, while its ranks run: they finish, the run passes, and
    node 0's torchrun then waits at its exit barrier for node 1's agent (300 s, fixed in torch).
    The watcher left by node 0's first rank ends it within --peer-timeout + AGENT_GRACE."""
    from lesson10.runs.agent import AGENT_GRACE
    peer_timeout, slack = _peer_timeout(run_s), max(20, 2 * run_s)
    stopped = {}
    res = torchrun_two(hosts, ["ring", *SMALL, "--seq", "256", "--peer-timeout", str(peer_timeout)],
                       timeout=180, during=_stop_node(stopped, 1, "torch.distributed.run"), grace=2)
    assert len(stopped["pids"]) == 1, (stopped, _show(res))       # node 1's torchrun
    node0 = res.output[0]
    assert REPORT in node0 and "passed: OK" in node0, _show(res)   # the run itself passed
    assert res.status[0] == -signal.SIGKILL, _show(res)
    assert res.exit_s[0] - stopped["at"] < peer_timeout + AGENT_GRACE + slack, (res.exit_s, stopped)
    assert node0.count("at torchrun's exit barrier") == 1 and "ending it with SIGKILL" in node0, _show(res)
    assert not hosts.pids(0) and not hosts.pids(1)


#: sizes at which what a run sends (MB) dwarfs its start-up and bookkeeping (about 160 kB
#: over the veth: the rendezvous, gloo's connections, the checks' own all-gathers)
WIRE = ["--seq", "2048", "--heads", "4", "--dim", "32", "--peer-timeout", "60", "--timeout", "240"]


def _on_the_wire(node0: str) -> int:
    """The sum over ranks, checked runs, forward and backward of what ``run`` says went on the
    wire across nodes."""
    lines = re.findall(r"on the wire across nodes: \[([\d, ]+)\] / \[([\d, ]+)\]", node0)
    assert lines, node0
    return sum(int(v.replace(",", "")) for pair in lines for part in pair for v in part.split(", "))


@pytest.mark.parametrize("method", sorted(METHODS))
def test_the_bytes_said_to_cross_are_what_the_veth_carried(hosts, method):
    """The kernel's counters of the veth (everything that crossed, both ways, the whole run)
    against the sum of run's "on the wire across nodes" (gloo's algorithms): within 5%."""
    res = torchrun_two(hosts, [method, *WIRE, *(["--seq", "4096"] if method == "moe" else [])],
                       timeout=300)
    assert res.status == (0, 0), _show(res)
    said = _on_the_wire(res.output[0])
    assert "gloo's algorithms" in res.output[0] and "model:" not in res.output[0]
    assert abs(res.link_bytes / said - 1) < 0.05, (method, res.link_bytes, said)


def _across(node0: str) -> list[int]:
    """Each rank's forward bytes across nodes, from run's report (first case)."""
    line = re.search(r"across nodes:\s+\[([\d, ]+)\] /", node0)
    assert line, node0
    return [int(v.replace(",", "")) for v in line.group(1).split(", ")]


def test_usp_defaults_to_the_node_size_and_warns_when_a_group_spans_nodes(hosts):
    default = torchrun_two(hosts, ["usp", *SMALL], timeout=240)
    explicit = torchrun_two(hosts, ["usp", *SMALL, "--ulysses-size", "2"], timeout=240)
    spanning = torchrun_two(hosts, ["usp", *SMALL, "--ulysses-size", "4"], timeout=240)
    for res in (default, explicit, spanning):
        assert res.status == (0, 0), _show(res)
    assert "ulysses_size u = 2 (ring of 2)" in default.output[0], _show(default)
    assert "warning" not in default.output[0] and "warning" not in explicit.output[0]
    assert _across(default.output[0]) == _across(explicit.output[0])
    assert "ulysses_size u = 4" in spanning.output[0]
    assert "across nodes (nodes of 2 ranks)" in spanning.output[0], _show(spanning)
    # the default keeps the all-to-alls inside a node: only the ring's K/V blocks cross,
    # (r-1) 2 (s/r) h e / (g u) forward on every rank (s=64, h=4*8, float32, u=r=2, g=1)
    assert _across(default.output[0]) == [1 * 2 * 32 * 32 * 4 // 2] * 4, _show(default)


def test_node_limited_moe_moves_fewer_bytes_over_the_link(hosts):
    """The veth's kernel counters: the two-level dispatch with --max-nodes 1 < without it <
    the flat all-to-all, which gains nothing from the limit."""
    runs = {name: torchrun_two(hosts, ["moe", *SMALL, "--seq", "512", *extra], timeout=240)
            for name, extra in (("two_level", []), ("limited", ["--max-nodes", "1"]),
                                ("flat", ["--dispatch", "flat"]),
                                ("flat_limited", ["--dispatch", "flat", "--max-nodes", "1"]))}
    for res in runs.values():
        assert res.status == (0, 0), _show(res)
    wire = {name: res.link_bytes for name, res in runs.items()}
    assert wire["limited"] < wire["two_level"] < wire["flat"], wire
    assert wire["flat_limited"] > 0.9 * wire["flat"], wire
    # what the byte counter says crossed follows the kernel's order
    said = {name: sum(_across(res.output[0])) for name, res in runs.items()}
    assert said["limited"] < said["two_level"] < said["flat"], said
    assert "two_level dispatch, rank 0 from the routing" in runs["limited"].output[0]


def test_the_runs_time_limit_is_enforced_in_every_rank(hosts, run_s):
    """A stopped peer with a long --peer-timeout: --timeout ends node 0's ranks and says so."""
    limit = max(8, math.ceil(run_s))              # the run is stopped, so any limit must end it
    res = torchrun_two(hosts, ["ring", *SMALL, "--seq", "256", "--peer-timeout", str(15 * limit),
                               "--timeout", str(limit)], timeout=15 * limit, during=_stop_node_1({}),
                       grace=2)
    node0 = res.output[0]
    assert res.status[0] not in (0, None) and res.exit_s[0] < max(60, 5 * limit), _show(res)
    assert f"did not finish within --timeout {limit} s" in node0, _show(res)
    assert 4 in _exit_code(node0) and _exit_code(node0) <= {4, -signal.SIGTERM}, _show(res)


def test_losing_the_c10d_store_host_ends_the_other_node(hosts, run_s):
    """SIGSTOP of the whole node that hosts the c10d store (its torchrun and its ranks): node 1's
    ranks give up within --peer-timeout (exit 3), and its torchrun, which would wait on the lost
    store for good, is ended by the watcher they leave behind within AGENT_GRACE more."""
    from lesson10.runs.agent import AGENT_GRACE
    peer_timeout, slack = _peer_timeout(run_s), max(15, 2 * run_s)
    stopped = {}
    res = torchrun_two(hosts, ["ring", *SMALL, "--seq", "256", "--peer-timeout", str(peer_timeout)],
                       timeout=180, rdzv="c10d", during=_stop_node(stopped, 0, "python"), grace=5)
    assert len(stopped["pids"]) >= 3, (stopped, _show(res))     # torchrun and its two workers
    assert res.status[1] not in (0, None), _show(res)
    took = res.exit_s[1] - stopped["at"]
    assert took < peer_timeout + AGENT_GRACE + slack, (took, _show(res))
    node1 = res.output[1]
    assert node1.count("a peer stopped answering") == 2 and f"--peer-timeout {peer_timeout} s" in node1, \
        _show(res)
    assert "ending it with SIGKILL" in node1, _show(res)
    assert not hosts.pids(1, match="torch.distributed.run"), "node 1's torchrun still runs"


def test_the_c10d_rendezvous_form(hosts):
    res = torchrun_two(hosts, ["ring", *SMALL], timeout=240, rdzv="c10d")
    assert res.status == (0, 0), _show(res)
    assert res.output[0].rstrip().endswith("passed: OK") and REPORT not in res.output[1]
    assert "--rdzv-backend" in " ".join(twohost.torchrun_argv(1, ["ring"], rdzv="c10d"))


def test_the_link_counters_and_the_rate_limit():
    """A rate-limited pair: bytes sent from host 0 show on both ends, at about the rate."""
    _need_hosts()
    sink = ("import socket\n"
            "s = socket.create_server(('0.0.0.0', 29400)); c, _ = s.accept()\n"
            "while c.recv(1 << 16): pass\n")
    send = ("import socket, time\n"
            "for _ in range(100):\n"
            "    try:\n"
            "        c = socket.create_connection((%r, 29400), timeout=5); break\n"
            "    except OSError: time.sleep(0.05)\n"
            "c.sendall(b'x' * 1_000_000); c.close()\n")
    with TwoHosts(rate="8mbit", burst="64kb") as h:
        assert "tbf" in h.exec(0, ["tc", "qdisc", "show", "dev", h.iface(0)]).stdout
        before = h.counters()
        server = h.start(1, ["python3", "-c", sink], stdout=subprocess.DEVNULL)
        t0 = time.monotonic()
        rc = h.exec(0, ["python3", "-c", send % h.addr(1)], timeout=60)
        assert rc.returncode == 0, rc.stderr
        server.wait(30)   # the sink has read everything
        wall = time.monotonic() - t0
        after = h.counters()
        names = h.names
    sent = after[0]["tx_bytes"] - before[0]["tx_bytes"]
    got = after[1]["rx_bytes"] - before[1]["rx_bytes"]
    assert 1_000_000 < sent < 1_200_000 and abs(got - sent) < 1000, (sent, got)
    assert wall > 0.7, wall          # 1 MB at 8 Mbit/s takes about a second
    assert not set(names) & set(_netns())


def test_cleanup_after_an_exception_and_after_a_killed_instance():
    _need_hosts()
    with pytest.raises(RuntimeError, match="boom"), TwoHosts() as h:
        p = h.start(0, ["sleep", "300"])
        raise RuntimeError("boom")
    assert p.poll() is not None and not set(h.names) & set(_netns())
    # an instance killed outright (SIGKILL: no clean-up ran) leaves its namespaces and their
    # processes; the next instance removes them
    proc, names, pid = _harness_in_a_process()
    proc.kill()
    proc.wait(30)
    assert all(n in _netns() for n in names) and os.path.exists(f"/proc/{pid}")
    with TwoHosts() as h2:
        assert not set(names) & set(_netns())
        assert h2.exec(0, ["true"]).returncode == 0
    assert not _running(pid)


def _harness_in_a_process():
    """A Python process inside ``with TwoHosts()`` that started ``sleep 300`` on host 1."""
    # Ctrl-C's handler is set here: a shell that starts CI in the background starts it with
    # SIGINT ignored, and Python keeps an ignored SIGINT ignored.
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            "from twohost import TwoHosts\n"
            "with TwoHosts() as h:\n"
            "    p = h.start(1, ['sleep', '300'])\n"
            "    print(' '.join(h.names), p.pid, flush=True)\n"
            "    time.sleep(300)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    *names, pid = proc.stdout.readline().split()
    assert len(names) == 2 and all(n in _netns() for n in names), names
    return proc, names, int(pid)


def _running(pid: int) -> bool:
    try:
        return "zombie" not in open(f"/proc/{pid}/status").read().lower()
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_harness_removes_what_it_made(sig, tmp_path):
    """Ctrl-C (SIGINT) or SIGTERM in the middle of a ``with TwoHosts()``: nothing is left."""
    _need_hosts()
    proc, names, pid = _harness_in_a_process()
    try:
        proc.send_signal(sig)
        assert proc.wait(600) != 0  # a safety net only: the signal ends it at once
    finally:
        proc.kill()
    assert not set(names) & set(_netns())
    assert not _running(pid)
