"""Grade one submitted notebook: identify it, run it for feedback, judge its exercises.

The report of a notebook::

    {"notebook": path as given, "student": parent folder name, "course_notebook": id or None,
     "exercises": [{"exercise", "status", "passed", "points", "max_points", "message"}],
     "points", "max_points", "feedback": [lines], "ok": bool, "error": message or None}

``ok`` is False only when the grader or the machine failed (no kernel, no worker);
a broken submission (unreadable, not Python, unknown notebook) is ``ok`` with 0 points.
"""
from __future__ import annotations

import json
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import course, judge, runner, sandbox


@dataclass
class Options:
    cell_timeout: float = 120.0
    exercise_timeout: float = 30.0
    notebook_timeout: float = 600.0
    memory: int = 4 * 2**30
    execute: bool = True
    #: folder to write each executed notebook to (``<student>/<file name>``), or None
    save_executed: Path | None = None


def _report(path: Path, notebook_id, entries=(), *, feedback=(), ok=True, error=None) -> dict:
    entries = list(entries)
    return {"notebook": str(path), "student": path.resolve().parent.name,
            "course_notebook": notebook_id, "exercises": entries,
            "points": sum(e["points"] for e in entries),
            "max_points": sum(e["max_points"] for e in entries),
            "feedback": list(feedback), "ok": ok, "error": error}


def _zero(notebook_id, status: str, message: str) -> list[dict]:
    """Every exercise of the notebook at 0, or one entry worth the whole course when the
    notebook is unknown."""
    if notebook_id is None:
        return [{"exercise": "(unknown notebook)", "status": status, "passed": False,
                 "points": 0, "max_points": course.full_marks(None), "message": message}]
    return [{"exercise": ex.id, "status": status, "passed": False, "points": 0,
             "max_points": ex.points, "message": message} for ex in course.exercises(notebook_id)]


def _zero_removed_checks(nb, entries: list[dict]) -> None:
    """An exercise whose check cell was deleted scores 0 (of its full marks): the check
    cell is part of the assignment, and the course, not the submission, says what counts."""
    called = course.called_checks(nb)
    for e in entries:
        if e["exercise"] not in called and e["points"] > 0:
            e.update(points=0, passed=False, status="check removed",
                     message=f"the check cell check_{e['exercise']}(...) is missing from the "
                             f"notebook; restore it (it is part of the assignment)")


def _read(path: Path, content: bytes | None):
    """``(notebook dict, None)`` or ``(None, why not)``."""
    try:
        import nbformat
        text = (path.read_bytes() if content is None else content).decode("utf-8")
        nb = nbformat.reads(text, as_version=4)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the submission's fault
        return None, f"cannot read the notebook: {type(exc).__name__}: {str(exc)[:200]}"
    if not isinstance(nb.get("cells"), list):
        return None, "cannot read the notebook: it has no list of cells"
    return nb, None


def _save(nb, target: Path) -> None:
    import nbformat
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(target))


def grade_notebook(path, package: sandbox.Package, opts: Options | None = None,
                   content: bytes | None = None) -> dict:
    """Grade the notebook at ``path``; ``content``: its bytes, read before any student code
    ran (the command line reads every file first, so no submission can change another)."""
    opts = opts or Options()
    path = Path(path)
    if content is None and not path.is_file():
        return _report(path, None, ok=False, error="no such file")
    nb, why = _read(path, content)
    guess = course.identify({}, path)[0]
    if nb is None:
        return _report(path, guess, _zero(guess, "unreadable", why), feedback=[why])
    notebook_id, how = course.identify(nb, path)
    if notebook_id is None:
        msg = f"cannot tell which course notebook this is: {how}; it scores 0"
        return _report(path, None, _zero(None, "unknown notebook", msg), feedback=[msg])
    problem = course.language_problem(nb)
    if problem:
        return _report(path, notebook_id, _zero(notebook_id, "not python", problem),
                       feedback=[problem])
    if not course.exercises(notebook_id):
        return _report(path, notebook_id, feedback=[f"{notebook_id} has no exercises to grade"])

    deadline = time.monotonic() + opts.notebook_timeout
    tag = sandbox.new_tag()             # marks every process this notebook starts
    feedback: list[str] = []
    with tempfile.TemporaryDirectory(prefix="lesson10-grade-") as tmp:
        tmp = Path(tmp)
        workdir = tmp / "work"           # an empty folder, not the submissions' folder
        workdir.mkdir()
        run = {}
        thread = None
        if opts.execute:
            run_nb = json.loads(json.dumps(nb))          # its own copy, outputs go there
            import nbformat
            run_nb = nbformat.from_dict(run_nb)

            def execute():
                run.update(runner.execute(run_nb, workdir=workdir, tmp=tmp, package=package,
                                          cell_timeout=opts.cell_timeout, deadline=deadline,
                                          memory=opts.memory, tag=tag))
            thread = threading.Thread(target=execute, daemon=True)
            thread.start()
        try:
            entries, notes = judge.judge(
                nb, notebook_id, package=package, tmp=tmp, workdir=workdir, memory=opts.memory,
                cell_timeout=opts.cell_timeout, exercise_timeout=opts.exercise_timeout,
                deadline=deadline, fingerprints=judge.fingerprints_of(package), tag=tag)
        except judge.WorkerFailure as exc:
            if thread is not None:
                thread.join()
            sandbox.reap(tag)
            return _report(path, notebook_id, _zero(notebook_id, "grader error", str(exc)),
                           ok=False, error=str(exc))
        if thread is not None:
            thread.join()
        left = sandbox.reap(tag)
        if opts.execute and opts.save_executed is not None and run:
            _save(run_nb, Path(opts.save_executed) / path.resolve().parent.name / path.name)
        feedback += run.get("errors", []) + notes
        _zero_removed_checks(nb, entries)
        if left:
            feedback.append(f"{left} process(es) the notebook left running were killed")
        if run.get("environment"):
            return _report(path, notebook_id, entries, feedback=feedback, ok=False,
                           error=run["environment"])
    return _report(path, notebook_id, entries, feedback=feedback)
