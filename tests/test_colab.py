"""The course works in Colab as Colab is: its install cell adds lesson10 and changes nothing else.

Fast checks (part of ``make test``): every runtime requirement of lesson10 is already met by
the versions Colab preinstalls (``tests/colab/colab-pins.txt``), so pip has nothing to upgrade.

The Colab-like run (``make test-colab``, marker ``colab``) builds ``.venv-colab`` pinned to
those versions and, for every notebook of ``solutions/`` and ``notebooks/``:

* a kernel that imports a stub ``google.colab`` at start (an IPython startup file), as
  Colab's kernel does, so the notebook's own install cell runs;
* the install cell's address ``git+https://github.com/OWNER/NAME@REF`` rewritten to this
  checkout, ``git+file://<root>@<HEAD>`` (GitHub is out of reach here; the rest of the cell
  runs as written), with no PYTHONPATH, so the kernel imports the installed package;
* every cell runs clean, and ``pip freeze --all`` afterwards is the one before plus lesson10.

Python: Colab runs 3.12. The test venv uses the machine's ``python3`` (3.11 here and in CI)
because the CPU build of torch that stands in for Colab's CUDA build is on these machines for
3.11 only; on 3.12 pip would download a CUDA build of several GB.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from lesson10 import build

ROOT = Path(__file__).resolve().parents[1]
COLAB = ROOT / "tests" / "colab"
VENV = ROOT / ".venv-colab"
VENV_PY = VENV / "bin" / "python"
NOTEBOOKS = sorted((ROOT / "solutions").glob("*.ipynb")) + sorted((ROOT / "notebooks").glob("*.ipynb"))


def _pins() -> dict[str, str]:
    pins = {}
    for line in (COLAB / "colab-pins.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def _runtime_requirements():
    from packaging.requirements import Requirement
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"]]


# ------------------------------------------------------------------ fast: part of `make test`
def test_colab_versions_meet_every_runtime_requirement():
    """pip upgrades nothing in Colab only if each requirement admits Colab's version."""
    pins = _pins()
    for req in _runtime_requirements():
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name in pins, f"{req.name} is a dependency but tests/colab/colab-pins.txt does not pin Colab's version"
        version = pins[name]
        if name == "torch":
            version = version.split("+")[0]
        assert req.specifier.contains(version, prereleases=True), (
            f"{req} rejects Colab's {req.name} {version}: the install cell would replace it in Colab")


def test_ipywidgets_requirement_keeps_colab_on_the_7_protocol():
    req = next(r for r in _runtime_requirements() if r.name == "ipywidgets")
    assert req.specifier.contains("7.7.1") and req.specifier.contains("8.1.9")
    assert not req.specifier.contains("9.0.0")          # an untested major release: not allowed in


def test_colab_stub_is_only_a_test_file():
    assert not (ROOT / "lesson10" / "google").exists()
    text = (COLAB / "stub" / "google" / "colab" / "__init__.py").read_text()
    assert "STUB = True" in text


# ------------------------------------------------------------------ slow: `make test-colab`
def _freeze() -> dict[str, str]:
    out = subprocess.run([str(VENV_PY), "-m", "pip", "freeze", "--all"], check=True, capture_output=True,
                         text=True, timeout=300).stdout
    lines = {}
    for line in out.splitlines():
        name = re.split(r"[=@ ]", line, maxsplit=1)[0]
        lines[re.sub(r"[-_.]+", "-", name).lower()] = line.strip()
    return lines


@pytest.fixture(scope="module")
def colab_env(tmp_path_factory):
    if not VENV_PY.exists():
        pytest.skip("no .venv-colab: run `make test-colab` (it builds the Colab-like venv)")
    # back to Colab's state, whatever an earlier (failing) run left: the pins, and no lesson10
    subprocess.run([str(VENV_PY), "-m", "pip", "uninstall", "-q", "-y", "lesson10"], capture_output=True,
                   timeout=300)
    subprocess.run([str(VENV_PY), "-m", "pip", "install", "-q", "-r", str(COLAB / "colab-pins.txt")],
                   check=True, capture_output=True, timeout=900)
    before = _freeze()
    assert "lesson10" not in before
    for name, version in _pins().items():
        assert before[name].split("==")[-1].split("+")[0] == version, f"{before[name]}: .venv-colab is not Colab-like"
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "lesson10", "pyproject.toml"],
                           capture_output=True, text=True).stdout.strip()
    if dirty:
        warnings.warn(f"uncommitted changes in lesson10/ or pyproject.toml: the install cell installs "
                      f"the last commit {head[:10]}, not the working tree")
    home = tmp_path_factory.mktemp("colab")
    startup = home / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-google-colab.py").write_text("import google.colab  # Colab's kernel has it loaded\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "JUPYTER"))}
    env.update(PYTHONPATH=str(COLAB / "stub"), IPYTHONDIR=str(home / "ipython"), MPLBACKEND="Agg",
               PATH=f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}", PIP_DISABLE_PIP_VERSION_CHECK="1")
    yield {"before": before, "url": f"git+file://{ROOT}@{head}", "env": env, "home": home}
    subprocess.run([str(VENV_PY), "-m", "pip", "uninstall", "-q", "-y", "lesson10"], capture_output=True,
                   timeout=300)


@pytest.mark.colab
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_notebook_in_colab_like_env(colab_env, path, tmp_path):
    repository, ref = build.repository_setting(ROOT)
    published = build.install_url(repository, ref)
    text = path.read_text(encoding="utf-8")
    assert text.count(published) == 1, f"{path.name}: its install cell should name {published} once"
    copy = tmp_path / path.parent.name / path.name
    copy.parent.mkdir()
    copy.write_text(text.replace(published, colab_env["url"]), encoding="utf-8")

    proc = subprocess.run([str(VENV_PY), str(COLAB / "run_notebook.py"), str(copy)], cwd=tmp_path,
                          env=colab_env["env"], capture_output=True, text=True, timeout=1800)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["error"] is None, result["error"]
    probe = result["probe"]
    assert probe["colab"] is True, "google.colab was not loaded at kernel start"
    assert probe["ipywidgets"] == _pins()["ipywidgets"], "ipywidgets changed under the notebook"
    assert Path(probe["lesson10"]).is_relative_to(VENV), \
        f"the kernel imported lesson10 from {probe['lesson10']}, not from the install cell's install"

    after = _freeze()
    before = colab_env["before"]
    changed = {name: (before.get(name), after.get(name)) for name in set(before) | set(after)
               if before.get(name) != after.get(name)}
    assert set(changed) == {"lesson10"}, f"pip changed more than adding lesson10: {changed}"
    assert changed["lesson10"][0] is None and colab_env["url"].split("@")[0] in changed["lesson10"][1]
