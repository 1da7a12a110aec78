"""``python -m lesson10 release DIR``: write the student-facing repository.

The course repository holds the solutions; students must not see them. The release is
what they get (and what GitHub Classroom copies for each of them, and what Colab opens and
pip installs: point ``[release] repository`` of the course file at it)::

    DIR/
      lesson10/                    the package (pure Python: checks, simulation, grader, ...)
      notebooks/*.ipynb            the exercise notebooks, built from solutions/ right now
      pyproject.toml               so that `pip install git+https://github.com/OWNER/NAME@REF` works
      README.md                    for students (classroom/README.md, with a badge per notebook)
      .github/workflows/classroom.yml   GitHub Classroom's autograding (classroom/ of the course)
      course.toml                  the course file in force (points, optional, term): the
                                   check cells and the workflow's grader read it there
      .gitignore, .lesson10-release.json

There is no ``solutions/``, no test (the answer suites are answers) and no solution cell:
the release refuses to finish if a notebook still holds a solution marker or the code of
a solution region.

``DIR`` may be new, empty, or an earlier release (a clone of the student repository: its
``.git`` is kept, everything else is written anew); anything else needs ``--force``.

``release --self-study DIR`` writes the self-study edition instead (:mod:`.selfstudy`): each
exercise followed by its solution, folded, and no grading files; it refuses a graded release.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

from .. import __version__, scheme
from ..errors import Lesson10Error
from . import selfstudy
from .build import (
    BEGIN,
    END,
    TEMPLATE,
    WORKFLOW,
    BuildError,
    badge_line,
    install_url,
    plan,
    repo_root,
    repository_setting,
    workflow_text,
)

MARKER = ".lesson10-release.json"

NOTEBOOKS_MARK = "<!-- lesson10:notebooks -->"
GITIGNORE = """\
.venv/
__pycache__/
*.egg-info/
.ipynb_checkpoints/
grades/
"""
#: what of the package a release leaves out
_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", "*.egg-info", ".pytest_cache")


class ReleaseError(Lesson10Error, ValueError):
    """The release cannot be written (or would show a solution)."""


def _solution_regions(root: Path) -> list[tuple[str, str]]:
    """``(notebook, body)`` of every solution region in ``solutions/`` (markers excluded)."""
    out = []
    for path in sorted((root / "solutions").glob("*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        for cell in nb.get("cells", []):
            if cell.get("cell_type") != "code":
                continue
            src = cell.get("source", "")
            src = "".join(src) if isinstance(src, list) else src
            for m in re.finditer(rf"^[ \t]*{re.escape(BEGIN)}[ \t]*\n(.*?)^[ \t]*{re.escape(END)}",
                                 src, re.MULTILINE | re.DOTALL):
                body = "\n".join(line.strip() for line in m.group(1).splitlines() if line.strip())
                if body:
                    out.append((path.name, body))
    return out


def _cells(text: str) -> list[str]:
    nb = json.loads(text)
    return ["".join(c["source"]) if isinstance(c.get("source"), list) else str(c.get("source", ""))
            for c in nb.get("cells", [])]


def leaks(folder: Path, regions: list[tuple[str, str]]) -> list[str]:
    """What of a solution a release folder shows: a ``solutions/`` folder, a notebook with a
    solution marker, or a notebook cell holding the code of a solution region."""
    found = []
    for p in folder.rglob("*"):
        if p.is_dir() and p.name == "solutions":
            found.append(f"{p.relative_to(folder)}/ (a solutions folder)")
    for nb in sorted(folder.rglob("*.ipynb")):
        rel = nb.relative_to(folder)
        try:
            cells = _cells(nb.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            found.append(f"{rel} (not a readable notebook)")
            continue
        for i, src in enumerate(cells):
            if BEGIN in src or END in src:
                found.append(f"{rel}, cell {i}: a solution marker")
            squeezed = "\n".join(line.strip() for line in src.splitlines() if line.strip())
            for name, body in regions:
                if body in squeezed:
                    found.append(f"{rel}, cell {i}: the code of a solution region of {name}")
                    break
    return found


def _clear(folder: Path) -> None:
    for p in folder.iterdir():
        if p.name == ".git":
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


#: what ``[release]`` of the package's default course file says (the project's repository)
DEFAULT_REPOSITORY = "lesson10-course/lesson10"
DEFAULT_REF = f"v{__version__}"


def default_warnings(repository: str, ref: str) -> list[str]:
    """What to tell an instructor whose course file's ``[release]`` still names the defaults:
    students would install the course package and open Colab from the course's project,
    not from the instructor's student repository."""
    out = []
    if repository == DEFAULT_REPOSITORY:
        out.append(f"release.repository is still the default {DEFAULT_REPOSITORY!r}: "
                   f"the badges, the install cells and the Classroom workflow point there, not "
                   f"at your student repository; set [release] repository = \"OWNER/NAME\" in "
                   f"course.toml and release again")
    if ref in (DEFAULT_REF, "main"):
        out.append(f"release.ref is still the default {ref!r}: the workflow installs "
                   f"the grader from that ref, so push the release and tag it, then set ref to "
                   f"that tag (a moving branch regrades with whatever it holds later)")
    return out


def workflow_problem(root: Path) -> str | None:
    """Why the committed template disagrees with the course file (None: it agrees)."""
    repository, ref = repository_setting(root)
    path = root / TEMPLATE / WORKFLOW
    if path.read_text(encoding="utf-8") != workflow_text(root, repository, ref):
        return (f"{path.relative_to(root)} does not install {install_url(repository, ref)} with "
                f"the maximum {scheme.at(root).maximum}")
    return None


def _readme(root: Path, repository: str, ref: str, names: list[str]) -> str:
    text = (root / TEMPLATE / "README.md").read_text(encoding="utf-8")
    rows = ["| notebook | open |", "|---|---|"]
    rows += [f"| `notebooks/{n}` | {badge_line(repository, ref, n)} |" for n in names]
    table = "\n".join(rows)
    if NOTEBOOKS_MARK in text:
        return text.replace(NOTEBOOKS_MARK, table)
    return text + "\n" + table + "\n"


def check_folder(folder: Path, root: Path, force: bool) -> None:
    """Refuse a ``folder`` inside the course repository, a file, or a folder that holds
    something other than an earlier release (unless ``force``)."""
    if folder.resolve() == root or root in folder.resolve().parents:
        raise ReleaseError(f"{folder} is inside the course repository: write the release elsewhere")
    if folder.exists():
        if not folder.is_dir():
            raise ReleaseError(f"{folder} is not a folder")
        entries = [p for p in folder.iterdir() if p.name != ".git"]
        if entries and not (folder / MARKER).is_file() and not force:
            raise ReleaseError(f"{folder} is not empty and holds no earlier release ({MARKER}); "
                               f"use --force to replace what is there (.git is kept)")


def release(folder: Path, root: Path | None = None, force: bool = False) -> list[Path]:
    """Write the student repository into ``folder``; returns the files written."""
    root = (root or repo_root()).resolve()
    folder = Path(folder)
    check_folder(folder, root, force)
    try:
        repository, ref = repository_setting(root)
        built = plan(root)
    except BuildError as exc:
        raise ReleaseError(str(exc)) from None
    notebooks = {p.name: text for p, text in built.items() if p.parent.name == "notebooks"}
    if not notebooks:
        raise ReleaseError(f"no notebooks to release: {root / 'solutions'} holds none")
    files = {
        "pyproject.toml": (root / "pyproject.toml").read_text(encoding="utf-8"),
        "README.md": _readme(root, repository, ref, sorted(notebooks)),
        ".gitignore": GITIGNORE,
        WORKFLOW.as_posix(): workflow_text(root, repository, ref),
        # the course file: the check cells, the Classroom workflow and Gradescope read it there
        scheme.FILE_NAME: scheme.at(root).source.read_text(encoding="utf-8"),
        MARKER: json.dumps({"version": __version__, "repository": repository, "ref": ref},
                           indent=1) + "\n",
    }
    for name, text in sorted(notebooks.items()):
        files[f"notebooks/{name}"] = text
    template = root / TEMPLATE
    for p in sorted(template.rglob("*")):            # anything else the template holds
        rel = p.relative_to(template).as_posix()
        if p.is_file() and rel not in files and rel != "README.md":
            files[rel] = p.read_text(encoding="utf-8")
    written = _write(folder, root, files)
    found = leaks(folder, _solution_regions(root))
    if found:
        raise ReleaseError("the release would show solutions:\n  " + "\n  ".join(found))
    return written


def _write(folder: Path, root: Path, files: dict[str, str]) -> list[Path]:
    """``folder`` emptied (but .git), the package copied in and ``files`` (path -> text)
    written; returns what was written."""
    folder.mkdir(parents=True, exist_ok=True)
    _clear(folder)
    shutil.copytree(root / "lesson10", folder / "lesson10", ignore=_SKIP)
    for rel, text in files.items():
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return [folder / rel for rel in files] + [folder / "lesson10"]


def _edition(folder: Path) -> str | None:
    """What an earlier release in ``folder`` is: None (none), ``"graded"`` or its edition."""
    marker = folder / MARKER
    if not marker.is_file():
        return None
    try:
        edition = json.loads(marker.read_text(encoding="utf-8")).get("edition", "graded")
    except (OSError, ValueError, AttributeError):
        return "graded"
    return str(edition)


def self_study(folder: Path, root: Path | None = None, force: bool = False) -> list[Path]:
    """Write the self-study edition (:mod:`.selfstudy`: each exercise followed by its solution,
    folded; no grading files) into ``folder``; returns the files written. A graded release
    there is refused without ``force``: its class would see the solutions."""
    root = (root or repo_root()).resolve()
    folder = Path(folder)
    check_folder(folder, root, force)
    if not force and _edition(folder) not in (None, selfstudy.EDITION):
        raise ReleaseError(f"{folder} holds a graded release (the student repository): the "
                           f"self-study edition would show its class the solutions; write it "
                           f"elsewhere, or use --force to replace it")
    try:
        files = selfstudy.files(plan(root))
    except (BuildError, selfstudy.EditionError) as exc:
        raise ReleaseError(str(exc)) from None
    files.update({"pyproject.toml": (root / "pyproject.toml").read_text(encoding="utf-8"),
                  ".gitignore": GITIGNORE,
                  MARKER: json.dumps({"version": __version__, "edition": selfstudy.EDITION}, indent=1) + "\n"})
    return _write(folder, root, files)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m lesson10 release",
        description="Write the student repository (the package, notebooks/, a README for "
                    "students, the GitHub Classroom workflow) without solutions/ or any "
                    "solution cell.")
    p.add_argument("folder", type=Path, help="where to write it (new, empty, or an earlier "
                                             "release: its .git is kept)")
    p.add_argument("--root", type=Path, default=None,
                   help="the course repository (default: this checkout)")
    p.add_argument("--force", action="store_true",
                   help="replace whatever the folder holds (but .git)")
    p.add_argument("--course", type=Path, default=None, metavar="FILE",
                   help="the course file (default: $LESSON10_COURSE, else the nearest "
                        "course.toml from the root up, else the package's default)")
    p.add_argument("--self-study", action="store_true",
                   help="write the self-study edition instead: each exercise followed by its "
                        "solution, folded; no grading files (lesson10.course.selfstudy)")
    args = p.parse_args(argv)
    try:
        used = scheme.use(args.course, (args.root or repo_root()).resolve())
    except scheme.SchemeError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 2
    if args.self_study:
        return _self_study(args.folder, args.root, args.force)
    try:
        written = release(args.folder, args.root, args.force)
    except ReleaseError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 2
    print(f"release: course file {used.source}: maximum {used.maximum}, term {used.term}")
    repository, ref = repository_setting((args.root or repo_root()).resolve())
    for warning in default_warnings(repository, ref):
        print(f"release: warning: {warning}", file=sys.stderr)
    n = sum(1 for w in written if w.suffix == ".ipynb")
    print(f"wrote {args.folder}: {n} notebooks, the lesson10 package, README.md and "
          f".github/workflows/classroom.yml (installs {install_url(repository, ref)}); "
          f"no solutions. Push it to {repository} at {ref}.")
    return 0


def _self_study(folder: Path, root: Path | None, force: bool) -> int:
    try:
        written = self_study(folder, root, force)
    except ReleaseError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 2
    n = sum(1 for w in written if w.suffix == ".ipynb")
    print(f"wrote {folder}: the self-study edition, {n} notebooks with folded solutions, the "
          f"lesson10 package and README.md; no grading files. Do not push it to the class's "
          f"repository.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
