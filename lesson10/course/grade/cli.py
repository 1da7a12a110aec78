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
import os
import pkgutil
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from . import adjust, archives, gradebook, late, lms, nbread, outputs, overrides, sandbox, standin, store
from .config import GradeConfig
from .notebook import grade_notebook
from .submission_files import Helpers, helper_files

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
    p.add_argument("notebooks", nargs="*", type=Path,
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
    _output_args(p)
    _adjust_args(p)
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
                   help="seed of the hidden cases (default: a new secret one for each run, "
                        "written into the instructor's reports as 'seed', never into the "
                        "students' feedback; a run that stopped is resumed with its own). "
                        "Pass it again to replay a grading run exactly")
    p.add_argument("--replay", action="store_true",
                   help="grade with the seed the results folder keeps (the same cases as "
                        "before) instead of a new one; without it, a changed file (a "
                        "resubmission) meets new cases")
    p.add_argument("--new-cases", action="store_true",
                   help="grade every file again with a new secret seed, unchanged ones too "
                        "(without it, a file unchanged since its stored verdict keeps it)")
    p.add_argument("--no-sandbox", action="store_true",
                   help="grade where bubblewrap cannot run (macOS, no user namespaces): the "
                        "cells then run as a plain child process, and every report says "
                        "'not sandboxed'")
    return p


def _helpers(plan: gradebook.Plan, contents: dict, student_from: str | None,
             real: dict | None = None) -> dict:
    """Each graded notebook's helper modules: the student's own files beside it (in a
    folder several students share, the ones named after the student); ``real``: shown
    path -> the file on disk (a notebook unpacked from a zip)."""
    def folder(it) -> str:
        return os.path.dirname(os.path.abspath((real or {}).get(it.path, it.path)))

    sharing: dict[str, set[str]] = {}
    for it in plan.graded + list(plan.ignored.values()):
        sharing.setdefault(folder(it), set()).add(it.student)
    return {it.path: helper_files(Path((real or {}).get(it.path, it.path)), student=it.student,
                                  student_from=student_from, sharing=sorted(sharing[folder(it)]))
            if contents.get(it.path) is not None else Helpers() for it in plan.graded}


def _output_args(p: argparse.ArgumentParser) -> None:
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
    out.add_argument("--report", type=Path, metavar="DIR",
                     help="write the class report here: class-report.html (plots) and "
                          "class-report.md (see python -m lesson10 report)")
    out.add_argument("--timings", action="store_true",
                     help="keep each notebook's and exercise's seconds in --json/--output")
    res = p.add_argument_group("results (nothing lost)")
    res.add_argument("--resume", "--results", dest="results", type=Path, metavar="DIR",
                     default=None,
                     help="the results folder: each notebook's result is written there as "
                          "soon as it is known, and what is there already is not graded "
                          "again (default, for a class: lesson10-results/ beside --output, "
                          "--csv, --feedback or --report). With no NOTEBOOK, the outputs are "
                          "written from the folder alone")
    res.add_argument("--no-results", action="store_true",
                     help="keep no results folder (grade everything, keep nothing)")


def _adjust_args(p: argparse.ArgumentParser) -> None:
    """The instructor's adjustments (README "Overrides, late work and LMS exports")."""
    a = p.add_argument_group("overrides, late work, LMS exports")
    a.add_argument("--overrides", type=Path, default=None, metavar="FILE",
                   help="overrides.csv: student,exercise,points,reason; each sets one "
                        "student's points for one exercise, shown with its reason everywhere")
    a.add_argument("--due", default=None, metavar="TIME",
                   help="the due time, ISO 8601 (2026-03-01T23:59; local time without a zone): "
                        "each row says which notebooks were late (Canvas' LATE_ mark, a time "
                        "in the file name, else the file's time)")
    a.add_argument("--late-penalty", default=None, metavar="PCT/UNIT",
                   help="what lateness costs: PCT %% of the notebook's points per day or hour "
                        "or part of one, e.g. 10/day or 2/hour (default: nothing)")
    a.add_argument("--late-cap", type=float, default=None, metavar="PCT",
                   help="the most a late notebook loses, in %% of its points (default 100)")
    a.add_argument("--latest-on-time", action="store_true",
                   help="of a student's copies of a notebook, grade the latest one handed in "
                        "on time")
    a.add_argument("--extensions", type=Path, default=None, metavar="FILE",
                   help="a CSV student,extension (a time, or a length: 2d, 36h); the roster's "
                        "'extension' or 'due' column is read too")
    a.add_argument("--export", action="append", choices=lms.FORMATS, default=[],
                   help="write an LMS gradebook import file keyed by the roster (canvas: "
                        "sis_id; moodle: email) into --export-dir; needs --roster")
    a.add_argument("--export-dir", type=Path, default=Path("."), metavar="DIR",
                   help="where --export writes canvas-grades.csv / moodle-grades.csv "
                        "(default: the current folder)")
    a.add_argument("--assignment", default="lesson10", metavar="NAME",
                   help="the assignment's column name in the LMS export (default lesson10)")


def _adjustments(args, box) -> str | None:
    """``args.adjust``: the adjustments of the options on top of those the results folder
    keeps; the problem as one line, or None."""
    try:
        args.adjust = adjust.from_args(args, adjust.load(box.folder) if box is not None
                                       else None)
        lms.check(args.export, args.roster)
    except (overrides.OverrideError, late.LateError, lms.ExportError) as exc:
        return str(exc)
    return None


def _fail(message: str) -> int:
    print(f"grade: {message}", file=sys.stderr)
    return 2


def _validate(args) -> str | None:
    if args.jobs < 1 or args.timeout <= 0 or args.exercise_timeout <= 0 or \
            args.notebook_timeout <= 0 or args.memory <= 0:
        return ("-j, --timeout, --exercise-timeout, --notebook-timeout and --memory must "
                "be positive")
    if args.fail_under is not None and not 0 <= args.fail_under <= 100:
        return "--fail-under takes a percentage between 0 and 100"
    if args.student is not None and args.student_from is not None:
        return "give --student or --student-from, not both"
    if not args.notebooks and args.results is None:
        return "give the notebooks to grade (files or folders), or --resume DIR"
    if args.results is not None and args.no_results:
        return "give --resume DIR or --no-results, not both"
    return outputs.check(args)


def _results_store(args) -> store.Store | None:
    """The results folder: ``--resume DIR``; for a class (no ``--student``) with a class
    output, ``lesson10-results/`` beside the first of them; else none."""
    if args.no_results:
        return None
    if args.results is not None:
        return store.Store(args.results)
    if args.student is not None:
        return None
    for name in ("output", "csv", "feedback", "report"):
        path = getattr(args, name)
        if path is not None:
            return store.Store(Path(path).resolve().parent / "lesson10-results")
    return None


def verdict_limits(args) -> dict:
    """The options that change a verdict: part of each results key (:func:`store.key`)."""
    return {"cell_timeout": args.timeout, "exercise_timeout": args.exercise_timeout,
            "notebook_timeout": args.notebook_timeout, "memory_gib": args.memory,
            "sandboxed": not args.no_sandbox}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    problem = _validate(args)
    if problem:
        return _fail(problem)
    box = _results_store(args)
    try:
        if box is not None:
            box.prepare()
        seed = store.choose_seed(box, args.seed, args.replay)
    except (store.StoreError, OSError) as exc:
        return _fail(str(exc))
    problem = _adjustments(args, box)
    if problem:
        return _fail(problem)
    old = box.load_class() if box is not None else None
    if not args.notebooks:                       # the outputs of a results folder alone
        if old is None:
            return _fail(f"{args.results} holds no graded class (no class.json)")
        reports_all, plan_all = store.load(old, box)  # type: ignore[arg-type]
        adjust.save(box.folder, args.adjust)  # type: ignore[union-attr]
        rows = outputs.write(args, plan_all, reports_all, old.get("seed", seed), all(
            r.get("sandboxed", True) for r in reports_all))
        return exit_status(reports_all, args.fail_under, students=rows)

    with tempfile.TemporaryDirectory(prefix="lesson10-zips-") as unzipped:
        return _batch(args, box, seed, old, Path(unzipped))


def _batch(args, box, seed: int, old, unzipped: Path) -> int:
    """Grade the files named on the command line (zips unpacked into ``unzipped``) and
    write every output; the exit status."""
    # every file is read before any student code runs: no submission can change another
    found = archives.gather(args.notebooks, unzipped, nbread.MAX_NOTEBOOK_BYTES)
    paths, others, contents = found.paths, found.others, found.contents
    if not paths and args.student is None:
        return _fail("no notebook found in " + ", ".join(map(str, args.notebooks)))
    try:
        plan = _plan(args, paths, contents, others, old, found)
    except (gradebook.PlanError, OSError) as exc:
        return _fail(str(exc))
    adjust.note_times(args.adjust, paths)
    late.choose_on_time(plan, args.adjust.policy, args.adjust.times)
    helpers = _helpers(plan, contents, args.student_from, found.real)
    keys = {it.path: store.key(contents[it.path], helpers[it.path], seed=seed,
                               notebook=it.notebook, limits=verdict_limits(args)) for it in plan.graded}
    limits = verdict_limits(args)
    seeds = store.keep_unchanged(old, box, plan.graded, keys, seed, lambda it, s: store.key(
        contents[it.path], helpers[it.path], seed=s, notebook=it.notebook, limits=limits),
        fixed=args.seed is not None or args.new_cases)
    sandboxed = not args.no_sandbox
    try:
        results = _grade(args, plan, contents, helpers, keys, box, seed, found.real, seeds)
    except _SetupError as exc:
        return _fail(str(exc))
    if box is None:
        rows = outputs.write(args, plan, results, seed, sandboxed)
        return exit_status(results, args.fail_under, students=rows)
    root = _root(paths, others, old)
    doc = store.merge(old, store.class_doc(plan, keys, seed=seed, root=root, seeds=seeds))
    box.save_class(doc)
    box.end()
    adjust.save(box.folder, args.adjust)
    reports_all, plan_all = store.load(doc, box)
    rows = outputs.write(args, plan_all, reports_all, seed, sandboxed, batch=(plan, results))
    return exit_status(reports_all, args.fail_under, students=rows)


def _plan(args, paths, contents, others, old, found=None) -> gradebook.Plan:
    """Who handed in what (a results folder's roster and class folder where it has them);
    raises PlanError for a batch that cannot be graded as asked."""
    roster = gradebook.read_roster(args.roster) if args.roster else None
    if roster is None and old is not None and args.student is None:
        roster = old.get("roster")
    plan = gradebook.plan(paths, contents, student=args.student,
                          student_from=args.student_from, roster=roster, others=others,
                          base=old.get("root") if old is not None else None,
                          anchors=found.unpacked.zips if found is not None else (),
                          notes=found.unpacked.refused if found is not None else None,
                          real=found.real if found is not None else None,
                          named=found.unpacked.named if found is not None else ())
    for name in plan.not_on_roster():
        print(f"grade: warning: {name} is not on the roster", file=sys.stderr)
    for option in ("gradescope", "classroom"):
        if getattr(args, option) and len(plan.students) != 1:
            names = ", ".join(plan.students[:5]) + (", ..." if len(plan.students) > 5 else "")
            raise gradebook.PlanError(
                f"--{option} writes one student's results, and this batch has "
                f"{len(plan.students)} students ({names}); grade each student's notebooks on "
                f"their own, or give --student NAME if they are one student's")
    return plan


def _root(paths, others, old) -> str:
    """The class's folder: where student names are taken from when some of it is graded
    again (the stored one, while every path is under it)."""
    folders = [os.path.dirname(os.path.abspath(p)) for p in list(paths) + list(others)]
    if old is not None and old.get("root") and all(
            f == old["root"] or f.startswith(old["root"] + os.sep) for f in folders):
        return old["root"]
    return os.path.commonpath(folders) if folders else ""


class _SetupError(Exception):
    """The grader cannot start (no sandbox, no stand-in)."""


def _options(args, seed: int) -> tuple[GradeConfig, Path]:
    sandboxed = not args.no_sandbox
    if sandboxed:
        why = sandbox.probe()
        if why:
            raise _SetupError(f"no sandbox: {why}.\nInstall bubblewrap, or grade with "
                              f"--no-sandbox (student code then runs unconfined, and every "
                              f"report says so).")
    try:
        import_judge_modules()
        box_dir = Path(tempfile.mkdtemp(prefix="lesson10-standin-"))
        standin.write_all(box_dir)
    except Exception as exc:  # noqa: BLE001 - the grader cannot work without them
        raise _SetupError(f"cannot prepare the stand-in package: {type(exc).__name__}: "
                          f"{exc}") from None
    memory = int(args.memory * 2**30)
    limits = sandbox.Limits(memory=memory, cpu=int(args.notebook_timeout) + 30)
    opts = GradeConfig(cell_timeout=args.timeout, exercise_timeout=args.exercise_timeout,
                       notebook_timeout=args.notebook_timeout, save_executed=args.save_executed,
                       sandboxed=sandboxed, seed=seed, standin=box_dir / standin.GENERAL,
                       limits=limits)
    return opts, box_dir


def _grade(args, plan, contents, helpers, keys, box, seed, real=None, seeds=None) -> list[dict]:
    """Each graded file's report, in the plan's order: the stored one where the results
    folder has it, else graded now and stored at once."""
    stored = {it.path: box.get(keys[it.path]) if box is not None else None
              for it in plan.graded}
    todo = [it for it in plan.graded if stored[it.path] is None]
    if box is not None:
        box.begin(seed)
        if len(todo) < len(plan.graded):
            print(f"grade: {len(plan.graded) - len(todo)} of {len(plan.graded)} notebooks "
                  f"already graded in {box.folder}", file=sys.stderr)
    fresh: dict = {}
    save = (lambda it, rep: box.put(keys[it.path], rep)) if box is not None else None
    first = _firsts(todo, contents, keys)
    unique = [it for it in todo if first.get(it.path, it) is it]
    if unique:
        opts, box_dir = _options(args, seed)
        try:
            with ThreadPoolExecutor(max_workers=args.jobs) as pool:
                for it, rep in zip(unique, pool.map(lambda it: _one(args, opts, it, contents,
                                                                    helpers, save, real), unique)):
                    fresh[it.path] = rep
        finally:
            _remove(box_dir)
    for it in todo:
        if it.path not in fresh:
            fresh[it.path] = _same_as(args, first[it.path], fresh[first[it.path].path], it, seed)
    out = []
    for it in plan.graded:
        copies = [p for p, chosen in plan.ignored.items() if chosen is it]
        out.append(store.finish(stored[it.path] or fresh[it.path], it.student, str(it.path),
                                (seeds or {}).get(it.path, seed), copies))
    if box is not None:
        print(f"grade: results in {box.folder} (the same command, or --resume "
              f"{box.folder}, grades only what is not there)", file=sys.stderr)
    return out


def _firsts(todo: list, contents: dict, keys: dict) -> dict:
    """``path -> the item graded for it``: of byte-identical files (the same results key:
    bytes, helpers, notebook, seed, limits) the first is graded, once for all of them."""
    seen: dict[str, gradebook.Item] = {}
    out = {}
    for it in todo:
        if contents.get(it.path) is not None:
            out[it.path] = seen.setdefault(keys[it.path], it)
    return out


def _same_as(args, graded: gradebook.Item, rep: dict, item: gradebook.Item, seed: int) -> dict:
    """The report of ``item``, a file identical to ``graded``: its verdicts, its student and
    path (and, with --save-executed, its own executed copy)."""
    out = {**rep, "student": item.student, "notebook": str(item.path)}
    if args.save_executed:
        from .notebook import executed_path
        src = executed_path(args.save_executed, graded.student, graded.path)
        dst = executed_path(args.save_executed, item.student, item.path)
        if src.is_file() and src != dst:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
    return out


def _one(args, opts: GradeConfig, item: gradebook.Item, contents, helpers, save=None,
         real=None) -> dict:
    """Grade one file (read from ``real[path]``, the file on disk, when it came from a zip);
    its report goes to the results folder as soon as it is known."""
    path = item.path
    if not args.json:
        print(f"grading {path} ({item.student}) ...", file=sys.stderr, flush=True)
    start = time.monotonic()
    mine = replace(opts, standin=opts.standin.parent / standin.folder_for(item.notebook)) \
        if opts.standin is not None else opts
    try:
        rep = grade_notebook(Path((real or {}).get(path, path)), mine, content=contents[path],
                             files=helpers[path], student=item.student)
        rep["notebook"] = str(path)
    except Exception as exc:  # noqa: BLE001 - a grader bug: report it, go on
        from .notebook import notebook_report
        # the plan knows which notebook it is: its row says "grader error" once, not
        # "not a course notebook" and "missing"
        rep = notebook_report(path, item.notebook, ok=False, sandboxed=opts.sandboxed,
                              error=f"grader error: {type(exc).__name__}: {exc}",
                              student=item.student)
    rep["seconds"] = round(time.monotonic() - start, 3)
    if save is not None and rep.get("ok"):        # a grader error is graded again on resume
        save(item, rep)
    if args.save_executed:
        outputs.annotate(args.save_executed, rep, opts.seed)
    return rep


def _remove(box_dir: Path) -> None:
    for p in [box_dir, *box_dir.rglob("*")]:
        try:
            os.chmod(p, 0o755)
        except OSError:
            pass
    shutil.rmtree(box_dir, ignore_errors=True)


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
