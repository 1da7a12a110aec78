"""The course works in Colab as Colab is, and in any Jupyter: the install cell adds lesson10
(the release the notebook is for) and changes nothing else.

Fast checks (part of ``make test``): every runtime requirement of lesson10 is already met by
the versions Colab preinstalls (``tests/colab/colab-pins.txt``), on each Python the pins are
for, so pip has nothing to upgrade; and the spmd extra's torch admits Colab's own.

The Colab-like runs (``make test-colab``, marker ``colab``) use three venvs pinned to those
versions (the Makefile builds them):

* ``.venv-colab312``: Colab's Python 3.12 with no torch at all, for notebooks 01-05 of
  ``solutions/`` and ``notebooks/``; ``.venv-colab313``: the same on Python 3.13 (Colab's newer
  runtime; skipped where the machine has no 3.13) for the exercise notebooks 01-05;
* ``.venv-colab``: Python 3.11 with the CPU build of torch standing in for Colab's CUDA build
  (the CPU wheel on these machines is for 3.11 only), for notebook 06.

Each notebook runs, with lesson10 not installed, in a kernel that imports a stub
``google.colab`` at start (an IPython startup file), as Colab's kernel does; matplotlib's
backend is the kernel's own default, the inline one, as in Colab (no MPLBACKEND), so every
``plt.show()`` must leave a PNG in the outputs. The install cell's address
``git+https://github.com/OWNER/NAME@REF`` is rewritten to this checkout,
``git+file://<root>@<HEAD>`` (GitHub is out of reach here; the rest of the cell runs as
written), with no PYTHONPATH, so the kernel imports the installed package. Every cell must
run clean, and ``pip freeze --all`` afterwards must be the one before plus lesson10.

Two more runs on 3.12: a notebook in a plain Jupyter kernel (no ``google.colab``: Kaggle, a
local Jupyter, Binder), and the install cell over an older release of lesson10 (0.1.0, already
imported in the kernel): it must update lesson10 alone, and a second run must do nothing.
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

import nbformat
import pytest

from lesson10.course import build

ROOT = Path(__file__).resolve().parents[1]
COLAB = ROOT / "tests" / "colab"
VENVS = {"3.11": ROOT / ".venv-colab", "3.12": ROOT / ".venv-colab312", "3.13": ROOT / ".venv-colab313"}
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
NOTEBOOKS = SOLUTIONS + sorted((ROOT / "notebooks").glob("*.ipynb"))
#: Colab's own torch (its CUDA build) at the time of the pins: the spmd extra must admit it
COLAB_TORCH = "2.10.0"


def _uses_torch(path: Path) -> bool:
    return build.notebook_extra(json.loads(path.read_text(encoding="utf-8"))) == "spmd"


def _pythons(path: Path) -> tuple[str, ...]:
    if _uses_torch(path):
        return ("3.11",)
    # 3.13: the exercise notebooks, what students open (CI's time; 3.12 runs both trees)
    return ("3.12", "3.13") if path.parent.name == "notebooks" else ("3.12",)


#: (python, notebook): 01-05 on 3.12 (and the exercise ones on 3.13) without torch, 06 on 3.11
RUNS = [(py, p) for p in NOTEBOOKS for py in _pythons(p)]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(python: str) -> dict[str, str]:
    """``{name: version}`` of colab-pins.txt for a Python ``major.minor`` (markers applied)."""
    from packaging.requirements import Requirement
    pins = {}
    for line in (COLAB / "colab-pins.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"python_version": python, "python_full_version": python + ".0"}):
            (spec,) = req.specifier
            assert spec.operator == "==", line
            pins[_norm(req.name)] = spec.version
    return pins


def _project():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _requirements(extra: str | None = None):
    from packaging.requirements import Requirement
    project = _project()
    reqs = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return [Requirement(r) for r in reqs]


# ------------------------------------------------------------------ fast: part of `make test`
@pytest.mark.parametrize("python", sorted(VENVS))
def test_colab_versions_meet_every_runtime_requirement(python):
    """pip upgrades nothing in Colab only if each requirement admits Colab's version."""
    pins = _pins(python)
    for req in _requirements():
        name = _norm(req.name)
        assert name in pins, f"{req.name} is a dependency but tests/colab/colab-pins.txt does not pin Colab's version"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"{req} rejects Colab's {req.name} {pins[name]} (Python {python}): the install cell would replace it")
    assert ("torch" in pins) == (python == "3.11"), "torch only in the 3.11 venv (the CPU wheel on this disk)"


def test_spmd_extra_admits_colabs_torch_and_the_cpu_pin():
    (torch,) = _requirements("spmd")
    assert torch.name == "torch"
    assert torch.specifier.contains(COLAB_TORCH) and torch.specifier.contains(_pins("3.11")["torch"])


def test_numpy_pin_per_python_has_a_wheel_there():
    """numpy 2.0.2 (Colab's) has no wheel for 3.13: the pins give 3.13 a numpy that has one."""
    assert _pins("3.12")["numpy"] == "2.0.2"
    assert tuple(int(x) for x in _pins("3.13")["numpy"].split(".")[:2]) >= (2, 1)


def test_ipywidgets_requirement_keeps_colab_on_the_7_protocol():
    req = next(r for r in _requirements() if r.name == "ipywidgets")
    assert req.specifier.contains("7.7.1") and req.specifier.contains("8.1.9")
    assert not req.specifier.contains("9.0.0")          # an untested major release: not allowed in


def test_colab_stub_is_only_a_test_file():
    assert not (ROOT / "lesson10" / "google").exists()
    text = (COLAB / "stub" / "google" / "colab" / "__init__.py").read_text()
    assert "STUB = True" in text


def test_every_notebook_has_its_colab_like_run():
    assert {p for _, p in RUNS} == set(NOTEBOOKS)
    for py, p in RUNS:
        assert (py == "3.11") == p.stem.startswith("06"), (py, p.name)


# ------------------------------------------------------------------ slow: `make test-colab`
def _pip(python: Path, *args, check=True, timeout=900):
    return subprocess.run([str(python), "-m", "pip", *args], check=check, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})


#: what ``pip freeze --all`` says, read from the installed metadata directly (a second per call
#: less than starting pip): ``name==version``, or ``name @ URL`` for a direct-URL install
_FREEZE = """
import importlib.metadata as md, json
out = {}
for dist in md.distributions():
    name = dist.metadata["Name"]
    url = json.loads(dist.read_text("direct_url.json") or "null")
    if url and "vcs_info" in url:
        vcs = url["vcs_info"]
        out[name] = f"{name} @ {vcs['vcs']}+{url['url']}@{vcs['commit_id']}"
    elif url and not url.get("dir_info"):
        out[name] = f"{name} @ {url['url']}"
    else:
        out[name] = f"{name}=={dist.version}"
print(json.dumps(out))
"""


def _freeze(python: Path) -> dict[str, str]:
    proc = subprocess.run([str(python), "-I", "-c", _FREEZE], check=True, capture_output=True, text=True,
                          timeout=600)
    return {_norm(name): line for name, line in json.loads(proc.stdout).items()}


def _changes(before: dict, after: dict) -> dict:
    return {name: (before.get(name), after.get(name)) for name in set(before) | set(after)
            if before.get(name) != after.get(name)}


class ColabLike:
    """One Colab-like venv, back in Colab's state (the pins, no lesson10)."""

    def __init__(self, python: str, home: Path, url: str):
        self.python, self.venv = python, VENVS[python]
        self.py = self.venv / "bin" / "python"
        self.url = url
        self.reset()
        before = _freeze(self.py)
        for name, version in _pins(python).items():
            installed = before[name].split("==")[-1].split("+")[0]
            assert installed == version, f"{before[name]}: {self.venv} is not Colab-like"
        self.before = before
        startup = home / "ipython" / "profile_default" / "startup"
        startup.mkdir(parents=True)
        (startup / "00-google-colab.py").write_text("import google.colab  # Colab's kernel has it loaded\n")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYTHON", "VIRTUAL_ENV", "JUPYTER", "MPLBACKEND"))}
        env.update(PATH=f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", PIP_DISABLE_PIP_VERSION_CHECK="1")
        self.env = {**env, "PYTHONPATH": str(COLAB / "stub"), "IPYTHONDIR": str(home / "ipython")}
        self.plain_env = {**env, "IPYTHONDIR": str(home / "plain-ipython")}   # no google.colab anywhere

    def reset(self):
        _pip(self.py, "uninstall", "-q", "-y", "lesson10", check=False, timeout=300)
        _pip(self.py, "install", "-q", "-r", str(COLAB / "colab-pins.txt"))

    def run(self, path: Path, tmp_path: Path, colab: bool = True) -> dict:
        """Run a copy of the notebook at ``path`` (install cell pointed at this checkout)."""
        repository, ref = build.repository_setting(ROOT)
        published = build.install_url(repository, ref)
        text = path.read_text(encoding="utf-8")
        assert text.count(published) == 1, f"{path.name}: its install cell should name {published} once"
        copy = tmp_path / path.parent.name / path.name
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(text.replace(published, self.url), encoding="utf-8")
        proc = subprocess.run([str(self.py), str(COLAB / "run_notebook.py"), str(copy)], cwd=tmp_path,
                              env=self.env if colab else self.plain_env, capture_output=True, text=True,
                              timeout=1800)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
        result = json.loads(lines[-1][len("RESULT "):])
        assert result["error"] is None, result["error"]
        probe = result["probe"]
        assert probe["python"].startswith(self.python + "."), probe
        assert probe["colab"] is colab, "google.colab should be loaded at kernel start only in the Colab-like kernel"
        assert probe["ipywidgets"] == _pins(self.python)["ipywidgets"], "ipywidgets changed under the notebook"
        assert Path(probe["lesson10"]).is_relative_to(self.venv), \
            f"the kernel imported lesson10 from {probe['lesson10']}, not from the install cell's install"
        assert probe["installed"] == probe["lesson10_version"] == build.version_setting(ROOT)
        return result


@pytest.fixture(scope="module")
def colab_like(tmp_path_factory):
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "lesson10", "pyproject.toml"],
                           capture_output=True, text=True).stdout.strip()
    if dirty:
        warnings.warn(f"uncommitted changes in lesson10/ or pyproject.toml: the install cell installs "
                      f"the last commit {head[:10]}, not the working tree", stacklevel=2)
    url = f"git+file://{ROOT}@{head}"
    made = {}

    def get(python: str) -> ColabLike:
        if python not in made:
            if not (VENVS[python] / "bin" / "python").exists():
                pytest.skip(f"no {VENVS[python].name}: `make test-colab` builds it"
                            + (" (where this machine has Python 3.13)" if python == "3.13" else ""))
            made[python] = ColabLike(python, tmp_path_factory.mktemp(f"colab{python}"), url)
        return made[python]

    yield get
    for env in made.values():
        _pip(env.py, "uninstall", "-q", "-y", "lesson10", check=False, timeout=300)


@pytest.mark.colab
@pytest.mark.parametrize("python,path", RUNS, ids=[f"py{py}-{p.parent.name}/{p.stem}" for py, p in RUNS])
def test_notebook_in_colab_like_env(colab_like, python, path, tmp_path):
    env = colab_like(python)
    _pip(env.py, "uninstall", "-q", "-y", "lesson10", check=False, timeout=300)   # the cell installs it
    result = env.run(path, tmp_path)
    assert result["install_output"].startswith(f"installed lesson10 {build.version_setting(ROOT)}"), result
    assert result["probe"]["torch"] is (python == "3.11"), "notebooks 01-05 run where there is no torch at all"
    assert result["probe"]["backend"].endswith("backend_inline"), result["probe"]
    assert result["show_cells"] == [] or _uses_torch(path) or result["png_cells"], result
    missing = sorted(set(result["show_cells"]) - set(result["png_cells"]))
    assert not missing, f"cells {missing} call plt.show() but show no PNG with the inline backend"
    changed = _changes(env.before, _freeze(env.py))
    assert set(changed) == {"lesson10"}, f"pip changed more than adding lesson10: {changed}"
    assert changed["lesson10"][0] is None and env.url.split("@")[0] in changed["lesson10"][1]


@pytest.mark.colab
def test_install_cell_in_a_plain_jupyter(colab_like, tmp_path):
    """No google.colab (Kaggle, a local Jupyter, Binder): the same cell installs lesson10."""
    env = colab_like("3.12")
    _pip(env.py, "uninstall", "-q", "-y", "lesson10", check=False, timeout=300)
    result = env.run(ROOT / "notebooks" / "05_moe_dispatch.ipynb", tmp_path, colab=False)
    assert result["install_output"].startswith("installed lesson10"), result
    changed = _changes(env.before, _freeze(env.py))
    assert set(changed) == {"lesson10"}, f"pip changed more than adding lesson10: {changed}"


def _older_release(tmp_path: Path, version: str = "0.1.0") -> Path:
    """A wheel of this package numbered as an older release (what a student has from before)."""
    src = tmp_path / "old-src"
    src.mkdir()
    shutil.copy(ROOT / "README.md", src)
    shutil.copytree(ROOT / "lesson10", src / "lesson10", ignore=shutil.ignore_patterns("__pycache__"))
    current = build.version_setting(ROOT)
    text = (ROOT / "pyproject.toml").read_text().replace(f'version = "{current}"', f'version = "{version}"', 1)
    (src / "pyproject.toml").write_text(text)
    init = src / "lesson10" / "__init__.py"
    init.write_text(init.read_text().replace(f'__version__ = "{current}"', f'__version__ = "{version}"'))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(tmp_path / "old-wheel"), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (wheel,) = (tmp_path / "old-wheel").glob(f"lesson10-{version}-*.whl")
    return wheel


@pytest.mark.colab
def test_install_cell_updates_an_older_release_and_then_does_nothing(colab_like, tmp_path):
    env = colab_like("3.12")
    _pip(env.py, "install", "-q", "--no-deps", str(_older_release(tmp_path)))
    before = _freeze(env.py)
    assert "lesson10-0.1.0-" in before["lesson10"], before["lesson10"]
    sol = nbformat.read(ROOT / "solutions" / "03_load_balance.ipynb", as_version=4)
    install = next(c for c in sol.cells if c.cell_type == "code")
    nb = nbformat.v4.new_notebook(metadata=sol.metadata)
    nb.cells = [nbformat.v4.new_code_cell("import lesson10\nassert lesson10.__version__ == '0.1.0'"), install,
                nbformat.v4.new_code_cell("from lesson10 import layouts\n"
                                          "print(layouts.ring_time(layouts.causal_work(4, 'zigzag')))")]
    path = tmp_path / "nb" / "update.ipynb"
    path.parent.mkdir()
    nbformat.write(nb, path)
    first = env.run(path, tmp_path / "run1")                      # run() checks the new version is imported
    changed = _changes(before, _freeze(env.py))
    assert set(changed) == {"lesson10"}, f"the update changed more than lesson10: {changed}"
    assert env.url.split("@")[0] in changed["lesson10"][1]
    version = build.version_setting(ROOT)
    assert f"installed lesson10 {version} (was 0.1.0)" in first["install_output"], first
    again = _freeze(env.py)
    second = env.run(_without_first_cell(path), tmp_path / "run2")
    assert f"lesson10 {version} is installed: nothing to do" in second["install_output"], second
    assert _freeze(env.py) == again


def _without_first_cell(path: Path) -> Path:
    """The same notebook without the cell that checks for 0.1.0 (now 0.2.0 is installed)."""
    nb = nbformat.read(path, as_version=4)
    nb.cells = nb.cells[1:]
    out = path.with_name("update-again.ipynb")
    nbformat.write(nb, out)
    return out
