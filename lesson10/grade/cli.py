"""``python -m lesson10 grade NOTEBOOK...``: the command line of the grader.

Exit status:
  0  every exercise of every notebook passed (or, with ``--fail-under PCT``, the score is
     at least PCT percent of the maximum);
  1  points were lost (a failed, missing, hung or crashed exercise, an unreadable or
     unknown notebook), or the score is under ``--fail-under``;
  2  the grader or its environment failed (a file given that does not exist, no Jupyter
     kernel or worker could start): the scores are not to be trusted.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import reports, sandbox, standin
from .notebook import Options, grade_notebook, helper_files

#: modules the judge imports before any notebook runs (the checks and their references):
#: what is on disk later does not matter
_JUDGE_MODULES = ("lesson10.checks", "lesson10.sim", "lesson10.layouts", "lesson10.cost")


def import_judge_modules() -> None:
    for name in _JUDGE_MODULES:
        mod = importlib.import_module(name)
        for info in pkgutil.walk_packages(getattr(mod, "__path__", []), prefix=name + "."):
            importlib.import_module(info.name)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m lesson10 grade",
        description="Grade submitted notebooks: each notebook's cells run in a bubblewrap "
                    "sandbox with a stand-in lesson10 (no course code); at each check cell a "
                    "judge outside runs the course's check on hidden cases, calling the "
                    "student's function in a fork of the notebook. Exit status: 0 all passed, "
                    "1 points lost, 2 the grader or the environment failed.")
    p.add_argument("notebooks", nargs="+", type=Path,
                   help="notebook files, e.g. submissions/*/*.ipynb (the parent folder names "
                        "the student)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--output", type=Path, help="also write the JSON report to this file")
    p.add_argument("--csv", type=Path, help="write one row per student to this CSV file")
    p.add_argument("--gradescope", type=Path, help="write Gradescope's results.json here")
    p.add_argument("--junit", type=Path, help="write JUnit XML (a testcase per exercise) here")
    p.add_argument("--markdown", type=Path, help="append the score table in Markdown here "
                                                 "(e.g. $GITHUB_STEP_SUMMARY)")
    p.add_argument("--fail-under", type=float, default=None, metavar="PCT",
                   help="exit 0 when the score is at least PCT %% of the maximum, else 1")
    p.add_argument("-j", "--jobs", type=int, default=1, help="notebooks graded in parallel")
    p.add_argument("--timeout", type=float, default=120,
                   help="seconds allowed per cell (default 120)")
    p.add_argument("--exercise-timeout", type=float, default=30,
                   help="seconds allowed per exercise while judged (default 30)")
    p.add_argument("--notebook-timeout", type=float, default=600,
                   help="seconds allowed per notebook, running and judging (default 600)")
    p.add_argument("--memory", type=float, default=4,
                   help="GiB of address space for each process that runs student code "
                        "(default 4)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the hidden cases (default: a secret one, printed in the JSON "
                        "report as 'seed'; pass it again to replay a grading run)")
    p.add_argument("--no-sandbox", action="store_true",
                   help="grade where bubblewrap cannot run (macOS, no user namespaces): the "
                        "cells then run as a plain child process, and every report says "
                        "'not sandboxed'")
    p.add_argument("--save-executed", type=Path, default=None, metavar="DIR",
                   help="write each graded notebook, with the outputs of the graded run (the "
                        "judge's verdict at each check cell), to DIR/<student>/")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.jobs < 1 or args.timeout <= 0 or args.exercise_timeout <= 0 or \
            args.notebook_timeout <= 0 or args.memory <= 0:
        print("grade: -j, --timeout, --exercise-timeout, --notebook-timeout and --memory must "
              "be positive", file=sys.stderr)
        return 2
    if args.fail_under is not None and not 0 <= args.fail_under <= 100:
        print("grade: --fail-under takes a percentage between 0 and 100", file=sys.stderr)
        return 2
    sandboxed = not args.no_sandbox
    if sandboxed:
        why = sandbox.probe()
        if why:
            print(f"grade: no sandbox: {why}.\nInstall bubblewrap, or grade with --no-sandbox "
                  f"(student code then runs unconfined, and every report says so).",
                  file=sys.stderr)
            return 2
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(8), "little")
    try:
        import_judge_modules()
        box_dir = Path(tempfile.mkdtemp(prefix="lesson10-standin-"))
        standin.write(box_dir / "box")
    except Exception as exc:  # noqa: BLE001 - the grader cannot work without them
        print(f"grade: cannot prepare the stand-in package: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 2
    memory = int(args.memory * 2**30)
    limits = sandbox.Limits(memory=memory, cpu=int(args.notebook_timeout) + 30)
    opts = Options(cell_timeout=args.timeout, exercise_timeout=args.exercise_timeout,
                   notebook_timeout=args.notebook_timeout, memory=memory,
                   save_executed=args.save_executed, sandboxed=sandboxed, seed=seed,
                   standin=box_dir / "box", limits=limits)

    # every file is read before any student code runs: no submission can change another
    contents, helpers = {}, {}
    for path in args.notebooks:
        try:
            contents[path] = path.read_bytes() if path.is_file() else None
        except OSError:
            contents[path] = None
        helpers[path] = helper_files(path) if contents[path] is not None else []

    def one(path: Path) -> dict:
        if not args.json:
            print(f"grading {path} ...", file=sys.stderr, flush=True)
        try:
            return grade_notebook(path, opts, content=contents[path], files=helpers[path])
        except Exception as exc:  # noqa: BLE001 - a grader bug: report it, go on
            from .notebook import _report
            return _report(path, None, ok=False, error=f"grader error: {type(exc).__name__}: {exc}",
                           sandboxed=sandboxed)

    try:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(one, args.notebooks))
    finally:
        for p in [box_dir, *box_dir.rglob("*")]:
            try:
                os.chmod(p, 0o755)
            except OSError:
                pass
        shutil.rmtree(box_dir, ignore_errors=True)

    doc = reports.summary(results)
    doc["seed"] = seed
    doc["sandboxed"] = sandboxed
    text = json.dumps(doc, indent=1) + "\n"
    if args.output:
        args.output.write_text(text, encoding="utf-8")
    if args.csv:
        args.csv.write_text(reports.class_csv(results), encoding="utf-8")
    if args.gradescope:
        args.gradescope.write_text(reports.gradescope(results), encoding="utf-8")
    if args.junit:
        args.junit.write_text(reports.junit(results), encoding="utf-8")
    if args.markdown:
        with open(args.markdown, "a", encoding="utf-8") as f:
            f.write(reports.markdown(results))
    print(text if args.json else reports.table(results), end="" if args.json else "\n")
    return exit_status(results, args.fail_under)


def exit_status(results: list[dict], fail_under: float | None = None) -> int:
    if not all(r["ok"] for r in results):
        return 2
    got = sum(r["points"] for r in results)
    total = sum(r["max_points"] for r in results)
    if fail_under is not None:
        return 0 if total > 0 and 100.0 * got / total >= fail_under else 1
    all_passed = all(e["passed"] for r in results for e in r["exercises"])
    return 0 if all_passed and total > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
