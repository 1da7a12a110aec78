"""The Gradescope autograder as Gradescope runs it: the bundle unpacked into
``$AUTOGRADER_ROOT/source``, ``run_autograder`` copied beside it, a submission under
``submission/`` (nested as a GitHub upload has it, or empty), ``results/results.json`` read
back. Gradescope's setup.sh (apt, pip from GitHub) cannot run here: it is checked as text
and by ``bash -n``. One real grading run (one reduced notebook)."""
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from lesson10 import scheme
from lesson10.checks import EXERCISES
from lesson10.checks.exercises import maximum
from lesson10.course.build import install_url, repository_setting
from lesson10.course.grade import gradescope, main

ROOT = Path(__file__).resolve().parent.parent
NB = "03_load_balance.ipynb"
COURSE_MAX = maximum()                  # the course file in force


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("bundle") / "autograder.zip"
    assert subprocess.run([sys.executable, "-m", "lesson10", "gradescope", str(out),
                           "--timeout", "60"], capture_output=True, text=True,
                          timeout=600).returncode == 0
    return out


def _root(tmp_path: Path, bundle: Path) -> Path:
    root = tmp_path / "autograder"
    (root / "source").mkdir(parents=True)
    with zipfile.ZipFile(bundle) as zf:
        zf.extractall(root / "source")
    shutil.copy(root / "source" / "run_autograder", root / "run_autograder")
    (root / "submission").mkdir()
    return root


def _run(root: Path, path_env=None, python=True) -> dict:
    env = dict(os.environ, AUTOGRADER_ROOT=str(root))
    env.pop("PYTHONPATH", None)
    env.pop("LESSON10_PYTHON", None)
    if python:
        env["LESSON10_PYTHON"] = sys.executable
    if path_env is not None:
        env["PATH"] = path_env
    proc = subprocess.run([shutil.which("bash"), str(root / "run_autograder")], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads((root / "results" / "results.json").read_text())


def test_bundle_layout_and_setup(bundle):
    with zipfile.ZipFile(bundle) as zf:
        names = set(zf.namelist())
        assert {"setup.sh", "run_autograder", gradescope.CONFIG, gradescope.COURSE_FILE} <= names
        assert zf.read(gradescope.COURSE_FILE).decode() == scheme.current().source.read_text()
        assert all("/" not in n for n in names)                 # at the root of the zip
        for name in ("setup.sh", "run_autograder"):
            assert (zf.getinfo(name).external_attr >> 16) & 0o111, f"{name} is not executable"
        setup = zf.read("setup.sh").decode()
        config = json.loads(zf.read(gradescope.CONFIG))
    repository, ref = repository_setting(ROOT)
    spec = f"lesson10 @ {install_url(repository, ref)}"
    assert spec in setup and config["package"] == spec and config["ref"] == ref
    assert "torch" not in setup.replace("no torch", "") and "[spmd]" not in setup
    assert "bubblewrap" in setup and "pip install" in setup
    assert config["options"] == {"timeout": 60.0}
    for name in ("setup.sh", "run_autograder"):
        text = zipfile.ZipFile(bundle).read(name).decode()
        assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_a_nested_submission(bundle, tmp_path):
    root = _root(tmp_path, bundle)
    nested = root / "submission" / "lesson10-main" / "notebooks"
    nested.mkdir(parents=True)
    solved = json.loads((ROOT / "solutions" / NB).read_text())
    solved["cells"] = [c for c in solved["cells"] if "figures." not in "".join(c["source"])]
    (nested / f"Copy of {NB}").write_text(json.dumps(solved))            # untagged Colab copy
    shutil.copy(ROOT / "notebooks" / NB, root / "submission" / NB)         # the blank original
    ckpt = nested / ".ipynb_checkpoints"
    ckpt.mkdir()
    shutil.copy(ROOT / "notebooks" / NB, ckpt / "03_load_balance-checkpoint.ipynb")
    doc = _run(root)
    assert doc["score"] == 4 and doc["max_score"] == COURSE_MAX
    assert len(doc["tests"]) == len(EXERCISES)
    assert sum(t.get("max_score", 0) for t in doc["tests"]) == COURSE_MAX
    assert doc["visibility"] == "visible" and all(t["visibility"] for t in doc["tests"])
    assert "Graded lesson10-main/notebooks/Copy of 03_load_balance.ipynb" in doc["output"]
    assert "Not graded: 03_load_balance.ipynb" in doc["output"]
    assert "Missing (0 points each): 01_sequence_parallel" in doc["output"]
    names = {t["name"]: t for t in doc["tests"]}
    assert names["03_load_balance: causal_work"]["score"] == 2
    assert names["01_sequence_parallel: reduce_scatter"]["output"].startswith("missing")
    assert isinstance(doc["extra_data"]["seed"], int)


def test_an_empty_submission_without_a_sandbox(bundle, tmp_path):
    root = _root(tmp_path, bundle)
    (root / "submission" / "answers.pdf").write_bytes(b"%PDF")
    tools = tmp_path / "bin"                 # a PATH without bwrap: the sandbox cannot start
    tools.mkdir()
    for tool in ("mkdir", "cat", "rm"):
        found = shutil.which(tool)
        if found:
            os.symlink(found, tools / tool)
    doc = _run(root, path_env=str(tools), python=False)    # the bundle's own Python is found
    assert doc["score"] == 0 and len(doc["tests"]) == len(EXERCISES)
    assert "no notebook found" in doc["output"]
    assert "Not sandboxed" in doc["output"] and "container of its own" in doc["output"]
    expected = {"optional: missing" if ex.optional else "missing" for ex in EXERCISES.values()}
    assert {t["output"].split("\n")[0] for t in doc["tests"]} == expected


def test_a_grader_error_is_shown_not_a_silent_zero(tmp_path, monkeypatch):
    from lesson10.course.grade import pipeline
    seen = {}

    def broken(request):
        seen["cwd"], seen["path"] = os.getcwd(), list(sys.path)
        raise RuntimeError("no kernel")

    monkeypatch.setattr(pipeline, "run", broken)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", str(tmp_path)] + sys.path)
    assert gradescope.run(tmp_path / "ag") == 0
    # graded from inside the submission, which nothing on sys.path points into
    assert seen["cwd"] == str((tmp_path / "ag" / "submission").resolve())
    assert "" not in seen["path"] and str(tmp_path) not in seen["path"]
    doc = json.loads((tmp_path / "ag" / "results" / "results.json").read_text())
    assert doc["output"].startswith("GRADER ERROR") and "no kernel" in doc["output"]
    assert len(doc["tests"]) == len(EXERCISES) and doc["max_score"] == COURSE_MAX


def test_run_autograder_without_the_package_still_writes_results(bundle, tmp_path):
    root = _root(tmp_path, bundle)
    env = dict(os.environ, AUTOGRADER_ROOT=str(root), LESSON10_PYTHON="/bin/false")
    proc = subprocess.run(["bash", str(root / "run_autograder")], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0
    doc = json.loads((root / "results" / "results.json").read_text())
    assert doc["score"] == 0 and "GRADER ERROR" in doc["output"]


def test_gradescope_option_refuses_a_class(tmp_path):
    for who in ("alice", "bob"):
        (tmp_path / who).mkdir()
        shutil.copy(ROOT / "notebooks" / NB, tmp_path / who / NB)
    assert main([str(tmp_path), "--gradescope", str(tmp_path / "results.json")]) == 2
    assert not (tmp_path / "results.json").exists()


def test_the_bundles_scripts_are_shell_files_that_parse(tmp_path):
    """The two scripts live as files (not strings in the module): each parses with
    ``bash -n`` as written in the bundle, and no placeholder is left in it."""
    import re
    import shutil as _shutil
    import subprocess as _subprocess
    import zipfile as _zipfile

    from lesson10.course.grade import gradescope
    assert sorted(p.name for p in gradescope.SCRIPTS.iterdir()) == ["run_autograder", "setup.sh"]
    out = gradescope.bundle(tmp_path / "b.zip", "https://example.org/x/lesson10.git", "v1")
    with _zipfile.ZipFile(out) as zf:
        for name in ("setup.sh", "run_autograder"):
            text = zf.read(name).decode()
            assert text.startswith("#!/usr/bin/env bash\n"), name
            assert not re.search(r"@[A-Z_]+@", text), name                  # every value put in
            if _shutil.which("bash"):
                (tmp_path / name).write_text(text)
                assert _subprocess.run(["bash", "-n", str(tmp_path / name)]).returncode == 0, name
    assert "@PACKAGE@" in (gradescope.SCRIPTS / "setup.sh").read_text()


def test_the_submission_is_graded_as_the_bundle_asks(tmp_path, monkeypatch):
    """run_autograder hands the pipeline a Request: one student, the bundle's options and
    seed ($LESSON10_SEED first), Gradescope's results into the private folder."""
    monkeypatch.delenv("LESSON10_SEED", raising=False)
    config = {"options": {"timeout": 60, "jobs": "2", "not_an_option": 1}, "seed": 7}
    req = gradescope.request(config, tmp_path)
    assert (req.student, req.notebooks, req.timeout, req.jobs, req.seed) == \
        ("submission", (Path("."),), 60.0, 2, 7)
    assert req.gradescope == tmp_path / "results.json" and req.output == tmp_path / "report.json"
    assert req.exercise_timeout == 30.0 and not req.no_sandbox       # the grader's defaults
    monkeypatch.setenv("LESSON10_SEED", "11")
    assert gradescope.request(config, tmp_path, sandboxed=False).seed == 11
    assert gradescope.request(config, tmp_path, sandboxed=False).no_sandbox
    with pytest.raises(ValueError):
        gradescope.request({"options": {"memory": "lots"}}, tmp_path)


def test_an_option_that_is_no_number_is_a_grader_error(tmp_path, monkeypatch):
    root = tmp_path / "ag"
    (root / "source").mkdir(parents=True)
    (root / "source" / gradescope.CONFIG).write_text(json.dumps({"options": {"memory": "lots"}}))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert gradescope.run(root) == 0
    doc = json.loads((root / "results" / "results.json").read_text())
    assert doc["output"].startswith("GRADER ERROR") and "lots" in doc["output"]
    assert doc["score"] == 0 and len(doc["tests"]) == len(EXERCISES)
