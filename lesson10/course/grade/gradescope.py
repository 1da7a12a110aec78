"""Gradescope: ``python -m lesson10 gradescope OUT.zip`` writes an autograder bundle, and
``run_autograder`` (in it) grades one submission.

The bundle holds, at the root of the zip as Gradescope wants them:

* ``setup.sh``: run once when Gradescope builds the image; installs Python, git and
  bubblewrap with apt, and the course package, pinned to the ``[release]`` repository and
  ref of the course file (``pip install "lesson10 @ git+https://github.com/OWNER/NAME@REF"``;
  no torch: grading does not need it), into a venv ``$AUTOGRADER_ROOT/lesson10-venv``;
* ``run_autograder``: run for each submission; calls :func:`run`;
* ``lesson10_autograder.json``: the pinned package and the grader's options;
* ``course.toml``: the course file in force when the bundle was written (points, optional
  exercises, term: :mod:`lesson10.scheme`), which :func:`run` pins before it grades, so the
  maximum and the hidden cases are the instructor's, never a submission's own file.

:func:`run` works under ``$AUTOGRADER_ROOT`` (default ``/autograder``): it grades the
notebooks found at any depth of ``submission/`` as one student's (one per course notebook;
copies are chosen by :data:`lesson10.course.grade.gradebook.COPY_RULE`) and writes
``results/results.json`` in Gradescope's format: every course exercise a test, the course
maximum, ``visibility`` and a top-level ``output`` (what was graded, what is missing, "no
notebook found", any grader error). Where the container has no user namespaces the
sandbox cannot start: it grades with ``--no-sandbox`` and says so (each Gradescope
submission runs in a container of its own).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from ... import scheme
from . import gradebook
from .request import Request

CONFIG = "lesson10_autograder.json"
#: the course file the bundle carries (in ``source/`` once Gradescope unpacks it)
COURSE_FILE = "course.toml"
#: grader options the bundle can fix (``--timeout 60`` ...), passed on by ``run_autograder``
OPTIONS = ("timeout", "exercise_timeout", "notebook_timeout", "memory", "jobs")

#: the bundle's two scripts, shell files of their own (``bash -n`` checks them in the tests):
#: ``setup.sh`` (the image's build: ``@PACKAGE@`` and ``@QUOTED_PACKAGE@`` stand for the pinned
#: package) and ``run_autograder`` (each submission: ``@BUILD_PYTHON@``, this Python)
SCRIPTS = Path(__file__).parent / "gradescope_files"


def script(name: str, **values: str) -> str:
    """The text of the bundle's script ``name`` with each ``@KEY@`` replaced by its value."""
    text = (SCRIPTS / name).read_text(encoding="utf-8")
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    return text


def _package_spec(repository: str, ref: str) -> str:
    from ..build import install_url
    return f"lesson10 @ {install_url(repository, ref)}"


def bundle(out: Path, repository: str, ref: str, options: dict | None = None) -> Path:
    """Write the autograder zip (``setup.sh``, ``run_autograder``, the config) to ``out``."""
    package = _package_spec(repository, ref)
    config = {"package": package, "repository": repository, "ref": ref,
              "options": {k: v for k, v in (options or {}).items() if v is not None}}
    files = {
        "setup.sh": script("setup.sh", QUOTED_PACKAGE=shlex.quote(package), PACKAGE=package),
        "run_autograder": script("run_autograder", BUILD_PYTHON=shlex.quote(sys.executable)),
        CONFIG: json.dumps(config, indent=1) + "\n",
        COURSE_FILE: scheme.current().source.read_text(encoding="utf-8"),
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in files.items():
            info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
            mode = 0o755 if name in ("setup.sh", "run_autograder") else 0o644
            info.external_attr = (0o100000 | mode) << 16          # a regular file, its mode
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, text)
    return out


# --------------------------------------------------------------------------- one submission
def _config(root: Path) -> dict:
    for where in (root / "source" / CONFIG, Path(__file__).with_name(CONFIG)):
        try:
            return json.loads(where.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
    return {}


def error_results(message: str) -> dict:
    """results.json for a grading that failed: every exercise listed at 0, and the reason."""
    from ...checks import EXERCISES
    text = (f"GRADER ERROR: {message}\nThis is not your score: the course staff will grade "
            f"the submission again.")
    tests = [{"name": f"{ex.notebook}: {ex.id}", "score": 0, "max_score": ex.points,
              "status": "failed", "output": f"not graded: {message}", "visibility": "visible"}
             for ex in EXERCISES.values()]
    return {"score": 0, "max_score": gradebook.course_max(), "output": text,
            "visibility": "visible", "stdout_visibility": "visible", "tests": tests}


def protect(root: Path) -> str:
    """Where bubblewrap cannot run (as root): the notebooks run as an unprivileged user
    (:func:`lesson10.course.grade.sandbox.student_user`, ``$LESSON10_GRADE_USER`` set for the
    grader), who may not read the package nor the bundle, nor write the results folder.
    Returns what the summary says."""
    from . import sandbox
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return ("the notebooks ran as the grader's own user (not root, so it cannot run them as "
                "another)")
    name, _, _ = sandbox.student_user()
    os.environ["LESSON10_GRADE_USER"] = name
    pkg = Path(__file__).resolve().parents[2]
    # an installed package only (setup.sh's venv): a checkout's modes are the instructor's
    tops = [root / "source"] + ([pkg] if not (pkg.parent / ".git").exists() else [])
    for top in tops:
        if top.is_dir():
            for p in [top, *top.rglob("*")]:
                try:
                    if not p.is_symlink():
                        os.chmod(p, p.stat().st_mode & 0o7770)
                except OSError:
                    pass
    os.chmod(root / "results", 0o755)
    return f"the notebooks ran as the unprivileged user {name}"


def pin_course_file(root: Path) -> scheme.Scheme:
    """The bundle's course file (``source/course.toml``), else the package's default, pinned:
    never a file of the submission (whose folder the grading runs in)."""
    bundled = Path(root) / "source" / COURSE_FILE
    return scheme.use(bundled if bundled.is_file() else scheme.DEFAULT)


def run(root: Path, out: Path | None = None) -> int:
    """Grade ``root/submission`` (see the module) into ``out``, a file of a folder only this
    user can reach; ``run_autograder`` then calls :func:`finish`, which writes
    ``results/results.json`` once this process has exited. Without ``out``: straight into
    ``results/results.json`` (in-process use)."""
    from . import pipeline, sandbox
    root = Path(root)
    submission, results = root / "submission", root / "results" / "results.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    submission.mkdir(parents=True, exist_ok=True)
    config = _config(root)
    pin_course_file(root)
    results = results.resolve()
    target = Path(out).resolve() if out is not None else results
    # the notebooks' paths as the student knows them; nothing of the submission (a numpy.py)
    # may shadow a module this process imports later
    here, sub = os.path.abspath(os.getcwd()), str(submission.resolve())
    sys.path[:] = [p for p in sys.path if p and os.path.abspath(p) != here
                   and not os.path.abspath(p).startswith(sub)]
    os.chdir(submission)
    if results.exists():
        results.unlink()
    private = Path(tempfile.mkdtemp(prefix="lesson10-gs-"))        # 0700: only this user
    why = sandbox.probe()
    user_set = "LESSON10_GRADE_USER" not in os.environ     # protect() sets it for the grading
    notes = _without_sandbox(root, why) if why and sandbox.probe_kind() != "python" else []
    for line in notes:
        print(f"run_autograder: {line}", flush=True)
    error = None
    if why and sandbox.probe_kind() == "python":
        error = f"the grader's environment is broken: {why}"
    else:
        try:
            status = pipeline.run(request(config, private, sandboxed=not notes))
            error = None if status in (0, 1) else f"the grader stopped with exit status {status}"
        except BaseException as exc:  # noqa: BLE001 - any failure must reach results.json
            error = f"{type(exc).__name__}: {exc}"
        finally:
            if user_set:
                os.environ.pop("LESSON10_GRADE_USER", None)
    try:
        doc = json.loads((private / "results.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        doc = None
    shutil.rmtree(private, ignore_errors=True)
    if not isinstance(doc, dict):
        doc = error_results(error or "the grader wrote no results")
    elif error:
        doc["output"] = f"GRADER ERROR: {error}\n" + str(doc.get("output", ""))
    if notes:
        doc["output"] = "\n".join(notes) + "\n" + str(doc.get("output", ""))
    target.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(doc.get("output", ""), flush=True)
    return 0


def _without_sandbox(root: Path, why: str) -> list[str]:
    """The notebooks will run without bubblewrap, as an unprivileged user (:func:`protect`);
    the summary's note."""
    from . import sandbox
    try:
        who = protect(root)
    except (sandbox.Unprotected, OSError) as exc:
        who = f"the notebooks could not be protected ({exc})"
    return [f"Not sandboxed: bubblewrap cannot run in this container ({why}), so the notebooks "
            f"ran without it; each Gradescope submission runs in a container of its own, and "
            f"{who}."]


def request(config: dict, private: Path, sandboxed: bool = True) -> Request:
    """The grading :class:`~.request.Request` of one submission: the current folder as one
    student's, Gradescope's results and the JSON report into ``private``, the bundle's
    options and seed (``$LESSON10_SEED`` first); raises ValueError for an option that is
    not a number."""
    given: dict[str, Any] = {key: (int if key == "jobs" else float)(value)
             for key, value in (config.get("options") or {}).items() if key in OPTIONS}
    seed = os.environ.get("LESSON10_SEED") or config.get("seed")
    return Request(notebooks=(Path("."),), student="submission",
                   gradescope=private / "results.json", output=private / "report.json",
                   seed=None if seed in (None, "") else int(seed), no_sandbox=not sandboxed,
                   **given)


def finish(root: Path, out: Path, status: int) -> int:
    """``results/results.json`` from ``out`` (what :func:`run` wrote), written here, after the
    grading process exited with ``status``: anything but 0, or no readable results, is a
    grader error, whatever the results folder holds."""
    results = Path(root) / "results" / "results.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    try:
        doc = json.loads(Path(out).read_text(encoding="utf-8"))
        if not isinstance(doc, dict) or not isinstance(doc.get("tests"), list):
            raise ValueError("not Gradescope's results")
    except (OSError, ValueError) as exc:
        doc = error_results(f"the grading process wrote no results ({type(exc).__name__}) and "
                            f"exited with status {status}")
    if status != 0:
        doc = error_results(f"the grading process ended with exit status {status} (killed?)")
    tmp = results.with_name(".results.json.tmp")
    if tmp.exists() or tmp.is_symlink():
        tmp.unlink()
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, results)
    return 0


# --------------------------------------------------------------------------- command lines
def main_bundle(argv: list[str] | None = None) -> int:
    """``python -m lesson10 gradescope OUT.zip``."""
    p = argparse.ArgumentParser(
        prog="python -m lesson10 gradescope",
        description="Write a Gradescope autograder bundle: setup.sh installs the course package "
                    "pinned to [release] of the course file (no torch), run_autograder "
                    "grades each submission's notebooks (any folder depth) into results.json.")
    p.add_argument("out", type=Path, help="the zip to write, e.g. autograder.zip")
    p.add_argument("--repository", default=None,
                   help="OWNER/NAME the package is installed from (default: the course file's [release])")
    p.add_argument("--ref", default=None, help="branch, tag or commit (default: the course file's [release])")
    p.add_argument("--root", type=Path, default=None,
                   help="the course repository holding pyproject.toml (default: this checkout)")
    p.add_argument("--timeout", type=float, default=None, help="grader's --timeout")
    p.add_argument("--exercise-timeout", type=float, default=None)
    p.add_argument("--notebook-timeout", type=float, default=None)
    p.add_argument("--memory", type=float, default=None)
    p.add_argument("-j", "--jobs", type=int, default=None)
    p.add_argument("--course", type=Path, default=None, metavar="FILE",
                   help="the course file the bundle carries (default: the one in force for the root)")
    args = p.parse_args(argv)
    from ..build import REF_RE, REPOSITORY_RE, BuildError, repo_root, repository_setting
    try:
        used = scheme.use(args.course, (args.root or repo_root()).resolve())
    except scheme.SchemeError as exc:
        print(f"gradescope: {exc}", file=sys.stderr)
        return 2
    repository, ref = args.repository, args.ref
    if repository is None or ref is None:
        try:
            setting = repository_setting((args.root or repo_root()).resolve())
        except BuildError as exc:
            print(f"gradescope: {exc}\n(give --repository OWNER/NAME and --ref REF)",
                  file=sys.stderr)
            return 2
        repository, ref = repository or setting[0], ref or setting[1]
    if not REPOSITORY_RE.match(repository) or not REF_RE.match(ref) or ".." in ref:
        print(f"gradescope: not a repository and ref: {repository!r} {ref!r}", file=sys.stderr)
        return 2
    options = {k: getattr(args, k) for k in OPTIONS}
    out = bundle(args.out, repository, ref, options)
    print(f"wrote {out}: setup.sh installs {_package_spec(repository, ref)}, with the course file "
          f"{used.source} (maximum {used.maximum}); upload it as the assignment's autograder "
          f"(Configure Autograder -> Zip file upload)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m lesson10.course.grade.gradescope run [--root DIR] [--out FILE]`` and
    ``... finish --out FILE --status N`` (what run_autograder calls)."""
    p = argparse.ArgumentParser(prog="python -m lesson10.course.grade.gradescope")
    sub = p.add_subparsers(dest="cmd", required=True)
    root = Path(os.environ.get("AUTOGRADER_ROOT") or "/autograder")
    r = sub.add_parser("run", help="grade $AUTOGRADER_ROOT/submission")
    r.add_argument("--root", type=Path, default=root)
    r.add_argument("--out", type=Path, default=None,
                   help="where to write the results (default: results/results.json)")
    f = sub.add_parser("finish", help="write results/results.json once the grading exited")
    f.add_argument("--root", type=Path, default=root)
    f.add_argument("--out", type=Path, required=True)
    f.add_argument("--status", type=int, required=True)
    args = p.parse_args(argv)
    pin_course_file(args.root)
    if args.cmd == "finish":
        return finish(args.root, args.out, args.status)
    return run(args.root, args.out)


if __name__ == "__main__":
    sys.exit(main())
