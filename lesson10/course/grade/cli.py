"""``python -m lesson10 grade NOTEBOOK...``: the command line of the grader.

A batch is planned before any student code runs (:mod:`.gradebook`): who each notebook's
student is, which course notebook it is, which of several copies is graded; a collision
(two students the keys cannot tell apart) stops the grader with status 2.

Exit status:
  0  every exercise of every notebook passed (or, with ``--fail-under PCT``, the score is
     at least PCT percent of the maximum), and no student misses a notebook;
  1  points were lost (a failed, missing, hung or crashed exercise, a notebook not handed
     in, an unreadable or unknown notebook), or the score is under ``--fail-under``;
  2  the grader or its environment failed (a file given that does not exist, no Jupyter
     kernel or worker could start, a collision of students, ``--gradescope`` or
     ``--classroom`` on several students): the scores are not to be trusted.
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
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import classroom, feedback, gradebook, reports, sandbox, standin
from .notebook import Options, executed_path, grade_notebook
from .submission_files import Helpers, helper_files, read_regular

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
                    "1 points lost or a notebook missing, 2 the grader or the environment "
                    "failed.")
    p.add_argument("notebooks", nargs="+", type=Path,
                   help="notebook files or folders (searched at any depth for *.ipynb), e.g. "
                        "submissions/ or submissions/*/*.ipynb. The student of a notebook is "
                        "its folder relative to the batch's common parent (sec1/s01)")
    who = p.add_argument_group("students")
    who.add_argument("--student", metavar="NAME", default=None,
                     help="the whole batch is one student's work (a repository, a Gradescope "
                          "submission): one notebook per course notebook is graded")
    who.add_argument("--student-from", metavar="REGEX", default=None,
                     help="the student is the group named 'student' of REGEX's first match in "
                          "the notebook's path as given, e.g. '(?P<student>[^/]+)_\\d\\d_' "
                          "for a flat folder of alice_01_....ipynb files")
    who.add_argument("--roster", type=Path, default=None, metavar="FILE",
                     help="the class: a CSV with a 'student' column, or one name a line. A "
                          "student on it with no notebook gets a row of 'missing'")
    out = p.add_argument_group("outputs")
    out.add_argument("--json", action="store_true", help="print the report as JSON")
    out.add_argument("--output", type=Path, help="also write the JSON report to this file")
    out.add_argument("--csv", type=Path, help="write one row per student to this CSV file "
                                              "(every course exercise, total, max, statuses)")
    out.add_argument("--classroom", type=Path, metavar="PATH",
                     help="write GitHub Classroom's runner results (JSON) for one student")
    out.add_argument("--gradescope", type=Path,
                     help="write Gradescope's results.json for one student")
    out.add_argument("--junit", type=Path, help="write JUnit XML (a testcase per exercise) here")
    out.add_argument("--markdown", type=Path, help="append the scores and the judge's messages "
                                                   "in Markdown here (e.g. $GITHUB_STEP_SUMMARY)")
    out.add_argument("--feedback", type=Path, metavar="DIR",
                     help="write DIR/<student>.md and .html: each exercise's points, the "
                          "judge's message and the hint")
    out.add_argument("--save-executed", type=Path, default=None, metavar="DIR",
                     help="write each graded notebook, with the outputs of the graded run (the "
                          "judge's verdict at each check cell), to DIR/<student>/")
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
                   help="seed of the hidden cases (default: a secret one, written into every "
                        "report as 'seed'; pass it again to replay a grading run exactly)")
    p.add_argument("--no-sandbox", action="store_true",
                   help="grade where bubblewrap cannot run (macOS, no user namespaces): the "
                        "cells then run as a plain child process, and every report says "
                        "'not sandboxed'")
    return p


def _helpers(plan: gradebook.Plan, contents: dict, student_from: str | None) -> dict:
    """Each graded notebook's helper modules: the student's own files beside it (in a
    folder several students share, the ones named after the student)."""
    sharing: dict[str, set[str]] = {}
    for it in plan.graded + list(plan.ignored.values()):
        sharing.setdefault(os.path.abspath(it.path.parent), set()).add(it.student)
    return {it.path: helper_files(it.path, student=it.student, student_from=student_from,
                                  sharing=sorted(sharing[os.path.abspath(it.path.parent)]))
            if contents.get(it.path) is not None else Helpers() for it in plan.graded}


def _fail(message: str) -> int:
    print(f"grade: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.jobs < 1 or args.timeout <= 0 or args.exercise_timeout <= 0 or \
            args.notebook_timeout <= 0 or args.memory <= 0:
        return _fail("-j, --timeout, --exercise-timeout, --notebook-timeout and --memory must "
                     "be positive")
    if args.fail_under is not None and not 0 <= args.fail_under <= 100:
        return _fail("--fail-under takes a percentage between 0 and 100")
    if args.student is not None and args.student_from is not None:
        return _fail("give --student or --student-from, not both")

    # every file is read before any student code runs: no submission can change another
    paths = gradebook.find_notebooks(args.notebooks)
    if not paths and args.student is None:
        return _fail("no notebook found in " + ", ".join(map(str, args.notebooks)))
    contents: dict[Path, bytes | None] = {}
    for path in paths:
        try:                                    # a link or a device is no notebook of theirs
            contents[path] = read_regular(path)
        except OSError:
            contents[path] = None
    try:
        roster = gradebook.read_roster(args.roster) if args.roster else None
        plan = gradebook.plan(paths, contents, student=args.student,
                              student_from=args.student_from, roster=roster)
    except (gradebook.PlanError, OSError) as exc:
        return _fail(str(exc))
    helpers = _helpers(plan, contents, args.student_from)
    for name in plan.not_on_roster():
        print(f"grade: warning: {name} is not on the roster", file=sys.stderr)
    for option in ("gradescope", "classroom"):
        if getattr(args, option) and len(plan.students) != 1:
            names = ", ".join(plan.students[:5]) + (", ..." if len(plan.students) > 5 else "")
            return _fail(f"--{option} writes one student's results, and this batch has "
                         f"{len(plan.students)} students ({names}); grade each student's "
                         f"notebooks on their own, or give --student NAME if they are one "
                         f"student's")

    sandboxed = not args.no_sandbox
    if sandboxed:
        why = sandbox.probe()
        if why:
            return _fail(f"no sandbox: {why}.\nInstall bubblewrap, or grade with --no-sandbox "
                         f"(student code then runs unconfined, and every report says so).")
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(8), "little")
    try:
        import_judge_modules()
        box_dir = Path(tempfile.mkdtemp(prefix="lesson10-standin-"))
        standin.write(box_dir / "box")
    except Exception as exc:  # noqa: BLE001 - the grader cannot work without them
        return _fail(f"cannot prepare the stand-in package: {type(exc).__name__}: {exc}")
    memory = int(args.memory * 2**30)
    limits = sandbox.Limits(memory=memory, cpu=int(args.notebook_timeout) + 30)
    opts = Options(cell_timeout=args.timeout, exercise_timeout=args.exercise_timeout,
                   notebook_timeout=args.notebook_timeout, memory=memory,
                   save_executed=args.save_executed, sandboxed=sandboxed, seed=seed,
                   standin=box_dir / "box", limits=limits)

    def one(item: gradebook.Item) -> dict:
        path = item.path
        if not args.json:
            print(f"grading {path} ({item.student}) ...", file=sys.stderr, flush=True)
        start = time.monotonic()
        try:
            rep = grade_notebook(path, opts, content=contents[path], files=helpers[path],
                                 student=item.student)
        except Exception as exc:  # noqa: BLE001 - a grader bug: report it, go on
            from .notebook import notebook_report
            rep = notebook_report(path, None, ok=False, error=f"grader error: {type(exc).__name__}: "
                                                      f"{exc}", sandboxed=sandboxed,
                          student=item.student)
        rep["seconds"] = round(time.monotonic() - start, 3)
        rep["seed"] = seed
        others = [str(p) for p, chosen in plan.ignored.items() if chosen is item]
        if others:                  # the rows, the feedback and Gradescope's output say so
            rep["ignored_copies"] = others
        return rep

    try:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(one, plan.graded))
    finally:
        for p in [box_dir, *box_dir.rglob("*")]:
            try:
                os.chmod(p, 0o755)
            except OSError:
                pass
        shutil.rmtree(box_dir, ignore_errors=True)
    return _write_outputs(args, plan, results, seed, sandboxed)


def _write_outputs(args, plan, results: list[dict], seed: int, sandboxed: bool) -> int:
    rows = gradebook.rows(results, plan)
    for row in rows:
        row["seed"] = seed
    doc = reports.summary(results, rows)
    doc["seed"] = seed
    doc["sandboxed"] = sandboxed
    text = json.dumps(doc, indent=1) + "\n"
    notes = [] if sandboxed else ["Not sandboxed: graded with --no-sandbox."]
    if args.output:
        args.output.write_text(text, encoding="utf-8")
    if args.csv:
        args.csv.write_text(reports.class_csv(results, rows, seed=seed), encoding="utf-8")
    if args.gradescope:
        args.gradescope.write_text(reports.gradescope(results, rows, seed=seed,
                                                      sandboxed=sandboxed, notes=notes),
                                   encoding="utf-8")
    if args.classroom:
        args.classroom.write_text(json.dumps(classroom.runner_results(
            results, rows, seed=seed, sandboxed=sandboxed), indent=1) + "\n", encoding="utf-8")
    if args.junit:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime())
        args.junit.write_text(reports.junit(results, rows, seed=seed, timestamp=stamp),
                              encoding="utf-8")
    if args.markdown:
        with open(args.markdown, "a", encoding="utf-8") as f:
            f.write(reports.markdown(results, rows, seed=seed, sandboxed=sandboxed))
    if args.feedback:
        feedback.write(args.feedback, rows, results, seed=seed, sandboxed=sandboxed)
    if args.save_executed:
        for rep in results:
            target = executed_path(args.save_executed, rep["student"], Path(rep["notebook"]))
            if target.is_file() and rep["exercises"]:
                try:
                    feedback.annotate_executed(target, rep, seed=seed)
                except Exception as exc:  # noqa: BLE001 - the grades are written already
                    print(f"grade: warning: cannot add the grade to {target}: {exc}",
                          file=sys.stderr)
    print(text if args.json else reports.table(results, rows, seed=seed),
          end="" if args.json else "\n")
    return exit_status(results, args.fail_under, students=rows)


def exit_status(results: list[dict], fail_under: float | None = None,
                students: list[dict] | None = None) -> int:
    """2 when any notebook's grading failed; with ``students`` (gradebook rows) 1 when any
    of them misses a notebook, and the score is theirs (missing notebooks at 0 of the
    course maximum); else 0 when every exercise passed (or the score reaches
    ``fail_under`` percent), 1 otherwise."""
    if not all(r["ok"] for r in results) or (students and not all(s["ok"] for s in students)):
        return 2
    if students is not None:
        if any(s["missing"] for s in students):
            return 1
        entries = [e for s in students for e in s["exercises"]]
    else:
        entries = [e for r in results for e in r["exercises"]]
    got = sum(e["points"] for e in entries)
    total = sum(e["max_points"] for e in entries)
    if fail_under is not None:
        return 0 if total > 0 and 100.0 * got / total >= fail_under else 1
    return 0 if total > 0 and all(e["passed"] for e in entries) else 1


if __name__ == "__main__":
    sys.exit(main())
