"""``python -m lesson10 grade NOTEBOOK...``: the command line of the grader.

A batch is planned before any student code runs (:mod:`.gradebook`): who each notebook's
student is (only from what the instructor names: :mod:`.identity`), which course notebook
it is, which of several copies is graded. A name given that stands for several students
(a ``--student-from`` match, a flat folder of several students' files) stops the grader
with status 2; two hand-ins that folder names would make one student are graded apart,
with a note in every output.

Exit status:
  0  every exercise of every notebook passed (or, with ``--fail-under PCT``, the score is
     at least PCT percent of the maximum), and no student misses a notebook;
  1  points were lost (a failed, missing, hung or crashed exercise, a notebook not handed
     in, an unreadable or unknown notebook), or the score is under ``--fail-under``;
  2  the grader or its environment failed (a file given that does not exist, no Jupyter
     kernel or worker could start, a name given for several students, ``--gradescope`` or
     ``--classroom`` on several students): the scores are not to be trusted.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ... import scheme
from . import lms, pipeline
from .request import DEFAULTS as D
from .request import Request


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
                        "its folder or zip relative to the batch's common parent (sec1/s01, "
                        "bob.zip: bob), never a folder inside a student's zip")
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
    p.add_argument("-j", "--jobs", type=int, default=D.jobs, help="notebooks graded in parallel")
    p.add_argument("--timeout", type=float, default=D.timeout,
                   help="seconds allowed per cell (default 120)")
    p.add_argument("--exercise-timeout", type=float, default=D.exercise_timeout,
                   help="seconds allowed per exercise while judged (default 30)")
    p.add_argument("--notebook-timeout", type=float, default=D.notebook_timeout,
                   help="seconds allowed per notebook, running and judging (default 600)")
    p.add_argument("--memory", type=float, default=D.memory,
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
    a.add_argument("--course", type=Path, default=None, metavar="FILE",
                   help="the course file: points, optional exercises, term, late defaults "
                        "(default: $LESSON10_COURSE, else the nearest course.toml from here up, "
                        "else the package's; see python -m lesson10 course)")
    a.add_argument("--overrides", type=Path, default=None, metavar="FILE",
                   help="overrides.csv: student,exercise,points,reason; each sets one "
                        "student's points for one exercise, shown with its reason everywhere")
    a.add_argument("--due", default=None, metavar="TIME",
                   help="the due time, ISO 8601 (2026-03-01T23:59; local time without a zone): "
                        "each row says which notebooks were late, from the student's hand-in "
                        "(the folder or zip of the class): Canvas' LATE_ mark in its name, a "
                        "time where --time-from says, else the file's (or its zip's) time")
    a.add_argument("--time-from", default=None, metavar="REGEX",
                   help="where the hand-in time is written in your class's layout: the group "
                        "named 'time' of REGEX's first match in the path up to the student's "
                        "hand-in, e.g. '_(?P<time>\\d{8}T\\d{4})$' (a time in a name counts "
                        "nowhere else)")
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
    a.add_argument("--export-dir", type=Path, default=D.export_dir, metavar="DIR",
                   help="where --export writes canvas-grades.csv / moodle-grades.csv "
                        "(default: the current folder)")
    a.add_argument("--assignment", default=D.assignment, metavar="NAME",
                   help="the assignment's column name in the LMS export (default lesson10)")


def _course(args: argparse.Namespace) -> None:
    """Pin the course file (``--course``, else the one in force here) and take the late
    policy's defaults from it where the command line gives none."""
    found = scheme.use(args.course)
    print(f"grade: course file {found.source} (maximum {found.maximum}, term {found.term})",
          file=sys.stderr)
    if args.due is None:
        args.due = found.late.due
    if args.late_penalty is None:
        args.late_penalty = found.late.penalty
    if args.late_cap is None and found.late.cap != 100:
        args.late_cap = found.late.cap
    args.latest_on_time = args.latest_on_time or found.late.latest_on_time


def main(argv: list[str] | None = None) -> int:
    """``python -m lesson10 grade ...``: the options as a :class:`Request`, graded by the
    pipeline; the exit status."""
    args = _parser().parse_args(argv)
    try:
        _course(args)
    except scheme.SchemeError as exc:
        print(f"grade: {exc}", file=sys.stderr)
        return 2
    return pipeline.run(Request.from_args(args))


if __name__ == "__main__":
    sys.exit(main())
