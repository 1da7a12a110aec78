"""The GitHub Classroom workflow of the student repository
(classroom/.github/workflows/classroom.yml, which `release` copies): a GitHub Action cannot
run here, so this parses it, checks what GitHub Classroom and the reporter action need,
runs its grading step's shell against a fixture student repository and decodes what the
reporter would read from the step output."""
import base64
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from lesson10.checks.exercises import maximum
from lesson10.course.build import install_url, repository_setting

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / "classroom" / ".github" / "workflows" / "classroom.yml"
COURSE_MAX = maximum()                  # the course file in force
#: the current major of each action the workflow uses (looked up when this was written)
CURRENT_MAJORS = {"actions/checkout": 7, "actions/setup-python": 7, "actions/upload-artifact": 7,
                  "classroom-resources/autograding-grading-reporter": 1}


def _workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def _job() -> dict:
    jobs = _workflow()["jobs"]
    assert len(jobs) == 1
    return next(iter(jobs.values()))


def _step(text):
    return next(s for s in _job()["steps"] if text in (s.get("name", "") + s.get("uses", "")))


def test_no_grading_workflow_is_active_in_the_course_repository():
    active = ROOT / ".github" / "workflows"
    for f in (active.glob("*.y*ml") if active.is_dir() else []):
        assert "lesson10 grade" not in f.read_text(), f"{f} would grade the course's blank notebooks"


def test_what_classroom_and_the_reporter_need():
    doc = _workflow()
    triggers = doc.get("on") or doc.get(True)              # YAML 1.1 reads `on` as True
    assert {"push", "workflow_dispatch", "repository_dispatch"} <= set(triggers)
    job = _job()
    assert doc["name"] == "Autograding Tests"
    # reporter v1 updates the job's check run (found by this name) with the points
    assert job["name"] == "run-autograding-tests"
    perms = {**(doc.get("permissions") or {}), **(job.get("permissions") or {})}
    # test_grade_classroom_permissions checks every call of the reporter against these
    assert perms.get("checks") == "write" and perms.get("contents") == "read"
    assert "github-classroom[bot]" in job["if"] and "!=" in job["if"]
    reporter = _step("autograding-grading-reporter")
    runners = [r.strip() for r in reporter["with"]["runners"].split(",")]
    grading = _step("Grade")
    assert runners == [grading["id"]]
    for rid in runners:                        # the reporter reads <ID>_RESULTS (upper case)
        value = reporter["env"][f"{rid.upper()}_RESULTS"]
        assert re.fullmatch(r"\$\{\{\s*steps\." + re.escape(rid) + r"\.outputs\.result\s*\}\}",
                            value), value
    assert reporter["if"] == "always()" and "GITHUB_TOKEN" in reporter["env"]


def test_current_action_majors():
    seen = {}
    for s in _job()["steps"]:
        if "uses" in s:
            name, _, version = s["uses"].partition("@")
            seen[name] = int(version.lstrip("v").split(".")[0])
    for name, major in CURRENT_MAJORS.items():
        assert seen.get(name, 0) >= major, f"{name}@v{seen.get(name)}: the current major is v{major}"


def test_installs_the_pinned_package_without_torch():
    repository, ref = repository_setting(ROOT)
    assert _workflow()["env"]["COURSE_PACKAGE"] == f"lesson10 @ {install_url(repository, ref)}"
    install = _step("Install the course package")["run"]
    assert "${COURSE_PACKAGE}" in install
    text = WORKFLOW.read_text()
    assert "download.pytorch.org" not in text and "[spmd]" not in text
    assert not re.search(r"pip install[^\n]*\btorch\b", text)
    sandbox = _step("bubblewrap")["run"]
    assert "apt-get install" in sandbox and "apparmor_restrict_unprivileged_userns=0" in sandbox
    upload = _step("actions/upload-artifact")
    assert upload["if"] == "always()" and "grades" in upload["with"]["path"]


def _python_shim(folder: Path, broken: bool | str = False) -> Path:
    """`python` on PATH: `python -I -m MODULE ...` runs MODULE of this checkout (the
    workflow's install step cannot run here), anything else the test's Python; ``broken``:
    `-m lesson10` fails as a missing package would; ``"all"``: every module fails."""
    folder.mkdir()
    shim = folder / "python"
    boot = (f"import runpy, sys; sys.path.insert(0, {str(ROOT)!r}); mod = sys.argv.pop(1); "
            "runpy.run_module(mod, run_name='__main__', alter_sys=True)")
    fail = 'if [ "$3" = "lesson10" ]; then echo "No module named lesson10" >&2; exit 1; fi\n'
    if broken == "all":
        fail = 'echo "No module named $3" >&2; exit 1\n'
    shim.write_text("#!/bin/sh\n"
                    'if [ "$1" = "-I" ] && [ "$2" = "-m" ]; then\n'
                    + (f"  {fail}" if broken else "") +
                    f'  mod="$3"; shift 3\n  exec {sys.executable} -I -c "{boot}" "$mod" "$@"\nfi\n'
                    f'exec {sys.executable} "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    return folder


def _run_grading_step(tmp_path: Path, repo: Path, broken: bool | str = False):
    files = {n: tmp_path / n for n in ("output", "summary.md")}
    runner_temp = tmp_path / "runner-temp"
    runner_temp.mkdir()
    env = dict(os.environ, GITHUB_STEP_SUMMARY=str(files["summary.md"]),
               GITHUB_OUTPUT=str(files["output"]), RUNNER_TEMP=str(runner_temp),
               GITHUB_REPOSITORY="course-2026/lesson10-ann",
               PATH=f"{_python_shim(tmp_path / 'bin', broken)}{os.pathsep}{os.environ['PATH']}")
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(["bash", "-e", "-c", _step("Grade")["run"]], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    outputs = dict(line.split("=", 1) for line in files["output"].read_text().splitlines())
    # what the reporter does: base64-decode <ID>_RESULTS and parse it
    results = json.loads(base64.b64decode(outputs["result"]).decode("utf-8"))
    summary = files["summary.md"].read_text() if files["summary.md"].exists() else ""
    return results, summary, runner_temp / "grades", proc


def test_grading_step_on_a_student_repository(tmp_path):
    repo = tmp_path / "lesson10-ann"
    (repo / "notebooks").mkdir(parents=True)
    solved = json.loads((ROOT / "solutions" / "03_load_balance.ipynb").read_text())
    solved["cells"] = [c for c in solved["cells"] if "figures." not in "".join(c["source"])]
    (repo / "notebooks" / "Copy of 03_load_balance.ipynb").write_text(json.dumps(solved))
    shutil.copy(ROOT / "notebooks" / "03_load_balance.ipynb", repo / "notebooks")   # blank
    shutil.copy(ROOT / "notebooks" / "06_multiprocess.ipynb", repo / "notebooks")   # no exercises
    shutil.copytree(ROOT / "lesson10", repo / "lesson10",                   # the release's copy
                    ignore=shutil.ignore_patterns("__pycache__"))
    results, summary, grades, proc = _run_grading_step(tmp_path, repo)
    assert results["version"] == 1 and results["status"] == "fail"
    # one point per test: a test per part of a multi-point exercise
    assert results["max_score"] == COURSE_MAX and len(results["tests"]) == COURSE_MAX
    assert all(t["max_score"] == 1 for t in results["tests"])
    assert sum(t["score"] for t in results["tests"]) == 4        # Classroom's points
    passed = sum(t["status"] == "pass" for t in results["tests"])
    assert passed / len(results["tests"]) * results["max_score"] == 4    # the reporter's log
    assert {t["status"] for t in results["tests"]} == {"pass", "fail"}
    missing = next(t for t in results["tests"] if t["name"].startswith("01_"))
    assert missing["status"] == "fail" and missing["message"].startswith("missing")
    assert results["student"] == "lesson10-ann" and isinstance(results["seed"], int)
    assert f"## Score: 4 / {COURSE_MAX}" in summary and "no 01_sequence_parallel notebook" in summary
    assert (grades / "feedback" / "lesson10-ann.md").is_file()
    assert (grades / "feedback" / "lesson10-ann.html").is_file()
    assert (grades / "executed" / "lesson10-ann" / "03_load_balance.ipynb").is_file()   # its id
    assert (grades / "junit.xml").is_file() and (grades / "grades.csv").is_file()
    assert "grader exit status: 1" in proc.stdout


def test_grading_step_when_the_grader_cannot_run(tmp_path):
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    shutil.copy(ROOT / "notebooks" / "03_load_balance.ipynb", repo / "notebooks")
    results, _, _, proc = _run_grading_step(tmp_path, repo, broken=True)
    assert results["status"] == "error" and results["max_score"] == COURSE_MAX
    assert all(t["status"] == "error" for t in results["tests"])
    assert "exit status 1" in results["tests"][0]["message"]


def test_the_last_resort_fallback_writes_the_course_maximum(tmp_path):
    """No Python module runs at all: the printf fallback still names the real maximum (a
    max_score of 0 makes the reporter post nothing)."""
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    results, _, _, proc = _run_grading_step(tmp_path, repo, broken="all")
    assert results["status"] == "error" and results["max_score"] == COURSE_MAX
    assert sum(t["max_score"] for t in results["tests"]) == COURSE_MAX
    assert all(t["score"] == 0 for t in results["tests"])
    assert "could not run" in results["tests"][0]["message"]
