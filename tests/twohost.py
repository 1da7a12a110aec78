"""Two hosts on one machine: two network namespaces joined by a veth pair (root only, stdlib only).

A multi-node run needs more than one network stack: ranks that all live on 127.0.0.1 never
show which bytes cross between nodes, nor what a missing ``GLOO_SOCKET_IFNAME`` does. Here
each "host" is a network namespace with its own ``lo`` and one end of a veth pair, and the
kernel's counters on the veth say exactly how many bytes went over the "wire"::

    from twohost import TwoHosts, torchrun_two

    with TwoHosts(rate="200mbit") as hosts:          # tc tbf on both ends; None: no limit
        res = torchrun_two(hosts, ["moe", "--seq", "256"])
        res.status            # (0, 0): the exit status of torchrun on node 0 and node 1
        res.output[0]         # what node 0 printed (the report)
        res.wall_s, res.link_bytes

Host ``i`` has the address ``ADDRS[i]`` (10.77.0.1 and 10.77.0.2, only inside the
namespaces) on its interface ``hosts.iface(i)``. :meth:`TwoHosts.start` runs a command
there in its own process group; :meth:`TwoHosts.close` (the end of the ``with``, also
after an exception or Ctrl-C, and on SIGTERM) kills every process in the namespaces and
deletes them. Names carry this process's id, so two instances never collide, and a
leftover of an instance that was killed outright is removed by the next one.
"""
from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TwoHosts", "NoNamespaces", "namespaces_unavailable", "TorchrunResult", "default_burst",
           "parse_rate",
           "torchrun_argv", "torchrun_two", "ADDRS", "PREFIX"]

#: the two hosts' addresses (a /24 that exists only inside the namespaces)
ADDRS = ("10.77.0.1", "10.77.0.2")
#: every namespace this module makes is named ``PREFIX<pid>x<n><a|b>``
PREFIX = "l10h"
_NAME = re.compile(rf"^{PREFIX}(\d+)x\d+[ab]$")
_count = itertools.count()


class NoNamespaces(RuntimeError):
    """Network namespaces cannot be made here; the message says why (for a test's skip)."""


def _ip(*args: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed ({proc.returncode}): "
                           f"{proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def namespaces_unavailable() -> str | None:
    """``None`` when this process can make two hosts, else the reason it cannot (not Linux, not
    root, no ``ip`` command, or the kernel refuses a namespace)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, e.g. in CI)"
    if shutil.which("ip") is None:
        return "no `ip` command (apt-get install iproute2)"
    probe = f"{PREFIX}{os.getpid()}x{next(_count)}a"
    proc = _ip("netns", "add", probe, check=False)
    if proc.returncode != 0:
        return f"`ip netns add` failed: {proc.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace(name: str) -> None:
    """SIGKILL every process inside namespace ``name``, then delete it (no error if absent)."""
    for _ in range(20):
        pids = [int(p) for p in _ip("netns", "pids", name, check=False).stdout.split()]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    _ip("netns", "del", name, check=False)


def _remove_leftovers() -> None:
    """Delete namespaces of this module whose creating process is gone (it was killed)."""
    listing = _ip("netns", "list", check=False).stdout
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _NAME.match(name)
        if m and not _alive(int(m.group(1))):
            _kill_namespace(name)


_UNITS = {"bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "bps": 1,
          "kbps": 1e3, "mbps": 1e6, "gbps": 1e9}


def parse_rate(rate: str) -> float:
    """``rate`` in tc's units (``"100mbit"``, ``"1gbit"``, ``"12.5mbps"``; no unit: bit/s) as
    bytes per second; a ValueError that names the units otherwise."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([a-z]*)\s*", str(rate).lower())
    if not m or (m.group(2) and m.group(2) not in _UNITS) or float(m.group(1)) <= 0:
        raise ValueError(f"{rate!r} is not a rate: a number > 0 and one of tc's units "
                         f"({', '.join(_UNITS)}), e.g. 100mbit")
    return float(m.group(1)) * _UNITS[m.group(2) or "bit"]


def default_burst(rate: str | None) -> str:
    """tbf's bucket for ``rate`` (tc's units, e.g. ``"100mbit"``): 10 ms of it, at least 256 KiB."""
    try:
        per_s = parse_rate(rate) if rate else 0.0
    except ValueError:
        per_s = 0.0
    return f"{max(256 * 1024, int(per_s / 100))}b"


class TwoHosts:
    """Two network namespaces joined by a veth pair; a context manager.

    ``rate``: e.g. ``"100mbit"`` puts ``tc qdisc ... tbf rate RATE burst BURST latency
    LATENCY`` on both veth ends (each direction is limited); ``None``: no limit. ``burst``:
    default :func:`default_burst` (tbf passes no more than ``burst`` per clock tick, and a
    veth hands it packets of up to 64 KiB). Raises
    :class:`NoNamespaces` (with the reason) when they cannot be made.
    """

    def __init__(self, rate: str | None = None, burst: str | None = None,
                 latency: str = "200ms"):
        self.rate, self.latency = rate, latency
        self.burst = burst or default_burst(rate)
        n = next(_count)
        self.names = (f"{PREFIX}{os.getpid()}x{n}a", f"{PREFIX}{os.getpid()}x{n}b")
        self._procs: list[subprocess.Popen] = []
        self._open = False
        self._old_handlers: dict = {}

    # ------------------------------------------------------------ life cycle
    def __enter__(self) -> TwoHosts:
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> TwoHosts:
        """Make the namespaces, the veth pair, the addresses and the rate limit."""
        why = namespaces_unavailable()
        if why:
            raise NoNamespaces(why)
        _remove_leftovers()
        self._open = True
        self._catch_signals()
        try:
            for name in self.names:  # a pid reused since a killed run: its leftover goes
                _kill_namespace(name)
                _ip("netns", "add", name)
            a, b = self.names
            _ip("link", "add", self.iface(0), "netns", a, "type", "veth",
                "peer", "name", self.iface(1), "netns", b)
            for i, name in enumerate(self.names):
                # no IPv6 chatter (neighbour discovery) in the counters: only what is sent
                for knob in ("all", "default", self.iface(i)):
                    self.exec(i, ["sysctl", "-qw", f"net.ipv6.conf.{knob}.disable_ipv6=1"])
                _ip("-n", name, "addr", "add", f"{ADDRS[i]}/24", "dev", self.iface(i))
                _ip("-n", name, "link", "set", "lo", "up")
                _ip("-n", name, "link", "set", self.iface(i), "up")
                if self.rate:
                    self.exec(i, ["tc", "qdisc", "add", "dev", self.iface(i), "root", "tbf",
                                  "rate", self.rate, "burst", self.burst,
                                  "latency", self.latency], check=True)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Kill every process started here (and anything else inside the namespaces), delete
        the namespaces (which removes the veth pair). Safe to call twice."""
        for p in self._procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self._open:
            for name in self.names:
                _kill_namespace(name)
        for p in self._procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()
        self._open = False
        self._restore_signals()

    def _catch_signals(self) -> None:
        """SIGTERM / SIGHUP end this process through ``SystemExit``, so ``close`` still runs."""
        if threading.current_thread() is not threading.main_thread():
            return

        def _exit(signum, frame):
            raise SystemExit(128 + signum)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) is signal.SIG_DFL:
                self._old_handlers[sig] = signal.signal(sig, _exit)

    def _restore_signals(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig, old in self._old_handlers.items():
                signal.signal(sig, old)
        self._old_handlers.clear()

    # ------------------------------------------------------------ the hosts
    @staticmethod
    def addr(i: int) -> str:
        """Host ``i``'s address."""
        return ADDRS[i]

    @staticmethod
    def iface(i: int) -> str:
        """Host ``i``'s end of the veth pair (its only interface besides ``lo``)."""
        return f"{PREFIX}{i}"

    def env(self, i: int, extra: dict | None = None) -> dict:
        """The environment of a command on host ``i``: this one's, plus ``GLOO_SOCKET_IFNAME`` and
        ``NCCL_SOCKET_IFNAME`` = its veth, ``OMP_NUM_THREADS=1``, unbuffered Python, then
        ``extra`` (a value ``None`` removes that variable)."""
        env = dict(os.environ, GLOO_SOCKET_IFNAME=self.iface(i), NCCL_SOCKET_IFNAME=self.iface(i),
                   OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        for key, value in (extra or {}).items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def start(self, i: int, argv: list[str], env: dict | None = None, stdout=None,
              cwd: str | None = None) -> subprocess.Popen:
        """Start ``argv`` on host ``i`` (``ip netns exec``) in a new process group, with
        :meth:`env` (plus ``env``); stderr goes with ``stdout`` (a file, or ``None``)."""
        if not self._open:
            raise RuntimeError("TwoHosts is not open: use it as `with TwoHosts() as hosts:`")
        p = subprocess.Popen(["ip", "netns", "exec", self.names[i], *argv], env=self.env(i, env),
                             stdout=stdout, stderr=subprocess.STDOUT if stdout else None,
                             stdin=subprocess.DEVNULL, cwd=cwd, start_new_session=True)
        self._procs.append(p)
        return p

    def exec(self, i: int, argv: list[str], check: bool = False,
             timeout: float = 30.0) -> subprocess.CompletedProcess:
        """Run a short command on host ``i`` and wait for it (output captured as text)."""
        proc = subprocess.run(["ip", "netns", "exec", self.names[i], *argv], capture_output=True,
                              text=True, timeout=timeout, env=self.env(i))
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} on host {i} failed: {proc.stderr.strip()}")
        return proc

    def pids(self, i: int, match: str | None = None) -> list[int]:
        """Processes inside host ``i`` (those whose command line contains ``match``)."""
        pids = [int(p) for p in _ip("netns", "pids", self.names[i], check=False).stdout.split()]
        if match is None:
            return pids
        out = []
        for pid in pids:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if match in cmd:
                out.append(pid)
        return out

    def signal(self, i: int, sig: int, match: str | None = None) -> list[int]:
        """Send ``sig`` to the processes of :meth:`pids`; returns the pids it reached."""
        hit = []
        for pid in self.pids(i, match):
            try:
                os.kill(pid, sig)
                hit.append(pid)
            except ProcessLookupError:
                pass
        return hit

    def counters(self) -> tuple[dict, dict]:
        """The kernel's counters of each host's veth end: ``{"tx_bytes", "rx_bytes",
        "tx_packets", "rx_packets"}`` (IP and TCP headers included)."""
        out = []
        for i, name in enumerate(self.names):
            (link,) = json.loads(_ip("-n", name, "-s", "-j", "link", "show", "dev",
                                     self.iface(i)).stdout)
            st = link["stats64"]
            out.append({"tx_bytes": st["tx"]["bytes"], "rx_bytes": st["rx"]["bytes"],
                        "tx_packets": st["tx"]["packets"], "rx_packets": st["rx"]["packets"]})
        return out[0], out[1]


# ------------------------------------------------------------------ torchrun
@dataclass
class TorchrunResult:
    """One run of :func:`torchrun_two`. ``status``: torchrun's exit status on each node
    (``None``: killed at the time limit); ``output``: what each node printed (stdout and
    stderr); ``wall_s``; ``link_bytes``: bytes that crossed the veth in both directions (host
    0's tx + host 1's tx, headers included); ``sent``: each host's tx bytes; ``exit_s``: when
    each node's torchrun ended, seconds after the start (``None``: killed); ``timed_out``."""
    status: tuple
    output: tuple
    wall_s: float
    link_bytes: int
    sent: tuple
    exit_s: tuple
    timed_out: bool


def torchrun_argv(i: int, run_args: list[str], nproc_per_node: int = 2, port: int = 29500,
                  rdzv: str = "static", module: str = "lesson10.run") -> list[str]:
    """The command of node ``i``: ``python -m torch.distributed.run`` (that is ``torchrun``,
    from this Python) ``--nnodes 2 --nproc-per-node N`` and either the static form
    (``--node-rank i --master-addr 10.77.0.1 --master-port P``) or, ``rdzv="c10d"``, the c10d
    rendezvous (``--rdzv-endpoint 10.77.0.1:P``, ``is_host`` on node 0, ``--local-addr``);
    both with ``--max-restarts 0``."""
    head = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
            "--nproc-per-node", str(nproc_per_node)]
    if rdzv == "static":
        head += ["--node-rank", str(i), "--master-addr", ADDRS[0], "--master-port", str(port)]
    elif rdzv == "c10d":
        head += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{ADDRS[0]}:{port}",
                 "--rdzv-id", f"lesson10-{port}",
                 "--rdzv-conf", f"is_host={'true' if i == 0 else 'false'}",
                 "--local-addr", ADDRS[i]]
    else:
        raise ValueError(f"rdzv must be 'static' or 'c10d', got {rdzv!r}")
    # no restarts: a rank that lost its peer must end the job, not be started again
    return head + ["--max-restarts", "0", "-m", module, *run_args]


_ports = itertools.count(29500 + (os.getpid() % 400) * 10)


def torchrun_two(hosts: TwoHosts, run_args: list[str], nproc_per_node: int = 2,
                 port: int | None = None, timeout: float = 300.0, rdzv: str = "static",
                 during=None, env: dict | None = None, grace: float = 30.0,
                 module: str = "lesson10.run") -> TorchrunResult:
    """``torchrun --nnodes 2 --nproc-per-node N ... -m lesson10.run RUN_ARGS`` on both hosts at
    once; wait for both (at most ``timeout`` s, then kill them) and return a
    :class:`TorchrunResult`. ``port``: the rendezvous port on host 0 (default: a new one per
    call, so a port in TIME_WAIT is never reused). ``during(hosts, procs, paths)``: called once
    both are started, while they run (e.g. to stop a node; ``paths``: their output files).
    ``grace``: once one node's torchrun has ended, how long the other may still run; then what
    is left of both (torchrun and its workers, which run in sessions of their own) is killed."""
    port = next(_ports) if port is None else port
    with tempfile.TemporaryDirectory(prefix="lesson10-twohost-") as tmp:
        paths = [Path(tmp) / f"node{i}.log" for i in range(2)]
        files = [open(p, "wb") for p in paths]  # noqa: SIM115 - closed in the finally below
        before = hosts.counters()
        start = time.monotonic()
        procs: list = []
        try:
            for i in range(2):
                procs.append(hosts.start(i, torchrun_argv(i, run_args, nproc_per_node, port,
                                                          rdzv, module), env=env, stdout=files[i]))
            if during is not None:
                during(hosts, procs, paths)
            ended = _wait_both(procs, start + timeout, grace)
        finally:
            for i, p in enumerate(procs):  # what is left: torchrun, and its workers (own sessions)
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                hosts.signal(i, signal.SIGKILL, match=f"-m {module}")
                p.wait()
            for i in range(2):
                _gone(hosts, i)
            for f in files:
                f.close()
        wall = time.monotonic() - start
        after = hosts.counters()
        sent = tuple(after[i]["tx_bytes"] - before[i]["tx_bytes"] for i in range(2))
        output = tuple(p.read_text(errors="replace") for p in paths)
    status = tuple(p.returncode if e is not None else None for p, e in zip(procs, ended))
    return TorchrunResult(status, output, wall, sum(sent), sent,
                          tuple(None if e is None else e - start for e in ended),
                          any(e is None for e in ended))


def _gone(hosts: TwoHosts, i: int, within: float = 15.0) -> None:
    """Wait (at most ``within`` s) until no process is left in host ``i``: a process sent
    SIGKILL is listed until it has exited, which for a stopped torch rank under load takes a
    moment; a watcher left behind by a rank (lesson10.runs.agent) ends once its agent has."""
    end = time.monotonic() + within
    while hosts.pids(i) and time.monotonic() < end:
        time.sleep(0.1)


def _wait_both(procs, deadline: float, grace: float) -> list:
    """When each process ended (``time.monotonic()``), ``None`` for one still running at the
    deadline, or ``grace`` s after the other one ended."""
    ended = [None, None]
    while time.monotonic() < deadline and None in ended:
        for i, p in enumerate(procs):
            if ended[i] is None and p.poll() is not None:
                ended[i] = time.monotonic()
                deadline = min(deadline, ended[i] + grace)
        time.sleep(0.05)
    return ended
