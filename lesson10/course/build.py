"""``python -m lesson10 build [--check]``: write the exercise notebooks from the solutions.

``solutions/*.ipynb`` are the source of truth. For each of them the build writes
``notebooks/<same name>`` where every region

    ### BEGIN SOLUTION
    ...
    ### END SOLUTION

of a code cell is replaced by ``raise NotImplementedError(...)`` at the indentation
of the ``### BEGIN SOLUTION`` line (so a function's signature and docstring, written
outside the region, stay). Outputs, execution counts and execution metadata are
removed from both trees, and the JSON is written in one canonical form (sorted keys),
so building twice gives the same bytes. Only the standard library is used (the JSON is
written exactly as ``nbformat.write`` writes it), so ``build --check`` runs anywhere.

The build also writes each notebook's Colab badge (first line of the first cell) and its
install cell (the first code cell) from ``[release]`` of the course file in force
(:mod:`lesson10.scheme`; ``--course FILE``) and the package's version in ``pyproject.toml``::

    [release]                     # course.toml
    repository = "owner/name"     # the GitHub repository that Colab opens and pip installs
    ref = "v0.2.0"                # branch, tag or commit: a release's tag

The install cell installs ``git+https://github.com/OWNER/NAME@REF`` wherever lesson10 is
not installed or is older than ``version`` (Colab, Kaggle, a local Jupyter, Binder), and does
nothing where it is installed and new enough. It never forces a reinstall: pip installs what
is missing and keeps every installed package that meets lesson10's requirements, so in Colab it
adds lesson10 and changes nothing else; after a release (a new version and tag) the same cell
updates lesson10 alone. A notebook that uses torch (``lesson10.spmd``) asks for the ``spmd``
extra, and only where torch is missing.

``--check`` writes nothing: it exits with status 1 and lists every file that the
build would change (a stale or missing exercise notebook, a solution with outputs,
a badge or install cell that disagrees with the setting, an exercise notebook with no
solution).
"""
from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path

if __package__:
    from .. import scheme
else:                       # python lesson10/course/build.py: no package, the loader by its path
    import importlib.util
    _spec = importlib.util.spec_from_file_location("lesson10_scheme", Path(__file__).parents[1] / "scheme.py")
    scheme = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
    sys.modules["lesson10_scheme"] = scheme
    _spec.loader.exec_module(scheme)  # type: ignore[union-attr]

#: the Classroom template (the student repository's) and its workflow
TEMPLATE = Path("classroom")
WORKFLOW = Path(".github") / "workflows" / "classroom.yml"
BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
STUB = 'raise NotImplementedError("your code here: replace this line")'
_BEGIN_RE = re.compile(r"^(\s*)### BEGIN SOLUTION\s*$")
_END_RE = re.compile(r"^\s*### END SOLUTION\s*$")
#: cell metadata that records a run, not content
_RUN_METADATA = ("execution", "ExecuteTime", "collapsed", "scrolled", "jupyter")


class BuildError(ValueError):
    """A solution notebook cannot be turned into an exercise notebook."""


def repo_root() -> Path:
    """The folder holding ``solutions/`` and ``notebooks/`` (the repository root)."""
    return Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- the repository setting
REPOSITORY_RE, REF_RE = scheme.REPOSITORY_RE, scheme.REF_RE
BADGE_PREFIX = "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
INSTALL_MARK = "# Install the course package"
#: first lines of install cells that earlier builds wrote (replaced, not duplicated)
OLD_INSTALL_MARKS = ("# Colab only:",)
#: what a notebook imports that needs torch, the ``spmd`` extra
_NEEDS_TORCH_RE = re.compile(r"^\s*(import torch|from torch[\s.]|(from|import) lesson10\.(spmd|bench|runs?)\b)", re.M)


def _toml_section(text: str, section: str) -> dict:
    """One ``[section]`` of a TOML file (:func:`lesson10.scheme.parse`)."""
    node: object = scheme.parse(text)
    for part in section.split("."):
        node = node.get(part, {}) if isinstance(node, dict) else {}
    return node if isinstance(node, dict) else {}


def repository_setting(root: Path) -> tuple[str, str]:
    """``(repository, ref)``: ``[release]`` of the course file in force for ``root``
    (:func:`lesson10.scheme.at`)."""
    try:
        found = scheme.at(root)
    except scheme.SchemeError as exc:
        raise BuildError(str(exc)) from None
    return found.repository, found.ref


def workflow_text(root: Path, repository: str, ref: str) -> str:
    """The template with COURSE_PACKAGE pinned to ``repository@ref`` and the last-resort
    fallback's ``max_score`` set to the maximum of the course file in force for ``root``
    (0 would make the reporter post nothing); ``build`` keeps the committed one so."""
    course_max = scheme.at(root).maximum
    text = (root / TEMPLATE / WORKFLOW).read_text(encoding="utf-8")
    line = f'  COURSE_PACKAGE: "lesson10 @ {install_url(repository, ref)}"'
    new, n = re.subn(r'^  COURSE_PACKAGE: .*$', line, text, count=1, flags=re.MULTILINE)
    if n != 1:
        raise BuildError("classroom/.github/workflows/classroom.yml has no COURSE_PACKAGE line")
    lines = new.split("\n")
    for i, text_line in enumerate(lines):
        if "printf" in text_line and '"max_score"' in text_line:
            lines[i] = re.sub(r'"max_score": \d+', f'"max_score": {course_max}', text_line)
    return "\n".join(lines)


def install_url(repository: str, ref: str) -> str:
    """What the install cell gives to pip: ``git+https://github.com/OWNER/NAME@REF``."""
    return f"git+https://github.com/{repository}@{ref}"


def badge_line(repository: str, ref: str, name: str) -> str:
    """The Colab badge of ``notebooks/<name>`` (Colab opens the exercise notebook)."""
    return (f"{BADGE_PREFIX}(https://colab.research.google.com/github/{repository}/blob/{ref}/"
            f"notebooks/{name})")


def version_setting(root: Path) -> str | None:
    """``[project] version`` of ``root/pyproject.toml`` (None where there is none)."""
    path = root / "pyproject.toml"
    if not path.is_file():
        return None
    version = _toml_section(path.read_text(encoding="utf-8"), "project").get("version")
    if version is not None and not (isinstance(version, str) and re.match(r"^\d+(\.\d+)*\S*$", version)):
        raise BuildError(f"{path}: [project] version must be a version number like 0.2.0, got {version!r}")
    return version


def notebook_extra(nb: dict) -> str | None:
    """``"spmd"`` for a notebook whose code imports torch or ``lesson10.spmd`` (``bench``,
    ``run``), else None. The install cell itself is not looked at."""
    for cell in nb.get("cells", []):
        src = _source(cell)
        if cell.get("cell_type") == "code" and not _is_install_cell(src) and _NEEDS_TORCH_RE.search(src):
            return "spmd"
    return None


def _is_install_cell(source: str) -> bool:
    return source.startswith((INSTALL_MARK,) + OLD_INSTALL_MARKS)


def _install_cell_template() -> str:
    """The install cell's text, with ``{url}``, ``{needs}``, ``{extra_note}`` and ``{extra_args}``
    to fill in (a function, not a module constant: the grader's stand-in package copies module
    constants, and it must carry no code)."""
    return """\
# Install the course package where it is missing or older than this notebook needs (Colab, Kaggle,
# a local Jupyter, Binder: a few seconds). It adds lesson10 and changes nothing else: the numpy,
# matplotlib and ipywidgets already there (Colab's ipywidgets 7.7.1 too) meet its requirements.
# Where lesson10 {needs} or newer is installed, this cell does nothing.{extra_note}
def _install_lesson10(url, needs, extra=None, unless=None):
    import importlib, importlib.metadata, importlib.util, os, re, site, subprocess, sys

    def installed():
        try:
            return importlib.metadata.version("lesson10")
        except importlib.metadata.PackageNotFoundError:
            return None

    def numbers(version):
        return [int(x) for x in re.findall(r"\\d+", version)[:3]]

    have = installed()
    missing_extra = extra is not None and importlib.util.find_spec(unless) is None
    spec = importlib.util.find_spec("lesson10")      # a folder named lesson10 (a clone) is no package
    checkout = spec is not None and (spec.origin or "").endswith("__init__.py")
    if have is None and checkout and not missing_extra:
        print("lesson10 is importable here without being installed (a source checkout): using it as it is")
        return
    if have is not None and numbers(have) >= numbers(needs) and not missing_extra:
        print(f"lesson10 {{have}} is installed: nothing to do")
        return
    target = f"lesson10[{{extra}}] @ {{url}}" if missing_extra else url
    if subprocess.run([sys.executable, "-m", "pip", "install", "-q", target]).returncode != 0:
        local = "/path/to/clone" + (f"[{{extra}}]" if missing_extra else "")
        print(f"pip could not install lesson10 from {{url}} (no network here, or that address "
              f"cannot be reached), so install it from a local copy instead: "
              f'pip install -e "{{local}}" (a clone of the course repository) or pip install '
              f"a lesson10 wheel, then run this cell again.")
        return
    for name in [m for m in sys.modules if m == "lesson10" or m.startswith("lesson10.")]:
        del sys.modules[name]                # an older lesson10 imported before: the next import is the new one
    user_site = site.getusersitepackages()   # pip's --user fallback: a folder made just now is not on sys.path yet
    if os.path.isdir(user_site) and user_site not in sys.path:
        site.addsitedir(user_site)
    importlib.invalidate_caches()
    print(f"installed lesson10 {{installed()}}" + (f" (was {{have}})" if have else "")
          + (f" with {{unless}} (the {{extra}} extra)" if missing_extra else ""))


_install_lesson10("{url}", "{needs}"{extra_args})"""


def install_cell_source(repository: str, ref: str, version: str | None = None,
                        extra: str | None = None) -> str:
    """The first code cell of every notebook: pip installs ``install_url(repository, ref)``
    where lesson10 is missing or older than ``version`` (None: only where it is missing);
    with ``extra="spmd"``, ``lesson10[spmd]`` where torch is missing."""
    needs = version or "0"
    note = (f"\n# This notebook also needs PyTorch: where torch is missing, the cell installs "
            f"lesson10[{extra}] (it brings torch).") if extra else ""
    args = f', extra="{extra}", unless="torch"' if extra else ""
    return _install_cell_template().format(url=install_url(repository, ref), needs=needs, extra_note=note,
                               extra_args=args)


def apply_repository(nb: dict, name: str, repository: str, ref: str, version: str | None = None) -> dict:
    """A copy of ``nb`` whose first cell starts with the badge and whose first code cell is the
    install cell (added when missing, replaced when it starts with an install cell's mark)."""
    nb = copy.deepcopy(nb)
    extra = notebook_extra(nb)
    cells = nb["cells"]
    if not cells or cells[0]["cell_type"] != "markdown":
        raise BuildError(f"{name}: the first cell must be a markdown cell (it carries the Colab badge)")
    first = _source(cells[0])
    head, sep, rest = first.partition("\n")
    if head.startswith(BADGE_PREFIX):
        first = rest.lstrip("\n")
    cells[0]["source"] = badge_line(repository, ref, name) + "\n\n" + first
    install = install_cell_source(repository, ref, version, extra)
    index = next((i for i, c in enumerate(cells) if c["cell_type"] == "code"), len(cells))
    if index < len(cells) and _is_install_cell(_source(cells[index])):
        cells[index]["source"] = install
    else:
        cell: dict = {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                "source": install}
        if nb.get("nbformat_minor", 0) >= 5:            # nbformat 4.5+ cells carry a unique id
            taken = {c.get("id") for c in cells}
            cell["id"] = next(f"colab-install-{i}" if i else "colab-install" for i in range(len(cells) + 1)
                              if (f"colab-install-{i}" if i else "colab-install") not in taken)
        cells.insert(index, cell)
    return nb


def _badge_and_install(text: str) -> tuple[str, str]:
    nb = json.loads(text)
    cells = nb["cells"]
    return (_source(cells[0]).split("\n", 1)[0],
            next((_source(c) for c in cells if c["cell_type"] == "code"), ""))


def _repository_problem(path: Path, wanted: str) -> str | None:
    """Why a notebook file's badge or install cell disagrees with what the build writes from
    the setting (None: they agree, or the file cannot be read)."""
    try:
        badge, install = _badge_and_install(path.read_text(encoding="utf-8"))
        want_badge, want_install = _badge_and_install(wanted)
    except Exception:  # noqa: BLE001 - an unreadable file is reported by the plain comparison
        return None
    if badge != want_badge:
        return "Colab badge"
    if install != want_install:
        return "install cell"
    return None


def strip_solutions(source: str, where: str = "cell") -> str:
    """Replace each ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` region with a stub that
    raises ``NotImplementedError``, indented like the BEGIN line."""
    out: list[str] = []
    inside = False
    for number, line in enumerate(source.split("\n"), start=1):
        begin = _BEGIN_RE.match(line)
        if begin:
            if inside:
                raise BuildError(f"{where}, line {number}: '{BEGIN}' inside another solution region; "
                                 f"close the first one with '{END}'")
            inside = True
            out.append(begin.group(1) + STUB)
            continue
        if _END_RE.match(line):
            if not inside:
                raise BuildError(f"{where}, line {number}: '{END}' without a '{BEGIN}' before it")
            inside = False
            continue
        if BEGIN in line or END in line:
            raise BuildError(f"{where}, line {number}: the markers must stand alone on their line "
                             f"(got {line.strip()!r})")
        if not inside:
            out.append(line)
    if inside:
        raise BuildError(f"{where}: '{BEGIN}' is never closed by '{END}'")
    return "\n".join(out)


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def clean(nb: dict) -> dict:
    """A copy without outputs, execution counts or run metadata (a notebook as a dict)."""
    nb = copy.deepcopy(nb)
    nb.get("metadata", {}).pop("widgets", None)          # saved widget state is output, too
    for key in ("orig_nbformat", "orig_nbformat_minor", "signature"):
        nb.get("metadata", {}).pop(key, None)
    for cell in nb["cells"]:
        cell["source"] = _source(cell)
        meta = cell.setdefault("metadata", {})
        for key in _RUN_METADATA + ("trusted",):
            meta.pop(key, None)
        if cell["cell_type"] == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    return nb


def exercise_notebook(solution: dict, name: str = "notebook") -> dict:
    """The exercise notebook for a solution notebook."""
    nb = clean(solution)
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            cell["source"] = strip_solutions(cell["source"], where=f"{name}, cell {index}")
        elif BEGIN in cell["source"]:
            raise BuildError(f"{name}, cell {index}: solution markers are only allowed in code cells")
    return nb


def tag_notebook(nb: dict, notebook_id: str) -> dict:
    """Write the course notebook id into ``metadata["lesson10"]["notebook"]``: the grader
    reads it to know which exercises a submission is graded on, whatever its file name."""
    nb.setdefault("metadata", {}).setdefault("lesson10", {})["notebook"] = notebook_id
    return nb


def dumps(nb: dict) -> str:
    """Canonical text of a notebook: nbformat's layout (sources split into lines, sorted
    keys, indent 1), one newline at the end."""
    nb = copy.deepcopy(nb)
    for cell in nb["cells"]:
        cell["source"] = _source(cell).splitlines(True)
    text = json.dumps(nb, indent=1, sort_keys=True, separators=(",", ": "), ensure_ascii=False)
    return text + "\n"


def _read(path: Path) -> dict:
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
        if nb.get("nbformat") != 4 or not isinstance(nb.get("cells"), list):
            raise ValueError(f"not an nbformat 4 notebook (nbformat = {nb.get('nbformat')!r})")
        return nb
    except Exception as exc:  # report which file is broken
        raise BuildError(f"{path}: cannot read the notebook ({type(exc).__name__}: {exc})") from exc


def plan(root: Path) -> dict[Path, str]:
    """Every file the build owns, with the text it should have."""
    solutions, notebooks = root / "solutions", root / "notebooks"
    if not solutions.is_dir():
        raise BuildError(f"no solutions/ folder in {root}")
    repository, ref = repository_setting(root)
    version = version_setting(root)
    files: dict[Path, str] = {}
    for path in sorted(solutions.glob("*.ipynb")):
        nb = apply_repository(_read(path), path.name, repository, ref, version)
        files[path] = dumps(clean(nb))
        files[notebooks / path.name] = dumps(tag_notebook(exercise_notebook(nb, name=path.name),
                                                          path.stem))
    if (root / TEMPLATE / WORKFLOW).is_file():     # the Classroom template: package and maximum
        files[root / TEMPLATE / WORKFLOW] = workflow_text(root, repository, ref)
    return files


def stale(root: Path) -> list[str]:
    """Files that differ from what the build would write (relative paths, with a reason)."""
    problems = []
    wanted = plan(root)
    repository, ref = repository_setting(root)
    for path, text in wanted.items():
        rel = path.relative_to(root)
        if not path.exists():
            problems.append(f"{rel} (missing)")
        elif path.read_text(encoding="utf-8") != text:
            wrong = _repository_problem(path, text)
            if path.suffix != ".ipynb":
                what = (f"its COURSE_PACKAGE or max_score disagrees with {repository}@{ref} and "
                        f"the maximum {scheme.at(root).maximum} of {scheme.at(root).source}")
            elif wrong:
                what = (f"its {wrong} disagrees with [release] {repository}@{ref} of "
                        f"{scheme.at(root).source} (version {version_setting(root)} in pyproject.toml)")
            elif path.parent.name == "solutions":
                what = "has outputs or is not in canonical form"
            else:
                what = "differs from the build of solutions/" + path.name
            problems.append(f"{rel} ({what})")
    notebooks = root / "notebooks"
    if notebooks.is_dir():
        for path in sorted(notebooks.glob("*.ipynb")):
            if path not in wanted:
                problems.append(f"{path.relative_to(root)} (no solutions/{path.name})")
    return problems


def build(root: Path) -> list[Path]:
    """Write every stale file; return the paths written."""
    written = []
    wanted = plan(root)
    (root / "notebooks").mkdir(exist_ok=True)
    for path, text in wanted.items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lesson10 build",
        description="Write notebooks/ from solutions/ (solution regions replaced by stubs, "
                    "outputs removed).")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 and list the files the build would change")
    parser.add_argument("--root", type=Path, default=None,
                        help="folder holding solutions/ and notebooks/ (default: the repository)")
    parser.add_argument("--course", type=Path, default=None, metavar="FILE",
                        help="the course file (default: $LESSON10_COURSE, else the nearest "
                             "course.toml from the root up, else the package's default)")
    args = parser.parse_args(argv)
    root = (args.root or repo_root()).resolve()
    try:
        scheme.use(args.course, root)
        if args.check:
            problems = stale(root)
            if problems:
                print("stale (run `python -m lesson10 build`):", file=sys.stderr)
                for line in problems:
                    print(f"  {line}", file=sys.stderr)
                return 1
            print(f"up to date: {sum(p.suffix == '.ipynb' for p in plan(root)) // 2} notebooks "
                  f"(course file {scheme.at(root).source})")
            return 0
        written = build(root)
    except (BuildError, scheme.SchemeError) as exc:
        print(f"build failed: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path.relative_to(root)}")
    if not written:
        print("nothing to do: notebooks/ is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
