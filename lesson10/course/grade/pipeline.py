"""A grading run as four stages over one :class:`~.request.Request`:

1. **plan** (:func:`plan`): every file is read before any student code runs (zips
   unpacked, each notebook through :mod:`.nbread`), then who handed in what
   (:func:`.gradebook.plan`), each graded file's helper modules and results key;
2. **grade** (:func:`grade`): each planned notebook not already in the results folder is
   graded in a sandbox of its own (:func:`.notebook.grade_notebook`), byte-identical files
   once, and kept in the folder as soon as it is known;
3. **collect** (:func:`collect`): the class as the results folder now holds it (this batch
   merged into what was graded before), or this batch alone without a folder;
4. **write** (:func:`write`): every output asked for (:func:`.outputs.write`), and the exit
   status (:func:`exit_status`).

:func:`run` is the whole of it; the command line (:mod:`.cli`) and Gradescope's
``run_autograder`` (:mod:`.gradescope`) both call it. Exit status: 0 every exercise passed
(or the score reaches ``fail_under``) and no student misses a notebook; 1 points were
lost; 2 the grader or its environment failed.
"""
from __future__ import annotations

import importlib
import os
import pkgutil
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from ...checks.exercises import counts
from ...errors import Lesson10Error
from . import adjust, archives, gradebook, late, lms, nbread, outputs, overrides, sandbox, standin, store
from .config import GradeConfig
from .notebook import grade_notebook
from .reports import graded_at
from .request import Request
from .submission_files import Helpers, helper_files

#: modules the judge imports before any notebook runs (the checks and their references):
#: what is on disk later does not matter
_JUDGE_MODULES = ("lesson10.checks", "lesson10.sim", "lesson10.layouts", "lesson10.cost")


def import_judge_modules() -> None:
    for name in _JUDGE_MODULES:
        mod = importlib.import_module(name)
        for info in pkgutil.walk_packages(getattr(mod, "__path__", []), prefix=name + "."):
            importlib.import_module(info.name)


class SetupError(Lesson10Error, RuntimeError):
    """The run cannot start as asked (a bad request, no sandbox, an unusable results folder,
    a batch that cannot be planned): exit status 2, with this message."""


def run(request: Request) -> int:
    """Grade as ``request`` asks and write its outputs; the exit status (see the module).
    Problems that stop the run are printed as one line (``grade: ...``) with status 2."""
    try:
        return _run(request)
    except SetupError as exc:
        print(f"grade: {exc}", file=sys.stderr)
        return 2


def _run(request: Request) -> int:
    problem = validate(request)
    if problem:
        raise SetupError(problem)
    box = _results_store(request)
    try:
        if box is not None:
            box.prepare()
        seed = store.choose_seed(box, request.seed, request.replay)
    except (store.StoreError, OSError) as exc:
        raise SetupError(str(exc)) from None
    request = _with_adjustments(request, box)
    old = box.load_class() if box is not None else None
    if not request.notebooks:                    # the outputs of a results folder alone
        if old is None or box is None:
            raise SetupError(f"{request.results} holds no graded class (no class.json)")
        reports_all, plan_all = store.load(old, box)
        adjust.save(box.folder, request.adjust)
        return write(request, plan_all, reports_all, old.get("seed", seed),
                     all(r.get("sandboxed", True) for r in reports_all))
    with tempfile.TemporaryDirectory(prefix="lesson10-zips-") as unzipped:
        planned = plan(request, Path(unzipped), old, seed, box)
        seed = store.run_seed(old, planned.seeds, seed)
        results = grade(request, planned, box, seed)
        return collect_and_write(request, planned, results, box, old, seed)


def validate(request: Request) -> str | None:
    """What is wrong with ``request`` as one line (its option's name in it), or None."""
    if request.jobs < 1 or request.timeout <= 0 or request.exercise_timeout <= 0 or \
            request.notebook_timeout <= 0 or request.memory <= 0:
        return ("-j, --timeout, --exercise-timeout, --notebook-timeout and --memory must "
                "be positive")
    if request.fail_under is not None and not 0 <= request.fail_under <= 100:
        return "--fail-under takes a percentage between 0 and 100"
    if request.student is not None and request.student_from is not None:
        return "give --student or --student-from, not both"
    if not request.notebooks and request.results is None:
        return "give the notebooks to grade (files or folders), or --resume DIR"
    if request.results is not None and request.no_results:
        return "give --resume DIR or --no-results, not both"
    return outputs.check(request)


def _results_store(request: Request) -> store.Store | None:
    """The results folder: ``results``; for a class (no ``student``) with a class output,
    ``lesson10-results/`` beside the first of them; else none."""
    if request.no_results:
        return None
    if request.results is not None:
        return store.Store(request.results)
    if request.student is not None:
        return None
    for name in ("output", "csv", "feedback", "report"):
        path = getattr(request, name)
        if path is not None:
            return store.Store(Path(path).resolve().parent / "lesson10-results")
    return None


def _with_adjustments(request: Request, box) -> Request:
    """``request`` with its adjustments on top of those the results folder keeps."""
    try:
        made = adjust.from_args(request, adjust.load(box.folder) if box is not None else None)
        lms.check(list(request.export), request.roster)
    except (overrides.OverrideError, late.LateError, lms.ExportError) as exc:
        raise SetupError(str(exc)) from None
    return request.with_adjustments(made)


# --------------------------------------------------------------------------- 1. plan
@dataclass(frozen=True)
class Planned:
    """A planned batch: the files read, who handed in what, and each graded file's helper
    modules, results key and seed (a file unchanged since it was stored keeps its seed)."""
    found: archives.Batch
    plan: gradebook.Plan
    helpers: dict
    keys: dict
    seeds: dict

    @property
    def contents(self) -> dict:
        return self.found.contents


def plan(request: Request, unzipped: Path, old, seed: int, box) -> Planned:
    """Stage 1 (see the module); zips are unpacked into ``unzipped``."""
    # every file is read before any student code runs: no submission can change another
    found = archives.gather(list(request.notebooks), unzipped, nbread.MAX_NOTEBOOK_BYTES)
    if not found.paths and request.student is None:
        raise SetupError("no notebook found in " + ", ".join(map(str, request.notebooks)))
    try:
        the_plan = _plan(request, found, old)
    except (gradebook.PlanError, OSError) as exc:
        raise SetupError(str(exc)) from None
    adjust.note_times(request.adjust, found.paths, the_plan.handins)
    late.choose_on_time(the_plan, request.adjust.policy, request.adjust.times,
                        request.adjust.handins)
    contents = found.contents
    helpers = _helpers(the_plan, contents, request.student_from, found.real)
    limits = request.verdict_limits()

    def key(it, s):
        return store.key(contents[it.path], helpers[it.path], seed=s, notebook=it.notebook,
                         limits=limits)
    keys = {it.path: key(it, seed) for it in the_plan.graded}
    seeds = store.keep_unchanged(old, box, the_plan.graded, keys, seed, key,
                                 fixed=request.seed is not None or request.new_cases)
    return Planned(found, the_plan, helpers, keys, seeds)


def _plan(request: Request, found: archives.Batch, old) -> gradebook.Plan:
    """Who handed in what (a results folder's roster and class folder where it has them);
    raises PlanError for a batch that cannot be graded as asked."""
    roster = gradebook.read_roster(request.roster) if request.roster else None
    if roster is None and old is not None and request.student is None:
        roster = old.get("roster")
    plan = gradebook.plan(found.paths, found.contents, student=request.student,
                          student_from=request.student_from, roster=roster, others=found.others,
                          base=old.get("root") if old is not None else None,
                          anchors=found.unpacked.zips, notes=found.unpacked.refused,
                          real=found.real, given=request.notebooks)
    for name in plan.not_on_roster():
        print(f"grade: warning: {name} is not on the roster", file=sys.stderr)
    for option in ("gradescope", "classroom"):
        if getattr(request, option) and len(plan.students) != 1:
            names = ", ".join(plan.students[:5]) + (", ..." if len(plan.students) > 5 else "")
            raise gradebook.PlanError(
                f"--{option} writes one student's results, and this batch has "
                f"{len(plan.students)} students ({names}); grade each student's notebooks on "
                f"their own, or give --student NAME if they are one student's")
    return plan



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



def _root(paths, others, old) -> str:
    """The class's folder: where student names are taken from when some of it is graded
    again (the stored one, while every path is under it)."""
    folders = [os.path.dirname(os.path.abspath(p)) for p in list(paths) + list(others)]
    if old is not None and old.get("root") and all(
            f == old["root"] or f.startswith(old["root"] + os.sep) for f in folders):
        return old["root"]
    return os.path.commonpath(folders) if folders else ""



# --------------------------------------------------------------------------- 2. grade
def grade(request: Request, planned: Planned, box, seed: int) -> list[dict]:
    """Stage 2: each graded file's report, in the plan's order: the stored one where the
    results folder has it, else graded now (byte-identical files once) and stored at once."""
    the_plan, keys, contents = planned.plan, planned.keys, planned.contents
    stored = {it.path: box.get(keys[it.path]) if box is not None else None
              for it in the_plan.graded}
    todo = [it for it in the_plan.graded if stored[it.path] is None]
    if box is not None:
        box.begin(seed)
        if len(todo) < len(the_plan.graded):
            print(f"grade: {len(the_plan.graded) - len(todo)} of {len(the_plan.graded)} "
                  f"notebooks already graded in {box.folder}", file=sys.stderr)
    fresh: dict = {}
    save = (lambda it, rep: box.put(keys[it.path], rep)) if box is not None else None
    first = _firsts(todo, contents, keys)
    unique = [it for it in todo if first.get(it.path, it) is it]
    if unique:
        opts, box_dir = _config(request, seed)
        try:
            with ThreadPoolExecutor(max_workers=request.jobs) as pool:
                for it, rep in zip(unique, pool.map(lambda it: _one(
                        request, opts, it, contents, planned.helpers, save, planned.found.real),
                        unique)):
                    fresh[it.path] = rep
        finally:
            _remove(box_dir)
    for it in todo:
        if it.path not in fresh:
            fresh[it.path] = _same_as(request, first[it.path], fresh[first[it.path].path], it)
    out = []
    for it in the_plan.graded:
        copies = [p for p, chosen in the_plan.ignored.items() if chosen is it]
        out.append(store.finish(stored[it.path] or fresh[it.path], it.student, str(it.path),
                                planned.seeds.get(it.path, seed), copies))
    if box is not None:
        print(f"grade: results in {box.folder} (the same command, or --resume "
              f"{box.folder}, grades only what is not there)", file=sys.stderr)
    return out


def _config(request: Request, seed: int) -> tuple[GradeConfig, Path]:
    """The run's :class:`GradeConfig` and the stand-in's folder (removed after grading)."""
    sandboxed = not request.no_sandbox
    if sandboxed:
        why = sandbox.probe()
        if why:
            raise SetupError(f"no sandbox: {why}.\nInstall bubblewrap, or grade with "
                             f"--no-sandbox (student code then runs unconfined, and every "
                             f"report says so).")
    try:
        import_judge_modules()
        box_dir = Path(tempfile.mkdtemp(prefix="lesson10-standin-"))
        standin.write_all(box_dir)
    except Exception as exc:  # noqa: BLE001 - the grader cannot work without them
        raise SetupError(f"cannot prepare the stand-in package: {type(exc).__name__}: "
                         f"{exc}") from None
    limits = sandbox.Limits(memory=int(request.memory * 2**30),
                            cpu=int(request.notebook_timeout) + 30)
    opts = GradeConfig(cell_timeout=request.timeout, exercise_timeout=request.exercise_timeout,
                       notebook_timeout=request.notebook_timeout,
                       save_executed=request.save_executed, sandboxed=sandboxed, seed=seed,
                       standin=box_dir / standin.GENERAL, limits=limits)
    return opts, box_dir


def _firsts(todo: list, contents: dict, keys: dict) -> dict:
    """``path -> the item graded for it``: of byte-identical files (the same results key:
    bytes, helpers, notebook, seed, limits) the first is graded, once for all of them."""
    seen: dict[str, gradebook.Item] = {}
    out = {}
    for it in todo:
        if contents.get(it.path) is not None:
            out[it.path] = seen.setdefault(keys[it.path], it)
    return out


def _same_as(request: Request, graded: gradebook.Item, rep: dict, item: gradebook.Item) -> dict:
    """The report of ``item``, a file identical to ``graded``: its verdicts, its student and
    path (and, with --save-executed, its own executed copy)."""
    out = {**rep, "student": item.student, "notebook": str(item.path)}
    if request.save_executed:
        from .notebook import executed_path
        src = executed_path(request.save_executed, graded.student, graded.notebook or "")
        dst = executed_path(request.save_executed, item.student, item.notebook or "")
        if item.notebook and src.is_file() and src != dst:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
    return out


def _one(request: Request, opts: GradeConfig, item: gradebook.Item, contents, helpers, save=None,
         real=None) -> dict:
    """Grade one file (read from ``real[path]``, the file on disk, when it came from a zip);
    its report goes to the results folder as soon as it is known."""
    path = item.path
    if not request.json:
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
    rep["graded_at"] = graded_at()        # kept with the report: JUnit's timestamp
    if save is not None and rep.get("ok"):        # a grader error is graded again on resume
        save(item, rep)
    if request.save_executed:
        outputs.annotate(request.save_executed, rep, opts.seed)
    return rep


def _remove(box_dir: Path) -> None:
    for p in [box_dir, *box_dir.rglob("*")]:
        try:
            os.chmod(p, 0o755)
        except OSError:
            pass
    shutil.rmtree(box_dir, ignore_errors=True)


# --------------------------------------------------------------------------- 3. collect, 4. write
def collect_and_write(request: Request, planned: Planned, results: list[dict], box, old,
                      seed: int) -> int:
    """Stages 3 and 4: the class (:func:`collect`), its outputs, the exit status."""
    sandboxed = not request.no_sandbox
    if box is None:
        return write(request, planned.plan, results, seed, sandboxed)
    reports_all, plan_all = collect(request, planned, box, old, seed)
    return write(request, plan_all, reports_all, seed, sandboxed, batch=(planned.plan, results))


def collect(request: Request, planned: Planned, box, old,
            seed: int) -> tuple[list[dict], gradebook.Plan]:
    """Stage 3: this batch merged into the results folder's class (and the adjustments
    kept beside it); the whole class's reports and plan, as the folder now holds them."""
    found = planned.found
    root = _root(found.paths, found.others, old)
    doc = store.merge(old, store.class_doc(planned.plan, planned.keys, seed=seed, root=root,
                                           seeds=planned.seeds))
    box.save_class(doc)
    box.end()
    adjust.save(box.folder, request.adjust)
    return store.load(doc, box)


def write(request: Request, the_plan, reports: list[dict], seed: int, sandboxed: bool,
          batch: tuple | None = None) -> int:
    """Stage 4: every output ``request`` asks for; the exit status."""
    rows = outputs.write(request, the_plan, reports, seed, sandboxed, batch=batch)
    return exit_status(reports, request.fail_under, students=rows)


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
    total = sum(e["max_points"] for e in entries if counts(e["exercise"]))
    if fail_under is not None:
        return 0 if total > 0 and 100.0 * got / total >= fail_under else 1
    return 0 if total > 0 and all(e["passed"] or not counts(e["exercise"]) for e in entries) else 1

