"""The results folder: nothing of a long grading run is lost.

Each graded notebook's report is written as soon as it is known, to
``DIR/results/<key>.json``, where the key is the SHA-256 of everything that can change a
verdict: the course version and the grader's own code (:func:`code_version`), the seed, the
limits (cell, exercise and notebook timeouts, memory, sandboxed or not), the course notebook
the file is, its bytes (without its saved outputs, :func:`.nbread.slim`) and its helper
modules. The same submission graded again with the
same seed, limits and code gets the same verdicts, so a stored report is reused instead; a
longer ``--exercise-timeout`` is another key, and "timed out" is never reused under it.

``DIR/seed`` keeps the seed of the latest run (a secret one too), and ``DIR/running`` says
that run has not finished. A run that stops (Ctrl-C, a killed runner, a crash) is resumed by
the same command, or ``grade --resume DIR``: its seed is taken again, only what has no stored
report is graded, and the outputs are those of one uninterrupted run. A run after a finished
one draws a new secret seed: a changed file (a resubmission) meets new cases, and a file
unchanged since its stored verdict keeps it (:func:`keep_unchanged`; ``--new-cases`` grades
it again too, ``--replay`` takes the stored seed again, ``--seed S`` a given one). ``DIR/class.json``
keeps the class as planned (who handed in what, with the seed each file was graded with,
copies and files not graded, the roster); grading one student again replaces that student's
part of it, and the class outputs are written from all of it.

Files are written to a temporary name and renamed, so a kill leaves no half-written report.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path

import lesson10

from ... import scheme
from ...errors import Lesson10Error

#: the layout version of class.json and the stored reports
FORMAT = 1


@functools.cache
def code_version() -> str:
    """A digest of the course package's code (the grader, the checks, what the sandbox
    ships): any change of it is another results key."""
    root = Path(lesson10.__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" not in path.parts:
            h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def key(content: bytes | None, helpers, *, seed: int, notebook: str | None,
        limits: dict | None = None) -> str:
    """The key of one notebook's result: course version and code, the course file's points
    and term, seed, ``limits`` (the
    options that change a verdict: timeouts, memory, sandbox), course notebook, bytes and
    helper files (``[(name, text)]``) of the submission."""
    h = hashlib.sha256()
    for part in (f"lesson10 {lesson10.__version__} format {FORMAT} code {code_version()}",
                 f"scheme {scheme.current().digest}",
                 f"seed {seed}", f"notebook {notebook}",
                 "limits " + json.dumps(limits or {}, sort_keys=True)):
        h.update(part.encode() + b"\0")
    h.update(b"content\0" + (content if content is not None else b"<unreadable>") + b"\0")
    for name, text in helpers or ():
        h.update(f"helper {name}\0".encode("utf-8", "surrogateescape")
                 + str(text).encode("utf-8", "replace") + b"\0")
    for note in getattr(helpers, "notes", ()):     # files refused: their reasons are in the report
        h.update(b"refused\0" + str(note).encode("utf-8", "replace") + b"\0")
    return h.hexdigest()[:32]


def _write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a temporary file in the folder, renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class StoreError(Lesson10Error, ValueError):
    """The results folder cannot be used as asked (another seed, not a results folder)."""


class Store:
    """One results folder (see the module's docstring)."""

    def __init__(self, folder):
        self.folder = Path(folder)

    def prepare(self) -> None:
        """Make the folder (and its ``results/``), or fail before any grading."""
        if self.folder.exists() and not self.folder.is_dir():
            raise StoreError(f"the results folder {self.folder} is a file; give a folder")
        (self.folder / "results").mkdir(parents=True, exist_ok=True)
        probe = self.folder / ".write-test"
        probe.write_text("", encoding="utf-8")
        probe.unlink()

    def seed(self) -> int | None:
        try:
            return int((self.folder / "seed").read_text(encoding="utf-8").strip())
        except (OSError, ValueError):
            return None

    def save_seed(self, seed: int) -> None:
        _write(self.folder / "seed", f"{seed}\n")

    def begin(self, seed: int) -> None:
        """A run with ``seed`` starts: kept until :meth:`end`, so a run that stops is
        resumed with its seed."""
        self.save_seed(seed)
        _write(self.folder / "running", f"{seed}\n")

    def end(self) -> None:
        try:
            (self.folder / "running").unlink()
        except FileNotFoundError:
            pass

    def unfinished(self) -> bool:
        """Whether the latest run stopped before it wrote the class (resume it)."""
        return (self.folder / "running").is_file()

    def get(self, k: str) -> dict | None:
        try:
            doc = json.loads((self.folder / "results" / f"{k}.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return doc.get("report") if isinstance(doc, dict) and doc.get("key") == k else None

    def put(self, k: str, report: dict) -> None:
        _write(self.folder / "results" / f"{k}.json",
               json.dumps({"key": k, "report": report}, indent=1) + "\n")

    def load_class(self) -> dict | None:
        try:
            doc = json.loads((self.folder / "class.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) and doc.get("format") == FORMAT else None

    def save_class(self, doc: dict) -> None:
        _write(self.folder / "class.json", json.dumps(doc, indent=1) + "\n")


# --------------------------------------------------------------------------- the class
def class_doc(the_plan, keys: dict, *, seed: int, root: str, seeds: dict | None = None) -> dict:
    """What ``class.json`` holds of one batch: every student, their graded files (path,
    key, the seed each was graded with: ``seeds`` where given, else ``seed``), the copies
    not graded, the files not graded, the notes of a collision, the roster."""
    students: dict[str, dict] = {name: {"graded": [], "ignored": [], "not_graded": []}
                                 for name in the_plan.students}
    for it in the_plan.graded:
        students.setdefault(it.student, {"graded": [], "ignored": [], "not_graded": []})
        students[it.student]["graded"].append({"path": str(it.path), "key": keys[it.path],
                                               "notebook": it.notebook,
                                               "seed": (seeds or {}).get(it.path, seed)})
    for path, chosen in the_plan.ignored.items():
        students[chosen.student]["ignored"].append({"path": str(path),
                                                    "graded": str(chosen.path)})
    for who, files in the_plan.not_graded.items():
        if who is not None:
            students.setdefault(who, {"graded": [], "ignored": [], "not_graded": []})
            students[who]["not_graded"] = list(files)
    for who, notes in getattr(the_plan, "notes", {}).items():       # collisions (.identity)
        students.setdefault(who, {"graded": [], "ignored": [], "not_graded": []})
        students[who]["notes"] = list(notes)
    return {"format": FORMAT, "version": lesson10.__version__, "seed": seed, "root": root,
            "roster": the_plan.roster, "students": students,
            "order": [str(it.path) for it in the_plan.graded],
            "class_not_graded": list(the_plan.not_graded.get(None, []))}


def unchanged(old: dict | None, box: Store, path, key_at) -> tuple[str, int] | None:
    """``(key, seed)`` of ``path``'s stored verdict when the file is as it was graded then:
    ``key_at(seed)`` (its key with that earlier seed) is the stored key and the folder holds
    that result. A file unchanged since its verdict keeps it, seed and all (running the
    class again grades only what changed); a changed file, a resubmission, is graded anew
    with the new run's seed, so no earlier seed is replayed against it."""
    if old is None:
        return None
    for part in old.get("students", {}).values():
        for g in part.get("graded", []):
            seed = g.get("seed")
            if g.get("path") != str(path) or not isinstance(seed, int):
                continue
            key = key_at(seed)
            if key == g.get("key") and box.get(key) is not None:
                return key, seed
    return None


def keep_unchanged(old: dict | None, box: Store | None, graded, keys: dict, seed: int, key_at,
                   *, fixed: bool = False) -> dict:
    """The seed of each graded file: ``seed``, but a file unchanged since its stored verdict
    keeps that verdict's key (in ``keys``) and seed (:func:`unchanged`; ``key_at(item,
    seed)`` is an item's key with a seed). With ``fixed`` (``--seed``, ``--new-cases``)
    every file is graded with the one seed."""
    seeds = {it.path: seed for it in graded}
    if box is None or old is None or fixed:
        return seeds
    for it in graded:
        kept = unchanged(old, box, it.path, lambda s, it=it: key_at(it, s))
        if kept is not None:
            keys[it.path], seeds[it.path] = kept
    return seeds


def run_seed(old: dict | None, seeds: dict, seed: int) -> int:
    """The seed a run keeps and reports (``DIR/seed``, ``class.json``, the outputs):
    ``seed``, but the class's stored one when no file is graded with ``seed`` (every file
    keeps its earlier verdict), so grading an unchanged class again writes the same bytes."""
    if old is None or not isinstance(old.get("seed"), int) or seed in seeds.values():
        return seed
    return old["seed"]


def merge(old: dict | None, new: dict) -> dict:
    """``old`` with the students of ``new`` replaced (grading some students again); the
    roster and the class's own files are the newest batch's when it has them."""
    if old is None:
        return new
    students = dict(old.get("students", {}))
    for name, part in new["students"].items():
        if part["graded"] or part["ignored"] or part["not_graded"] or part.get("notes") or \
                name not in students:
            students[name] = part
    roster = new["roster"] if new["roster"] is not None else old.get("roster")
    for name in roster or []:
        students.setdefault(name, {"graded": [], "ignored": [], "not_graded": []})
    order = list(roster or []) + sorted(n for n in students if n not in (roster or []))
    kept = {g["path"] for n, part in students.items() if part is not new["students"].get(n)
            for g in part["graded"]}
    files = new["order"] + [f for f in old.get("order", []) if f in kept]
    return {**new, "roster": roster, "students": {n: students[n] for n in order},
            "order": files,
            "class_not_graded": new["class_not_graded"] or old.get("class_not_graded", [])}


def finish(rep: dict, student: str, path: str, seed, copies) -> dict:
    """A stored report as this batch reports it: its student, its path, the seed, the
    copies of it that were not graded."""
    out = {k: v for k, v in rep.items() if k != "ignored_copies"}
    out.update(student=student, notebook=str(path), seed=seed)
    if copies:                  # the rows, the feedback and Gradescope's output say so
        out["ignored_copies"] = [str(c) for c in copies]
    return out


def load(doc: dict, store: Store):
    """``(reports, plan)`` of the whole class in ``doc`` (``class.json``): the stored report
    of every graded file, with its student and path, in the order the files were given (the
    newest batch's first), and a plan for the gradebook rows.
    A report the folder lacks is a grader error of that notebook (never a silent 0)."""
    from .gradebook import Item, Plan
    reports, items = [], {}
    for name, part in doc["students"].items():
        for g in part["graded"]:
            rep = store.get(g["key"])
            if rep is None:
                from .notebook import notebook_report
                rep = notebook_report(Path(g["path"]), g.get("notebook"), ok=False,
                                      error=f"no stored result (key {g['key']}) in {store.folder}:"
                                            f" grade this student again", student=name)
            copies = [i["path"] for i in part["ignored"] if i["graded"] == g["path"]]
            reports.append(finish(rep, name, g["path"], g.get("seed", doc.get("seed")), copies))
            items[g["path"]] = Item(Path(g["path"]), name, g.get("notebook"))
    ignored = {Path(i["path"]): items.get(i["graded"], Item(Path(i["graded"]), name, None))
               for name, part in doc["students"].items() for i in part["ignored"]}
    not_graded: dict = {name: part["not_graded"] for name, part in doc["students"].items()
                        if part["not_graded"]}
    if doc.get("class_not_graded"):
        not_graded[None] = doc["class_not_graded"]
    rank = {path: i for i, path in enumerate(doc.get("order", []))}
    reports.sort(key=lambda r: rank.get(r["notebook"], len(rank)))        # the batch's order
    notes = {name: part["notes"] for name, part in doc["students"].items() if part.get("notes")}
    the_plan = Plan(graded=list(items.values()), ignored=ignored,
                    students=list(doc["students"]), roster=doc.get("roster"),
                    not_graded=not_graded, notes=notes)
    return reports, the_plan


def choose_seed(box: Store | None, given: int | None, replay: bool) -> int:
    """The seed of a run: ``given`` (``--seed``); with ``replay``, the one ``box`` keeps; the
    seed of a run that stopped (a resume); else a new secret one (a regrade meets new cases)."""
    stored = box.seed() if box is not None else None
    unfinished = box is not None and box.unfinished()
    if given is not None:
        if unfinished and stored is not None and stored != given:
            raise StoreError(
                f"the results folder {box.folder} holds an unfinished grading with seed "  # type: ignore[union-attr]
                f"{stored}; give --seed {stored} (or --replay) to go on with it, or another "
                f"folder (--resume DIR)")
        return given
    if replay:
        if stored is None:
            where = f"{box.folder} keeps none" if box is not None else "there is none here"
            raise StoreError(f"--replay grades with the seed a results folder keeps, and "
                             f"{where}; give --resume DIR, or --seed S")
        return stored
    if unfinished and stored is not None:
        return stored
    return int.from_bytes(os.urandom(8), "little")
