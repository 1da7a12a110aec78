"""``python -m lesson10 bench grade``: what grading costs next to running the notebooks once.

Two commands on the same notebooks (default: the five solution notebooks and the five
exercise notebooks, ``solutions/0[1-5]*.ipynb`` and ``notebooks/0[1-5]*.ipynb``), each run
as a subprocess:

* **grade**: ``python -m lesson10 grade NB... --json --timings -j 1`` (the sandbox, the cells, the
  judge);
* **nbclient**: every notebook executed once by nbclient in a fresh ``python3`` kernel,
  as ``jupyter nbconvert --execute`` does, one driver process for all of them.

Measured: CPU seconds, user + sys, of the command and all its children (the kernels, the
judge's forks), from :func:`resource.getrusage` ``RUSAGE_CHILDREN`` before and after each
run, and the wall time. What runs inside bubblewrap's PID namespace never reaches the
grader's ``RUSAGE_CHILDREN`` (bwrap does not wait for it), so each sandbox's runner reports
its own user + sys (itself and its waited forks) as ``sandbox_cpu_seconds`` in the JSON
report, and the grade's CPU is rusage + their sum. Where this process may make a cgroup
(v1 ``cpuacct`` or v2, as root), each command also runs in one of its own, and the cgroup's
total, which counts every process whatever its namespace, is shown beside as a check.

``--reps`` runs interleave the two (ABBA) so that a change in the load of a shared machine
hits both; the table shows medians and the ratio grade / nbclient of the CPU seconds (the
target is at most 1.2). Both run with ``MPLBACKEND=Agg``. Writes ``grade.md`` (the table)
and ``grade.csv`` (every run). No torch needed. A benchmark, not a test: on a busy machine
the numbers move.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from lesson10.bench.paths import RESULTS_DIR

__all__ = ["main", "measure", "default_notebooks", "TARGET"]

#: the issue's bound on CPU(grade) / CPU(nbclient)
TARGET = 1.2
_ROOT = Path(__file__).resolve().parents[2]

# executes each notebook given on the command line once, in a fresh python3 kernel
_NBCLIENT = """\
import os, sys
import nbformat
from nbclient import NotebookClient
timeout = float(sys.argv[1])
for path in sys.argv[2:]:
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, kernel_name="python3", timeout=timeout,
                   resources={"metadata": {"path": os.path.dirname(os.path.abspath(path))}}).execute()
    print("executed", path, flush=True)
"""


def default_notebooks(root: Path = _ROOT) -> list[Path]:
    """The five solution notebooks, then the five exercise notebooks."""
    return sorted((root / "solutions").glob("0[1-5]*.ipynb")) + \
        sorted((root / "notebooks").glob("0[1-5]*.ipynb"))


class CpuGroup:
    """A cgroup of its own for one command (v1 ``cpuacct`` or v2), or ``None`` from
    :meth:`make` where none can be made (not root, no cgroup file system)."""

    def __init__(self, path: Path, v2: bool):
        self.path, self.v2 = path, v2

    @classmethod
    def make(cls):
        for base, v2 in ((Path("/sys/fs/cgroup/cpuacct"), False), (Path("/sys/fs/cgroup/unified"), True),
                         (Path("/sys/fs/cgroup"), True)):
            probe = base / ("cpu.stat" if v2 else "cpuacct.usage")
            if not (base / "cgroup.procs").exists() or (v2 and not probe.exists() and
                                                        not (base / "cgroup.controllers").exists()):
                continue
            path = base / f"lesson10-bench-{uuid.uuid4().hex[:8]}"
            try:
                path.mkdir()
            except OSError:
                continue
            group = cls(path, v2)
            if group.seconds() is not None:
                return group
            group.remove()
        return None

    def enter(self) -> None:
        """In the child, before exec: move into the group (a preexec_fn)."""
        with open(self.path / "cgroup.procs", "w") as f:
            f.write(str(os.getpid()))

    def seconds(self):
        try:
            if self.v2:
                for line in (self.path / "cpu.stat").read_text().splitlines():
                    if line.startswith("usage_usec"):
                        return int(line.split()[1]) / 1e6
                return None
            return int((self.path / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            return None

    def remove(self) -> None:
        for _ in range(50):                     # its last processes may still be exiting
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def measure(cmd: list[str], env: dict, cwd: Path, timeout: float, cgroup: bool = True) -> dict:
    """Run ``cmd`` to the end; its CPU seconds (children included), wall seconds, exit
    status and output; ``cgroup_cpu``: the seconds its cgroup counted (None: no cgroup)."""
    group = CpuGroup.make() if cgroup else None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                rc = subprocess.run(cmd, env=env, cwd=cwd, stdout=out, stderr=err,
                                    stdin=subprocess.DEVNULL, timeout=timeout,
                                    preexec_fn=group.enter if group else None).returncode
            except subprocess.TimeoutExpired:
                rc = None
            wall = time.perf_counter() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
        cg = group.seconds() if group else None
    finally:
        if group:
            group.remove()
    user, sys_ = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    return {"user": user, "sys": sys_, "sandbox": 0.0, "cpu": user + sys_, "cgroup_cpu": cg,
            "wall": wall, "rc": rc, "stdout": stdout, "stderr": stderr}


def _grade_cmd(paths, jobs: int, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "lesson10", "grade", *map(str, paths), "--json", "--timings",
            "--no-results", "-j", str(jobs), *extra]


def _grade_result(run: dict) -> str:
    """``"P/M points"`` from the grader's JSON, and the sandboxes' own CPU seconds added to
    the run's; raises when the grader itself failed."""
    if run["rc"] not in (0, 1):
        why = "timed out" if run["rc"] is None else f"exit status {run['rc']}"
        raise RuntimeError(f"the grader failed ({why}): the benchmark would time a broken run\n"
                           f"{run['stderr'][-2000:]}{run['stdout'][-2000:]}")
    doc = json.loads(run["stdout"])
    run["sandbox"] = sum(float(nb.get("sandbox_cpu_seconds") or 0) for nb in doc["notebooks"])
    run["cpu"] += run["sandbox"]
    return f"{doc['points']}/{doc['max_points']} points"


def _nbclient_result(run: dict, n: int) -> str:
    if run["rc"] != 0:
        why = "timed out" if run["rc"] is None else f"exit status {run['rc']}"
        raise RuntimeError(f"nbclient could not execute the notebooks ({why})\n{run['stderr'][-3000:]}")
    return f"{n} notebook{'s' if n > 1 else ''} executed"


def _md_table(header, rows) -> str:
    """The markdown table of :func:`lesson10.bench.harness.md_table` (that module needs torch)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def _versions() -> str:
    parts = [f"Python {platform.python_version()}"]
    for mod in ("numpy", "IPython", "nbclient"):
        try:
            parts.append(f"{mod} {__import__(mod).__version__}")
        except ImportError:
            pass
    bwrap = shutil.which("bwrap")
    if bwrap:
        v = subprocess.run([bwrap, "--version"], capture_output=True, text=True).stdout.strip()
        parts.append(v or "bwrap")
    return ", ".join(parts)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lesson10 bench grade",
                                description="CPU seconds of grading vs executing the notebooks "
                                            "once with nbclient")
    p.add_argument("--notebooks", nargs="+", type=Path, default=None,
                   help="notebooks to grade and execute (default: solutions/0[1-5]*.ipynb and "
                        "notebooks/0[1-5]*.ipynb)")
    p.add_argument("--reps", type=int, default=1, help="runs of each command (medians are shown)")
    p.add_argument("-j", "--jobs", type=int, default=1, help="the grader's -j (default 1)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds allowed per command")
    p.add_argument("--no-sandbox", action="store_true",
                   help="pass --no-sandbox to the grader (a machine without bubblewrap)")
    p.add_argument("--out", default=str(RESULTS_DIR), help="folder for grade.md and grade.csv")
    return p


def main(argv=None) -> int:
    """Time both commands, print the table, write ``grade.md`` and ``grade.csv``."""
    p = _parser()
    args = p.parse_args(argv)
    if args.reps < 1 or args.jobs < 1 or args.timeout <= 0:
        p.error("--reps, -j and --timeout must be positive")
    paths = [x.resolve() for x in (args.notebooks or default_notebooks())]
    missing = [str(x) for x in paths if not x.is_file()]
    if not paths or missing:
        p.error(f"no such notebook: {', '.join(missing) or '(none given)'}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    runs = _run_all(args, paths)
    if runs is None:
        return 1
    lines = _report(args, paths, runs, load)
    _write(Path(args.out), lines, runs)
    return 0


def _run_all(args, paths: list[Path]) -> list[dict] | None:
    """Each command ``--reps`` times, interleaved; None when a run's result is unreadable."""
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONUNBUFFERED="1")
    extra = ["--no-sandbox"] if args.no_sandbox else []
    commands = {
        "grade": (_grade_cmd(paths, args.jobs, extra), _grade_result),
        "nbclient": ([sys.executable, "-c", _NBCLIENT, str(args.timeout), *map(str, paths)],
                     lambda run: _nbclient_result(run, len(paths))),
    }
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-grade-") as cwd:
        for rep in range(args.reps):
            order = ["nbclient", "grade"] if rep % 2 == 0 else ["grade", "nbclient"]
            for what in order:
                cmd, result = commands[what]
                print(f"rep {rep + 1}/{args.reps}: {what} on {len(paths)} notebooks ...",
                      file=sys.stderr, flush=True)
                run = measure(cmd, env, Path(cwd), args.timeout)
                try:
                    run.update(rep=rep + 1, what=what, result=result(run))
                except (RuntimeError, ValueError, KeyError) as exc:
                    print(f"bench grade: {exc}", file=sys.stderr)
                    return None
                runs.append(run)
    return runs


def _report(args, paths: list[Path], runs: list[dict], load: float) -> list[str]:
    """The markdown lines of ``grade.md``."""
    def med(what, key):
        vals = [r[key] for r in runs if r["what"] == what]
        return None if None in vals else statistics.median(vals)

    def sec(x):
        return "n/a" if x is None else f"{x:.1f}"

    ratio = med("grade", "cpu") / med("nbclient", "cpu")
    label = {"grade": f"grade (`python -m lesson10 grade --json -j {args.jobs}"
                      f"{' --no-sandbox' if args.no_sandbox else ''}`)",
             "nbclient": "nbclient (a fresh python3 kernel per notebook)"}
    rows = [[label[w], sec(med(w, "user")), sec(med(w, "sys")), sec(med(w, "sandbox")),
             sec(med(w, "cpu")), sec(med(w, "cgroup_cpu")), sec(med(w, "wall")),
             next(r["result"] for r in runs if r["what"] == w)]
            for w in ("grade", "nbclient")]
    cg = (med("grade", "cgroup_cpu") / med("nbclient", "cgroup_cpu")
          if med("grade", "cgroup_cpu") and med("nbclient", "cgroup_cpu") else None)
    try:
        shown = [str(x.relative_to(_ROOT)) for x in paths]
    except ValueError:
        shown = [str(x) for x in paths]
    lines = [
        "# Grading cost: the grader vs one nbclient run", "",
        f"{len(paths)} notebook{'s' if len(paths) > 1 else ''}: {', '.join(shown)}.", "",
        "CPU = user + sys seconds of the command and every child it waited for (kernels, the "
        "judge's forks), from `getrusage(RUSAGE_CHILDREN)`, plus *sandbox*: what the runners "
        "inside bubblewrap's PID namespace report they used (`sandbox_cpu_seconds` in the "
        "grader's JSON; bwrap passes no rusage on). *cgroup*: the same command's total as "
        "counted by a cgroup of its own (every process, whatever its namespace; n/a where none "
        f"can be made). Median of {args.reps} run{'s' if args.reps > 1 else ''} each, "
        "interleaved; `MPLBACKEND=Agg`.", "",
        _md_table(["command", "user (s)", "sys (s)", "sandbox (s)", "CPU (s)", "cgroup (s)",
                   "wall (s)", "result"], rows), "",
        f"CPU ratio grade / nbclient: **{ratio:.2f}** (target <= {TARGET}: "
        f"{'yes' if ratio <= TARGET else 'no'})"
        + (f"; by the cgroups {cg:.2f}" if cg else "")
        + f"; wall ratio {med('grade', 'wall') / med('nbclient', 'wall'):.2f}.", "",
        f"{_versions()}; {os.cpu_count()} CPUs, load average {load:.2f} at the start; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
    ]
    return lines


def _write(out_dir: Path, lines: list[str], runs: list[dict]) -> None:
    """``grade.md`` and ``grade.csv`` in ``out_dir``; the table printed."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md = out_dir / "grade.md"
    md.write_text("\n".join(lines) + "\n")
    with open(out_dir / "grade.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["rep", "command", "user_s", "sys_s", "sandbox_s", "cpu_s", "cgroup_s", "wall_s",
                    "exit_status", "result"])
        for r in runs:
            w.writerow([r["rep"], r["what"], f"{r['user']:.3f}", f"{r['sys']:.3f}",
                        f"{r['sandbox']:.3f}", f"{r['cpu']:.3f}",
                        "" if r["cgroup_cpu"] is None else f"{r['cgroup_cpu']:.3f}",
                        f"{r['wall']:.3f}", r["rc"], r["result"]])
    print("\n".join(lines))
    print(f"wrote {md} and {out_dir / 'grade.csv'}")


if __name__ == "__main__":
    raise SystemExit(main())
