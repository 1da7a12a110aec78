"""What the sandbox shows of the grader's Python, and the path without bubblewrap.

* every folder of the grader's ``sys.path`` (a ``.pth`` overlay's, PYTHONPATH's) is bound,
  the course's own checkout never; a folder that would show the submissions is refused;
* a module the grader finds and the sandbox does not makes the probe refuse, with its name;
* without bubblewrap, as root: Gradescope's ``run_autograder`` runs the notebooks as an
  unprivileged user who can neither read the package, nor write the results, nor stop the
  grading (needs root and a Python that user can run: ``LESSON10_TEST_SHARED_PYTHON``, a
  venv of the system's Python with numpy, IPython, matplotlib and nbformat).
"""
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from redteam import build as B

import lesson10
from lesson10.course.grade import pythonpath, sandbox

ROOT = Path(__file__).resolve().parent.parent


def test_every_folder_on_sys_path_is_bound_but_the_checkout(monkeypatch, tmp_path):
    overlay, env_module = tmp_path / "overlay-site", tmp_path / "hpc-module"
    overlay.mkdir()
    env_module.mkdir()
    checkout = Path(lesson10.__file__).resolve().parent.parent
    monkeypatch.chdir(tmp_path / "..")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "script-dir")] + sys.path +
                        [str(overlay), str(env_module), str(checkout), str(checkout / "tests")])
    (tmp_path / "script-dir").mkdir()
    (tmp_path / "script-dir" / "grade.py").write_text("")
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "script-dir" / "grade.py")])
    path = pythonpath.grader_path()
    assert str(overlay) in path and str(env_module) in path           # .pth and PYTHONPATH
    assert str(tmp_path / "script-dir") not in path                  # sys.path[0]
    assert not any(p == str(checkout) or p.startswith(str(checkout) + "/tests") for p in path)
    dests = [d for _, d in pythonpath.python_binds()]
    assert str(overlay) in dests and str(env_module) in dests
    argv = sandbox.bwrap_argv(tmp_path, sandbox.Limits(), {})
    assert any(argv[i:i + 3] == ["--ro-bind", str(overlay), str(overlay)] for i in range(len(argv)))


def test_a_folder_holding_the_working_folder_is_refused(monkeypatch, tmp_path):
    (tmp_path / "grading").mkdir()
    monkeypatch.chdir(tmp_path / "grading")
    monkeypatch.setattr(sys, "path", sys.path + [str(tmp_path)])
    with pytest.raises(pythonpath.Unbindable, match="holds the folder the grader runs in"):
        pythonpath.python_binds()


@pytest.mark.skipif(sandbox.probe() is not None, reason=f"no sandbox: {sandbox.probe()}")
def test_a_module_the_sandbox_cannot_find_makes_the_probe_refuse(monkeypatch, tmp_path):
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "l10_needed_mod.py").write_text("X = 1\n")
    monkeypatch.setattr(sys, "path", sys.path + [str(hidden)])
    monkeypatch.setattr(pythonpath, "NEEDS", pythonpath.NEEDS + ("l10_needed_mod",))
    real = pythonpath.grader_path
    monkeypatch.setattr(pythonpath, "grader_path", lambda: [p for p in real() if p != str(hidden)])
    monkeypatch.setattr(sandbox, "_PROBE", {})
    why = sandbox.probe()
    assert why and "l10_needed_mod" in why and sandbox.probe_kind() == "python"
    monkeypatch.setattr(pythonpath, "grader_path", real)     # bound: found inside
    monkeypatch.setattr(sandbox, "_PROBE", {})
    assert sandbox.probe() is None


SHARED = os.environ.get("LESSON10_TEST_SHARED_PYTHON")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0 or not SHARED,
                    reason="needs root and LESSON10_TEST_SHARED_PYTHON (see the module)")
def test_gradescope_without_bwrap_runs_notebooks_as_an_unprivileged_user(tmp_path):
    token = os.urandom(6).hex()
    evidence = Path("/tmp") / f"l10-evidence-{token}.json"
    install = tmp_path / "install"
    shutil.copytree(ROOT / "lesson10", install / "lesson10",
                    ignore=shutil.ignore_patterns("__pycache__"))
    ag = tmp_path / "autograder"
    out = tmp_path / "autograder.zip"
    assert subprocess.run([sys.executable, "-m", "lesson10", "gradescope", str(out)],
                          capture_output=True, timeout=600).returncode == 0
    (ag / "source").mkdir(parents=True)
    with zipfile.ZipFile(out) as zf:
        zf.extractall(ag / "source")
    shutil.copy(ag / "source" / "run_autograder", ag / "run_autograder")
    attack = f"""
import json, os, signal
seen = {{}}
for p in {[str(install / "lesson10" / "layouts.py"), str(ag / "source" / "setup.sh")]!r}:
    try:
        open(p).read(); seen.setdefault('read', []).append(p)
    except OSError as e:
        seen.setdefault('refused', []).append(type(e).__name__)
try:
    os.makedirs({str(ag / "results")!r}, exist_ok=True)
    with open({str(ag / "results" / "results.json")!r}, 'w') as f:
        json.dump({{"score": 24, "tests": []}}, f)
    seen['wrote'] = True
except OSError as e:
    seen['wrote'] = type(e).__name__
try:
    os.kill(os.getppid(), signal.SIGKILL); seen['killed'] = True
except OSError as e:
    seen['killed'] = type(e).__name__
seen['uid'] = os.getuid()
open({str(evidence)!r}, 'w').write(json.dumps(seen))
"""
    nb = B.insert(B.reduced("03_load_balance"), attack, after_imports=True)
    B.write(ag / "submission", "03_load_balance.ipynb", nb)
    tools = tmp_path / "bin"                       # every program but bwrap
    tools.mkdir()
    for d in os.environ.get("PATH", "").split(os.pathsep):
        for name in (os.listdir(d) if os.path.isdir(d) else []):
            if name != "bwrap" and not (tools / name).exists():
                (tools / name).symlink_to(Path(d) / name)
    env = dict(os.environ, AUTOGRADER_ROOT=str(ag), LESSON10_PYTHON=SHARED, PATH=str(tools),
               PYTHONPATH=str(install), MPLBACKEND="Agg")
    proc = subprocess.run(["bash", str(ag / "run_autograder")], env=env, capture_output=True,
                          text=True, timeout=600)
    try:
        assert proc.returncode == 0, proc.stderr[-3000:]
        doc = json.loads((ag / "results" / "results.json").read_text())
        seen = json.loads(evidence.read_text())
    finally:
        evidence.unlink(missing_ok=True)
    assert seen["uid"] != 0 and "read" not in seen, seen          # the package stays unread
    assert seen["wrote"] != True and seen["killed"] != True, seen  # noqa: E712
    assert "unprivileged user" in doc["output"], doc["output"]
    assert doc["score"] == 4 and len(doc["tests"]) >= 4, doc["output"]
