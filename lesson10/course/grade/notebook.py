"""Grade one submitted notebook: identify it, run its cells in a sandbox, judge each exercise.

The report of a notebook::

    {"notebook": path as given, "student": who handed it in (the batch decides, see
     :mod:`.gradebook`; the parent folder's name when graded alone),
     "course_notebook": id or None,
     "exercises": [{"exercise", "status", "passed", "points", "max_points", "message"}],
     "points", "max_points", "feedback": [lines], "ok": bool, "error": message or None,
     "sandboxed": bool}

``ok`` is False only when the grader or the machine failed (no sandbox could start);
a broken submission (unreadable, not Python, unknown notebook) is ``ok`` with 0 points.
"""
from __future__ import annotations

import copy
import time
from pathlib import Path

from ...checks.exercises import counts
from ...checks.verdict import Status
from . import course, judge, nbread, session
from .config import GradeConfig
from .submission_files import MAX_HELPER_BYTES, MAX_HELPERS, Helpers, helper_files

__all__ = ["MAX_HELPERS", "MAX_HELPER_BYTES", "Helpers", "GradeConfig", "grade_notebook", "helper_files",
           "notebook_report"]


def notebook_report(path: Path, notebook_id, entries=(), *, feedback=(), ok=True, error=None,
            sandboxed=True, student: str | None = None) -> dict:
    entries = list(entries)
    return {"notebook": str(path), "student": student or path.resolve().parent.name,
            "course_notebook": notebook_id, "exercises": entries,
            "points": sum(e["points"] for e in entries),
            "max_points": sum(e["max_points"] for e in entries if counts(e["exercise"])),
            "feedback": list(feedback), "ok": ok, "error": error, "sandboxed": sandboxed}


def _zero(notebook_id, status: Status, message: str) -> list[dict]:
    """Every exercise of the notebook at 0, or one entry worth the whole course when the
    notebook is unknown."""
    if notebook_id is None:
        return [{"exercise": "(unknown notebook)", "status": Status(status).value,
                 "passed": False, "points": 0, "max_points": course.full_marks(None),
                 "message": message}]
    return [judge.entry(ex, status, message) for ex in course.exercises(notebook_id)]


def _read(path: Path, content: bytes | None):
    """``(notebook dict, None)`` or ``(None, why not)``: read and validated by
    :func:`.nbread.read` (nbformat's reader and validator, within the grader's limits)."""
    return nbread.read(path, content)


def executed_path(folder, student: str, notebook: str) -> Path:
    """Where ``--save-executed`` writes a student's graded ``notebook`` (its course id):
    ``folder/<student>/<notebook>.ipynb``, one file per student and course notebook whatever
    the files were named (two course notebooks both saved as ``hw.ipynb`` are two files; a
    student named ``sec1/s01`` gets nested folders, see :func:`.gradebook.safe_parts`)."""
    from .gradebook import safe_parts
    return Path(folder).joinpath(*safe_parts(student), f"{notebook}.ipynb")


def _save(nb, target: Path) -> None:
    """Write the executed notebook; a folder that cannot take it is a warning, never the
    notebook's grade (the verdicts are known already)."""
    import nbformat
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, str(target))
    except OSError as exc:
        import sys
        print(f"grade: warning: cannot save the executed notebook {target}: "
              f"{exc.strerror or exc}", file=sys.stderr)


def _entries(notebook_id: str, nb, run: session.Run) -> list[dict]:
    """One entry per course exercise: the last judged verdict, else why it has none."""
    called = course.called_checks(nb) | run.asked      # read as Jupyter runs it, or ran
    out = []
    for ex in course.exercises(notebook_id):
        if ex.id not in called:
            out.append(judge.entry(ex, Status.CHECK_REMOVED, f"the check cell check_{ex.id}(...) is "
                                   f"missing from the notebook; restore it (it is part of the "
                                   f"assignment, and the exercise is judged there)"))
        elif ex.id in run.verdicts:
            out.append(dict(run.verdicts[ex.id]))
        else:
            out.append(judge.entry(ex, Status.NOT_JUDGED, f"check_{ex.id}(...) never ran: the "
                                   f"notebook stopped before it, or its cell failed first "
                                   f"(see the feedback)"))
    return out


def _executed(nb, run: session.Run):
    """The notebook with the outputs of the graded run (check cells show the verdicts)."""
    import nbformat
    out = copy.deepcopy(nb)
    for i, cell in enumerate(out.cells):
        if cell.get("cell_type") != "code":
            continue
        got = run.outputs.get(i)
        outs = []
        if got is None and cell.get("source", "").strip():
            outs.append(nbformat.v4.new_output("stream", name="stderr",
                                               text="[grader: this cell did not run]\n"))
        for o in (got or {}).get("outputs", []):
            outs.append(nbformat.v4.new_output("stream", name=o["name"], text=o["text"]))
        err = (got or {}).get("error")
        if err:
            outs.append(nbformat.v4.new_output("error", ename=err["ename"], evalue=err["evalue"],
                                               traceback=err["traceback"]))
        cell["outputs"] = outs
        cell["execution_count"] = None
    return out


def _gradable(path: Path, content: bytes | None, sandboxed: bool, student: str | None):
    """``(notebook, its course id)``, or the report of a notebook that cannot be run."""
    def report(nid, entries=(), feedback=(), **kw):
        return notebook_report(path, nid, entries, feedback=feedback, sandboxed=sandboxed,
                               student=student, **kw)

    if content is None and not (path.is_file() or path.is_symlink()):
        return report(None, ok=False, error="no such file")
    nb, why = _read(path, content)
    if nb is None:
        guess = course.identify({}, path)[0]
        return report(guess, _zero(guess, Status.UNREADABLE, why), [why])
    notebook_id, how = course.identify(nb, path)
    if notebook_id is None:
        msg = f"cannot tell which course notebook this is: {how}; it scores 0"
        return report(None, _zero(None, Status.UNKNOWN_NOTEBOOK, msg), [msg])
    problem = course.language_problem(nb)
    if problem:
        return report(notebook_id, _zero(notebook_id, Status.NOT_PYTHON, problem), [problem])
    if not course.exercises(notebook_id):
        return report(notebook_id, feedback=[f"{notebook_id} has no exercises to grade"])
    return nb, notebook_id


def grade_notebook(path, opts: GradeConfig, content: bytes | None = None,
                   files: Helpers | list | None = None, student: str | None = None) -> dict:
    """Grade the notebook at ``path``; ``content``: its bytes, read before any student code
    ran (the command line reads every file first); ``files``: its helper modules
    (:class:`Helpers`, or ``(name, text)`` pairs; default: the files beside it, see
    :func:`helper_files`); ``student``: the report's student (default: the parent folder's
    name)."""
    path = Path(path)
    sandboxed = opts.sandboxed
    got = _gradable(path, content, sandboxed, student)
    if isinstance(got, dict):
        return got
    nb, notebook_id = got
    if opts.standin is None:
        raise ValueError("GradeConfig.standin: give the stand-in folder (lesson10.course.grade."
                         "standin.write) to grade a notebook")
    helpers = files if isinstance(files, Helpers) else \
        Helpers(list(files)) if files is not None else helper_files(path)
    import tempfile
    deadline = time.monotonic() + opts.notebook_timeout
    with tempfile.TemporaryDirectory(prefix="lesson10-grade-", ignore_cleanup_errors=True) as tmp:
        workdir = Path(tmp)              # used only without the sandbox (its own /tmp inside)
        try:
            run = session.run_notebook(course.code_cells(nb), notebook_id, opts, deadline,
                                     workdir, helpers.files)
        except judge.Failure as exc:
            return notebook_report(path, notebook_id, _zero(notebook_id, Status.GRADER_ERROR,
                                                            str(exc)),
                                   ok=False, error=str(exc), sandboxed=sandboxed, student=student)
    feedback = list(helpers.notes) + list(run.notes)
    for i, out in sorted(run.outputs.items()):
        err = out.get("error")
        if err and err["ename"] not in ("CheckFailed", "NotAvailable"):
            feedback.append(f"cell {i}: {err['ename']}: {err['evalue'][:200]}")
    if not sandboxed:
        feedback.append("not sandboxed: graded with --no-sandbox")
    if opts.save_executed is not None:
        _save(_executed(nb, run), executed_path(opts.save_executed, student or
                                                path.resolve().parent.name, notebook_id))
    report = notebook_report(path, notebook_id, _entries(notebook_id, nb, run),
                             feedback=feedback, sandboxed=sandboxed, student=student)
    if sandboxed:
        report["sandbox_cpu_seconds"] = round(run.sandbox_cpu, 3)
    return report
