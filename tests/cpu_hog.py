"""Run a command while other processes keep the CPUs busy: ``make test-loaded``'s load.

    python tests/cpu_hog.py [--cpus N] -- COMMAND ...

starts N busy-looping processes (default: every CPU this process may run on), runs COMMAND,
then kills the hogs, whatever happens: the command fails, this script is interrupted
(SIGINT, SIGTERM, SIGHUP) or even killed (each hog checks every ~0.1 s that its parent is
still this script, and leaves when it is not). The exit status is COMMAND's.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time


def _spin(parent: int) -> None:
    """Busy loop until the parent that started it is gone."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    while os.getppid() == parent:
        for _ in range(200_000):
            pass


def _stop(signum, frame):
    raise SystemExit(128 + signum)


def hogs(n: int) -> list:
    """``n`` busy processes (a fork each: no import of the caller's modules)."""
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_spin, args=(os.getpid(),), daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    return procs


def stop(procs: list) -> None:
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(10)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpus", type=int, default=len(os.sched_getaffinity(0)),
                   help="busy processes to start (default: this machine's CPUs)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    args = p.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd or args.cpus < 1:
        p.error("give --cpus >= 1 and a command after --, e.g. -- make test-slow")
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop)
    procs = hogs(args.cpus)
    start = time.monotonic()
    rc = 1
    try:
        print(f"cpu_hog: {args.cpus} busy processes beside: {' '.join(cmd)}", flush=True)
        rc = subprocess.call(cmd)
    except KeyboardInterrupt:
        rc = 130
    finally:
        stop(procs)
        print(f"cpu_hog: the command took {time.monotonic() - start:.0f} s under load "
              f"(exit status {rc}); the {len(procs)} busy processes are stopped", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
