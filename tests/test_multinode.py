"""torchrun across two hosts: two network namespaces joined by a veth (``make test-multinode``, root).

Every method of the registry runs as ``torchrun --nnodes 2 --nproc-per-node 2 -m lesson10.run``
on both hosts (the static form; one run with the c10d rendezvous), and each node's exit status
and output are checked: node 0 prints the report and the verdict, node 1 prints no report, and
both fail when the case is rejected or a peer stops answering. Skipped where namespaces cannot
be made (not root, no ``ip``); the namespaces and every process in them are removed at the end,
also when a test fails.
"""
import re
import signal
import subprocess
import time

import pytest

from lesson10.bench import twohost
from lesson10.bench.twohost import TwoHosts, namespaces_unavailable, torchrun_two
from lesson10.methods import METHODS

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
    # the ranks of node 1 really are elsewhere: their traffic went over the veth
    assert res.sent[0] > 1000 and res.sent[1] > 1000, res.sent
    assert not hosts.pids(0) and not hosts.pids(1)


def test_a_rejected_case_fails_on_both_nodes(hosts):
    # Ulysses cuts heads over the 4 ranks: 2 query heads cannot be cut 4 ways
    res = torchrun_two(hosts, ["ulysses", *SMALL, "--heads", "2", "--kv-heads", "1"], timeout=240)
    assert res.status[0] not in (0, None) and res.status[1] not in (0, None), _show(res)
    node0, node1 = res.output
    assert "REJECTED" in node0 and "query heads" in node0, _show(res)
    assert "REJECTED" not in node1, _show(res)
    # the workers of both nodes exit with run's status 2, not only rank 0 (torchrun may end
    # a node's other worker with SIGTERM once the first has failed)
    for out in res.output:
        assert 2 in _exit_code(out) and _exit_code(out) <= {2, -signal.SIGTERM}, _show(res)


def test_a_stopped_peer_ends_node_0_within_the_peer_timeout(hosts):
    peer_timeout, slack = 6, 25
    stopped = {}

    def stop_node_1(hosts, procs, paths):
        end = time.monotonic() + 120
        while b"init_from_env" not in paths[0].read_bytes() and time.monotonic() < end:
            time.sleep(0.1)   # rank 0 prints this once the process group is up
        stopped["pids"] = hosts.signal(1, signal.SIGSTOP, match="-u -m lesson10.run")
        stopped["at"] = time.monotonic() - start

    start = time.monotonic()
    res = torchrun_two(hosts, ["moe", *SMALL, "--seq", "256", "--peer-timeout", str(peer_timeout)],
                       timeout=180, during=stop_node_1, grace=2)
    assert len(stopped["pids"]) == 2, (stopped, _show(res))   # node 1's two workers
    assert res.status[0] not in (0, None), _show(res)
    assert res.exit_s[0] - stopped["at"] < peer_timeout + slack, (res.exit_s, stopped)
    node0 = res.output[0]
    assert "a peer stopped answering" in node0 and "--peer-timeout 6 s" in node0, _show(res)
    assert 3 in _exit_code(node0) and _exit_code(node0) <= {3, -signal.SIGTERM}, _show(res)
    assert REPORT not in node0
    # node 1 (stopped) was killed at the end, with everything else in the namespaces
    assert not hosts.pids(0) and not hosts.pids(1)


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
    with pytest.raises(RuntimeError, match="boom"):
        with TwoHosts() as h:
            p = h.start(0, ["sleep", "300"])
            raise RuntimeError("boom")
    assert p.poll() is not None and not set(h.names) & set(_netns())
    # a leftover of an instance that was killed outright (its pid is gone): the next one removes it
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"{twohost.PREFIX}{dead.pid}x0a"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    try:
        with TwoHosts() as h2:
            assert stale not in _netns()
            assert h2.exec(0, ["true"]).returncode == 0
    finally:
        subprocess.run(["ip", "netns", "del", stale], capture_output=True)
