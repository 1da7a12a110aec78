"""What one grading run is asked to do: the files, who they belong to, which outputs, the
limits. The command line (:mod:`.cli`) parses its options into a :class:`Request`; anything
else that grades (Gradescope's ``run_autograder``, a test, a script) builds one directly
and hands it to :func:`lesson10.course.grade.pipeline.run`::

    from lesson10.course.grade.pipeline import run
    from lesson10.course.grade.request import Request
    status = run(Request(notebooks=(Path("submissions"),), csv=Path("class.csv")))

Each field is the command-line option of the same name (``exercise_timeout`` is
``--exercise-timeout``); its default here is the command line's default.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Request:
    """One grading run's request (see the module); frozen: the pipeline makes a new one
    when it adds the adjustments it read (``adjust``)."""
    notebooks: tuple[Path, ...] = ()
    # students
    student: str | None = None
    student_from: str | None = None
    roster: Path | None = None
    # outputs
    json: bool = False
    output: Path | None = None
    csv: Path | None = None
    classroom: Path | None = None
    gradescope: Path | None = None
    junit: Path | None = None
    markdown: Path | None = None
    feedback: Path | None = None
    save_executed: Path | None = None
    report: Path | None = None
    timings: bool = False
    # the results folder
    results: Path | None = None
    no_results: bool = False
    # the course file (pinned by the command line before the pipeline runs), overrides, late
    # work, LMS exports
    course: Path | None = None
    overrides: Path | None = None
    due: str | None = None
    time_from: str | None = None
    late_penalty: str | None = None
    late_cap: float | None = None
    latest_on_time: bool = False
    extensions: Path | None = None
    export: tuple[str, ...] = ()
    export_dir: Path = Path(".")
    assignment: str = "lesson10"
    # the verdicts and their limits
    fail_under: float | None = None
    jobs: int = 1
    timeout: float = 120.0
    exercise_timeout: float = 30.0
    notebook_timeout: float = 600.0
    memory: float = 4.0
    seed: int | None = None
    replay: bool = False
    new_cases: bool = False
    no_sandbox: bool = False
    #: the instructor's adjustments (:class:`.adjust.Adjustments`), read by the pipeline
    adjust: Any = field(default=None, compare=False)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Request:
        """The request of the parsed command line (every field an option of it)."""
        given = {f.name: getattr(args, f.name) for f in fields(cls) if f.name != "adjust"}
        given["notebooks"] = tuple(given["notebooks"] or ())
        given["export"] = tuple(given["export"] or ())
        return cls(**given)

    def with_adjustments(self, adjustments) -> Request:
        return replace(self, adjust=adjustments)

    def verdict_limits(self) -> dict:
        """The options that change a verdict: part of each results key (:func:`.store.key`)."""
        return {"cell_timeout": self.timeout, "exercise_timeout": self.exercise_timeout,
                "notebook_timeout": self.notebook_timeout, "memory_gib": self.memory,
                "sandboxed": not self.no_sandbox}


#: the defaults the command line shows
DEFAULTS = Request()
