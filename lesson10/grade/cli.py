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
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import reports
from .notebook import Options, grade_notebook
from .sandbox import Package


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m lesson10 grade",
        description="Grade submitted notebooks: a judge calls each exercise's function in a "
                    "sandboxed worker on hidden cases and compares the results itself. Exit "
                    "status: 0 all passed, 1 points lost, 2 the grader or the environment failed.")
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
    p.add_argument("--no-execute", action="store_true",
                   help="judge only: skip running the notebook for its outputs (feedback)")
    p.add_argument("--save-executed", type=Path, default=None, metavar="DIR",
                   help="write each executed notebook, with its outputs, to DIR/<student>/")
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
    opts = Options(cell_timeout=args.timeout, exercise_timeout=args.exercise_timeout,
                   notebook_timeout=args.notebook_timeout, memory=int(args.memory * 2**30),
                   execute=not args.no_execute, save_executed=args.save_executed)
    try:
        package = Package()
    except Exception as exc:  # noqa: BLE001 - the grader cannot work without its snapshot
        print(f"grade: cannot snapshot the lesson10 package: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 2

    # every file is read before any student code runs: no submission can change another
    contents = {}
    for path in args.notebooks:
        try:
            contents[path] = path.read_bytes() if path.is_file() else None
        except OSError:
            contents[path] = None

    def one(path: Path) -> dict:
        if not args.json:
            print(f"grading {path} ...", file=sys.stderr, flush=True)
        try:
            if contents[path] is None:
                return grade_notebook(path, package, opts)      # reports "no such file"
            return grade_notebook(path, package, opts, content=contents[path])
        except Exception as exc:  # noqa: BLE001 - a grader bug: report it, go on
            from .notebook import _report
            return _report(path, None, ok=False, error=f"grader error: {type(exc).__name__}: {exc}")

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(one, args.notebooks))

    doc = reports.summary(results)
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
