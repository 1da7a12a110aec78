"""The grader's outputs: every path checked before the first notebook is graded, then
every output written from the gradebook rows.

:func:`check` makes each output's folder and proves it writable (a file output may not be
a folder, a folder output may not be a file), so a long run never ends in a traceback with
nothing written. :func:`write` writes them all; ``--json`` and ``--output`` carry no
timings unless ``--timings`` is given, so a resumed run writes the same bytes as an
uninterrupted one (:mod:`.store`).
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import adjust, classroom, feedback, gradebook, lms, reports, similarity

#: options that name a file the grader writes, and those that name a folder
FILE_OUTPUTS = ("output", "csv", "classroom", "gradescope", "junit", "markdown")
FOLDER_OUTPUTS = ("feedback", "save_executed", "report")


def _probe_file(path: Path) -> str | None:
    if path.is_dir():
        return f"{path} is a folder; give a file name"
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        return f"cannot write {path}: {exc.strerror or exc}"
    if not existed:
        path.unlink()
    return None


def _probe_folder(path: Path) -> str | None:
    if path.exists() and not path.is_dir():
        return f"{path} is a file; give a folder"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".lesson10-write-test"
        probe.write_text("", encoding="utf-8")
        probe.unlink()
    except OSError as exc:
        return f"cannot write into {path}: {exc.strerror or exc}"
    return None


def check(args) -> str | None:
    """Make the folder of every output and check it can be written; the first problem as
    one line (``--csv out/x.csv: cannot write ...``), or None."""
    probes = [(name, _probe_file) for name in FILE_OUTPUTS]
    probes += [(name, _probe_folder) for name in FOLDER_OUTPUTS]
    for name, probe in probes:
        path = getattr(args, name, None)
        why = probe(Path(path)) if path is not None else None
        if why:
            return f"--{name.replace('_', '-')} {path}: {why}"
    return None


TIMINGS = ("seconds", "sandbox_cpu_seconds", "graded_at")


def without_timings(doc):
    """``doc`` (the JSON report) without the seconds each notebook and exercise took, and
    when each was graded."""
    if isinstance(doc, dict):
        return {k: without_timings(v) for k, v in doc.items() if k not in TIMINGS}
    if isinstance(doc, list):
        return [without_timings(v) for v in doc]
    return doc


def class_doc(results: list[dict], rows: list[dict], the_plan, *, seed, sandboxed,
              timings: bool = False) -> dict:
    doc = reports.summary(results, rows)
    doc["seed"] = seed
    doc["sandboxed"] = sandboxed
    outside = the_plan.not_graded.get(None, []) if the_plan is not None else []
    if outside:
        doc["not_graded"] = outside
    return doc if timings else without_timings(doc)


@dataclass(frozen=True)
class Written:
    """What every writer reads: the options, the class's rows and reports (safe text), the
    JSON document and its text, the seed, and this run's own ``(plan, results)``."""
    args: Any
    rows: list
    results: list
    doc: dict
    text: str
    seed: int
    sandboxed: bool
    batch: tuple
    adj: Any
    flags: Any


def _json_file(w: Written) -> None:
    w.args.output.write_text(w.text, encoding="utf-8")


def _csv(w: Written) -> None:
    w.args.csv.write_text(reports.class_csv(w.results, w.rows, seed=w.seed), encoding="utf-8")


def _junit(w: Written) -> None:
    w.args.junit.write_text(reports.junit(w.results, w.rows, seed=w.seed), encoding="utf-8")


def _markdown(w: Written) -> None:
    with open(w.args.markdown, "a", encoding="utf-8") as f:
        f.write(reports.markdown(w.results, w.rows, seed=None, sandboxed=w.sandboxed))


def _feedback(w: Written) -> None:           # what students read: no seed (STUDENT_OUTPUTS)
    feedback.write(w.args.feedback, w.rows, w.results, seed=None, sandboxed=w.sandboxed)


def _report(w: Written) -> None:
    from .. import report as class_report
    class_report.write(w.args.report, w.rows, w.results, seed=w.seed, flags=w.flags,
                       folders=w.adj.folders if w.adj is not None else None)


def _gradescope(w: Written) -> None:
    b_results, b_rows = _one_student(w)
    notes = [] if w.sandboxed else ["Not sandboxed: graded with --no-sandbox."]
    doc = json.loads(reports.gradescope(b_results, b_rows, seed=None, sandboxed=w.sandboxed,
                                        notes=notes))
    doc["extra_data"]["seed"] = w.seed             # hidden from the student
    w.args.gradescope.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def _classroom(w: Written) -> None:
    b_results, b_rows = _one_student(w)
    w.args.classroom.write_text(json.dumps(classroom.runner_results(
        b_results, b_rows, seed=w.seed, sandboxed=w.sandboxed), indent=1) + "\n",
        encoding="utf-8")


#: option -> its writer, in the order they are written (the table or JSON on stdout last);
#: ``--export`` (the LMS files) is written with the similarity flags, by :func:`extras`
WRITERS = (("output", _json_file), ("csv", _csv), ("gradescope", _gradescope),
           ("classroom", _classroom), ("junit", _junit), ("markdown", _markdown),
           ("feedback", _feedback), ("report", _report))


def write(args, the_plan, results: list[dict], seed: int, sandboxed: bool, *,
          batch: tuple | None = None) -> list[dict]:
    """Write every output asked for (:data:`WRITERS`); returns the gradebook rows.
    ``the_plan`` and ``results`` are the whole class (a results folder's, see :mod:`.store`);
    ``batch``, ``(plan, results)`` of the notebooks of this run, is what the one-student
    outputs (``--gradescope``, ``--classroom``) are written from."""
    adj = getattr(args, "adjust", None)
    raw = adjust.apply(gradebook.rows(results, the_plan), adj)
    for row in raw:     # the seed of the student's files; none drawn for no hand-in
        row["seed"] = next((r["seed"] for r in results if r["student"] == row["student"]
                            and r.get("seed") is not None), None)
    # every name and path as any file takes it (a Latin-1 folder: surrogate escapes)
    rows, results = gradebook.safe_text(raw), gradebook.safe_text(results)
    doc = class_doc(results, rows, the_plan, seed=seed, sandboxed=sandboxed,
                    timings=getattr(args, "timings", False))
    flags = gradebook.safe_text(extras(args, doc, raw, adj))     # it reads the files
    if "similarity" in doc:
        doc["similarity"] = flags
    text = json.dumps(doc, indent=1) + "\n"
    w = Written(args, rows, results, doc, text, seed, sandboxed,
                batch if batch is not None else (the_plan, results), adj, flags)
    for option, writer in WRITERS:
        if getattr(args, option, None):
            writer(w)
    print(text if args.json else reports.table(results, rows, seed=seed),
          end="" if args.json else "\n")
    return rows


#: the outputs a student reads: they never name the seed (an answer book for it would
#: score), which only the instructor's outputs (--json, --output, --csv, --junit, the table,
#: the class report, Gradescope's hidden extra_data) carry
STUDENT_OUTPUTS = ("feedback", "markdown", "gradescope", "save_executed")


def _one_student(w: Written) -> tuple[list, list]:
    """``(results, rows)`` of the batch's one student (``--gradescope``, ``--classroom``)."""
    b_plan, b_results = w.batch
    b_rows = gradebook.safe_text(adjust.apply(gradebook.rows(b_results, b_plan), w.adj))
    return gradebook.safe_text(b_results), b_rows


def extras(args, doc: dict, rows: list[dict], adj) -> dict | None:
    """The JSON's ``adjustments`` and ``similarity`` (flags for a person, computed when the
    JSON or the report is written), and the LMS exports; returns the flags."""
    if adj is not None:
        doc["adjustments"] = adj.summary()
    flags = None
    if args.json or args.output or getattr(args, "report", None):
        flags = similarity.flags(rows)
        doc["similarity"] = flags
    if getattr(args, "export", None):
        notes = {r["student"]: adjust.describe(r) for r in rows if adjust.describe(r)}
        _, warnings = lms.write(args.export_dir, args.export, rows, args.roster,
                                args.assignment, notes)
        for line in warnings:
            print(f"grade: warning: {line}", file=sys.stderr)
    return flags


def annotate(folder: Path, rep: dict, seed: int) -> None:
    """Make ``--save-executed``'s copy of a just graded notebook say what the grade says
    (not the seed: the student may read it)."""
    from .notebook import executed_path
    if not rep.get("course_notebook"):
        return
    target = executed_path(folder, rep["student"], rep["course_notebook"])
    if target.is_file() and rep["exercises"]:
        try:
            feedback.annotate_executed(target, gradebook.safe_text(rep), seed=None)
        except Exception as exc:  # noqa: BLE001 - the grades are written already
            print(f"grade: warning: cannot add the grade to {target}: {exc}", file=sys.stderr)
