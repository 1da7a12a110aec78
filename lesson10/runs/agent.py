"""A torchrun agent that outlives its ranks, ended from the rank that lost its peer.

With the c10d rendezvous the store lives inside one node's ``torchrun`` (``is_host=true``).
When that node is lost (killed, stopped, cut off), the ranks of the other nodes notice within
``--peer-timeout`` and exit 3, but their own ``torchrun`` then tries to close the rendezvous on
the lost store and can wait there for good. So a rank that gives up on a peer first leaves a
small watcher behind (a fresh Python in its own session, so the agent's clean-up of its
workers does not reach it): if the agent is still running :data:`AGENT_GRACE` seconds later,
the watcher says so on stderr and ends it with SIGKILL. An agent that exits by itself in time
(the static rendezvous always does, with its failure report and status 1) is left alone.

A run that ends well has the same gap one step later: once all of a node's ranks have exited 0,
its agent waits at torchrun's *exit barrier* for every other node's agent, for a fixed 300 s
that the command line cannot change. A node stopped (or cut off) after the ranks' last
collective would keep every other node's torchrun there. So the first rank of each node leaves
the same watcher when it exits 0, with ``--peer-timeout`` + :data:`AGENT_GRACE` seconds: the
ranks of all nodes end within moments of each other (their last step is one all-reduce), so an
agent still waiting that long later is waiting for a lost peer.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["AGENT_GRACE", "LOST_PEER", "AT_EXIT_BARRIER", "torchrun_agent", "stop_agent_later"]

#: seconds a torchrun agent may run on after one of its ranks lost a peer
AGENT_GRACE = 20.0

#: what the watcher says happened, for each of the two moments it is left behind
LOST_PEER = "after the rank lost its peer (with the c10d rendezvous it waits on the lost store)"
AT_EXIT_BARRIER = ("after this node's ranks ended well: at torchrun's exit barrier it waits for "
                   "the agents of the other nodes, and one stopped answering. The verdict above "
                   "stands")


def _start_time(pid: int) -> str | None:
    """Field 22 of ``/proc/PID/stat`` (when the process started), ``None`` if unreadable."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def torchrun_agent() -> tuple[int, str] | None:
    """``(pid, start time)`` of this process's parent when it is a torchrun agent (its command
    line runs ``torch.distributed.run`` or ``torchrun``), else ``None`` (Linux only)."""
    pid = os.getppid()
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    start = _start_time(pid)
    if pid <= 1 or start is None or not ("torch.distributed.run" in cmd or "torchrun" in cmd):
        return None
    return pid, start


def stop_agent_later(agent: tuple[int, str] | None, rank: int, grace: float = AGENT_GRACE,
                     why: str = LOST_PEER):
    """Leave the watcher of the module docstring behind for ``agent`` (from
    :func:`torchrun_agent`): ``grace`` seconds, ``why`` (:data:`LOST_PEER` or
    :data:`AT_EXIT_BARRIER`) in what it says; returns its Popen, or ``None`` without an agent."""
    if agent is None:
        return None
    try:
        return subprocess.Popen([sys.executable, "-I", str(Path(__file__).with_name("watcher.py")),
                                 str(agent[0]), agent[1], str(rank), str(grace), why],
                                stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    except OSError:
        return None
