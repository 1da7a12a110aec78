"""``python -m lesson10 grade NOTEBOOK...``: run submitted notebooks and score their checks.

Each notebook is executed top to bottom in a fresh Jupyter kernel (nbclient), with
errors allowed so that one failing cell does not hide the later exercises. Every
``check_<exercise>`` call in the kernel appends its outcome as a JSON line to the
file named by ``LESSON10_GRADE_FILE`` (see :mod:`lesson10.checks`); the grader
sets that variable for the kernel and reads the file afterwards.

The exercises a notebook *should* contain are the ``check_<exercise>(`` calls in
its code cells, so an exercise whose check never ran (deleted output, a crash
before it, a timeout) scores 0 with status "not run". When a check ran more than
once, its last outcome counts.

Output: a score table (or ``--json``), and the exit status: 0 when every exercise
passed, 1 when some did not, 2 when a notebook could not be read or run at all.

Grading executes the submitted code: run it in a sandbox (CI container), as you
would any untrusted code.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

import nbformat

from .checks import EXERCISES, GRADE_FILE_ENV

_CHECK_CALL = re.compile(r"\bcheck_([A-Za-z0-9_]+)\s*\(")


def expected_exercises(nb: nbformat.NotebookNode, name: str = "") -> list[str]:
    """Exercise ids the notebook is graded on, in the course's order.

    Every exercise of each course notebook that this one belongs to: the notebook whose
    id starts the file name (``01_sequence_parallel.ipynb``), and those of any
    ``check_<exercise>(`` call in its code cells. So deleting a check cell does not
    remove its points from the total.
    """
    called: list[str] = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for ex in _CHECK_CALL.findall(cell.source):
            if ex in EXERCISES and ex not in called:
                called.append(ex)
    stem = Path(name).stem
    books = {EXERCISES[ex].notebook for ex in called}
    books |= {e.notebook for e in EXERCISES.values() if stem and stem.startswith(e.notebook)}
    ordered = [ex for ex, e in EXERCISES.items() if e.notebook in books]
    return ordered + [ex for ex in called if ex not in ordered]


def _read_outcomes(path: Path) -> list[dict]:
    rows = []
    if not path.exists():
        return rows
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and row.get("exercise") in EXERCISES:
            rows.append(row)
    return rows


def grade_notebook(path, timeout: int = 300, kernel_name: str | None = None) -> dict:
    """Execute one notebook and return its report.

    ``{"notebook", "exercises": [{"exercise", "status", "passed", "points", "max_points",
    "message"}], "points", "max_points", "errors": [...], "ok"}``; ``ok`` is False when
    the notebook could not be read or the kernel could not run it to the end.
    """
    from nbclient import NotebookClient

    path = Path(path)
    report = {"notebook": str(path), "exercises": [], "points": 0, "max_points": 0,
              "errors": [], "ok": True}
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as exc:  # noqa: BLE001
        report["ok"] = False
        report["errors"].append(f"cannot read the notebook: {type(exc).__name__}: {exc}")
        return report
    expected = expected_exercises(nb, path.name)

    with tempfile.TemporaryDirectory(prefix="lesson10-grade-") as tmp:
        grade_file = Path(tmp) / "outcomes.jsonl"
        env = dict(os.environ, **{GRADE_FILE_ENV: str(grade_file), "MPLBACKEND": "Agg"})
        client = NotebookClient(
            nb, timeout=timeout, allow_errors=True,
            # the grader's own Python, whatever kernel the student saved the notebook with
            kernel_name=kernel_name or "python3",
            resources={"metadata": {"path": str(path.resolve().parent)}})
        try:
            client.execute(env=env)
        except Exception as exc:  # noqa: BLE001 - timeout, dead kernel, missing kernel
            report["ok"] = False
            report["errors"].append(f"execution stopped: {type(exc).__name__}: {str(exc)[:500]}")
        outcomes = _read_outcomes(grade_file)

    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error" and out.get("ename") != "CheckFailed":
                report["errors"].append(f"{out.get('ename')}: {str(out.get('evalue'))[:200]}")

    latest = {}
    for row in outcomes:
        latest[row["exercise"]] = row
    names = expected + [name for name in latest if name not in expected]
    for name in names:
        max_points = EXERCISES[name].points
        row = latest.get(name)
        if row is None:
            entry = {"exercise": name, "status": "not run", "passed": False, "points": 0,
                     "max_points": max_points, "message": "the check cell did not run"}
        else:
            passed = bool(row.get("passed"))
            entry = {"exercise": name, "status": str(row.get("status", "failed")),
                     "passed": passed, "points": max_points if passed else 0,
                     "max_points": max_points, "message": str(row.get("message", ""))}
        report["exercises"].append(entry)
    report["points"] = sum(e["points"] for e in report["exercises"])
    report["max_points"] = sum(e["max_points"] for e in report["exercises"])
    return report


def format_table(reports: list[dict]) -> str:
    # the path as given, so that submissions/alice/01.ipynb and submissions/bob/01.ipynb differ
    w = max([28] + [len(str(rep["notebook"])) for rep in reports])
    lines = [f"{'notebook':<{w}s} {'exercise':<20s} {'result':<14s} {'points':>7s}"]
    lines.append("-" * len(lines[0]))
    for rep in reports:
        name = str(rep["notebook"])
        if not rep["exercises"]:
            lines.append(f"{name:<{w}s} {'(no checks found)':<20s}")
        for e in rep["exercises"]:
            lines.append(f"{name:<{w}s} {e['exercise']:<20s} {e['status']:<14s} "
                         f"{e['points']:>3d}/{e['max_points']:<3d}")
        for err in rep["errors"][:3]:
            lines.append(f"{'':<{w}s} ! {err}")
    got = sum(r["points"] for r in reports)
    total = sum(r["max_points"] for r in reports)
    lines.append("-" * len(lines[0]))
    lines.append(f"{'total':<{w}s} {'':<20s} {'':<14s} {got:>3d}/{total:<3d}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lesson10 grade",
        description="Execute submitted notebooks and score their check cells. Exit status: "
                    "0 all exercises passed, 1 some did not, 2 a notebook could not be run.")
    parser.add_argument("notebooks", nargs="+", type=Path, help="notebook files (.ipynb)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--output", type=Path, help="also write the JSON report to this file")
    parser.add_argument("--timeout", type=int, default=300, help="seconds allowed per cell")
    parser.add_argument("--kernel", default=None,
                        help="Jupyter kernel to run the notebooks with (default: python3, i.e. "
                             "the Python running the grader; needs ipykernel)")
    args = parser.parse_args(argv)

    reports = []
    for path in args.notebooks:
        if not path.is_file():
            reports.append({"notebook": str(path), "exercises": [], "points": 0, "max_points": 0,
                            "errors": ["no such file"], "ok": False})
            continue
        if not args.json:
            print(f"grading {path} ...", file=sys.stderr)
        reports.append(grade_notebook(path, timeout=args.timeout, kernel_name=args.kernel))

    summary = {"notebooks": reports,
               "points": sum(r["points"] for r in reports),
               "max_points": sum(r["max_points"] for r in reports)}
    if args.output:
        args.output.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(summary, indent=1) if args.json else format_table(reports))
    if not all(r["ok"] for r in reports):
        return 2
    all_passed = all(e["passed"] for r in reports for e in r["exercises"])
    return 0 if all_passed and summary["max_points"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
