"""One grading run's settings: :class:`GradeConfig`, frozen, made once per run.

Every part of a run reads the same object: the pipeline makes it from the run's request
(:func:`lesson10.course.grade.pipeline.grade`), :func:`~lesson10.course.grade.notebook.grade_notebook`
grades one notebook with it, and the session that runs that notebook's cells and checks
(:mod:`.session`) reads its limits and seed. The sandbox's own limits are one field
(:class:`.sandbox.Limits`: memory, CPU, file size, processes), so memory is said once.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .sandbox import Limits

__all__ = ["GradeConfig"]


@dataclass(frozen=True)
class GradeConfig:
    #: seconds a cell may run, an exercise's judged calls may take, the whole notebook may take
    cell_timeout: float = 120.0
    exercise_timeout: float = 30.0
    notebook_timeout: float = 600.0
    #: folder to write each executed notebook to (``<student>/<notebook id>.ipynb``), or None
    save_executed: Path | None = None
    sandboxed: bool = True
    #: the seed the judge draws each exercise's random cases from
    seed: int = 0
    #: the stand-in folder (:func:`lesson10.course.grade.standin.write`) of this notebook
    standin: Path | None = None
    #: the sandbox's limits on each process (memory, CPU, file size, processes)
    limits: Limits = field(default_factory=Limits)
