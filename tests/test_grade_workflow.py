"""The grading workflow for a student's repository (.github/workflows/grade.yml): it cannot
run here, so this parses it and runs its grading step against a fixture student repository."""
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "grade.yml"


def _workflow() -> dict:
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert "push" in (doc.get("on") or doc.get(True))          # YAML 1.1 reads `on` as True
    return doc


def _step(steps, text):
    return next(s for s in steps if text in (s.get("name", "") + s.get("uses", "")))


def test_workflow_installs_grades_and_uploads():
    steps = _workflow()["jobs"]["grade"]["steps"]
    assert _step(steps, "actions/setup-python")["with"]["python-version"]
    install = _step(steps, "Install")["run"]
    assert "pip install" in install and "${COURSE_PACKAGE}" in install
    grade = _step(steps, "Grade")["run"]
    assert "python -I -m lesson10 grade notebooks/*.ipynb" in grade
    assert '--markdown "$GITHUB_STEP_SUMMARY"' in grade
    upload = _step(steps, "actions/upload-artifact")
    assert upload["if"] == "always()" and upload["with"]["path"] == "grades/"
    for out in ("--csv grades/", "--junit grades/", "--gradescope grades/"):
        assert out in grade


def _python_shim(folder: Path) -> Path:
    """`python` on PATH: `python -I -m lesson10 ...` runs this checkout's package (the
    workflow's own install step cannot run here), anything else the test's Python."""
    folder.mkdir()
    shim = folder / "python"
    boot = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
            "from lesson10.__main__ import main; sys.exit(main())")
    shim.write_text(f'#!/bin/sh\nif [ "$1" = "-I" ] && [ "$2" = "-m" ] && [ "$3" = "lesson10" ]; then\n'
                    f'  shift 3\n  exec {sys.executable} -I -c "{boot}" "$@"\nfi\n'
                    f'exec {sys.executable} "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    return folder


def test_grading_step_on_a_student_repository(tmp_path):
    repo = tmp_path / "student-repo"
    (repo / "notebooks").mkdir(parents=True)
    shutil.copy(ROOT / "solutions" / "03_load_balance.ipynb", repo / "notebooks")
    shutil.copy(ROOT / "notebooks" / "06_multiprocess.ipynb", repo / "notebooks")  # no exercises
    summary = tmp_path / "summary.md"
    env = dict(os.environ, GITHUB_STEP_SUMMARY=str(summary),
               PATH=f"{_python_shim(tmp_path / 'bin')}{os.pathsep}{os.environ['PATH']}")
    env.pop("PYTHONPATH", None)
    run = _step(_workflow()["jobs"]["grade"]["steps"], "Grade")["run"]
    proc = subprocess.run(["bash", "-e", "-c", run], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    grades = repo / "grades"
    assert "## Score: 4 / 4" in summary.read_text()
    assert json.loads((grades / "results.json").read_text())["score"] == 4
    rows = (grades / "grades.csv").read_text().splitlines()
    assert rows == ["student,zigzag_positions,causal_work,ring_time,total,max", "notebooks,1,2,1,4,4"]
    assert "<testcase" in (grades / "junit.xml").read_text()
    assert (grades / "executed" / "notebooks" / "03_load_balance.ipynb").is_file()
    report = json.loads((grades / "report.json").read_text())
    assert [r["course_notebook"] for r in report["notebooks"]] == ["03_load_balance", "06_multiprocess"]
