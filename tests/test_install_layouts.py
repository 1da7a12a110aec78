"""The check cells in every install layout a student meets (issue 48): a solved notebook passes
them wherever numpy is installed, and a helper file the grader would not copy is still named.

Each layout is a real interpreter made here in a second, without pip and without a download:
a venv (``--without-pip``) or the running interpreter's base, whose numpy, matplotlib and
lesson10 are the running interpreter's, reached the way that layout reaches them:

* ``venv``: a plain venv inside the notebook's folder, the libraries in its own site-packages;
* ``system``: ``--system-site-packages`` over a base interpreter whose site-packages hold them;
* ``user``: the user site (``PYTHONUSERBASE``, as ``pip install --user`` on a JupyterHub,
  inside the notebook's folder as ``~/.local`` is inside ``~``);
* ``pythonpath``: ``PYTHONPATH`` entries (an HPC module, a lab image), one inside the folder;
* ``stacked``: a ``.pth`` file naming another site-packages (conda's stacked environments);
* ``colab``: a ``dist-packages`` folder on ``sys.path`` (Colab's /usr/local/lib/.../dist-packages);
* ``release``: lesson10 installed by pip (``pip install --no-deps``) into a venv whose numpy
  comes from elsewhere.

In each, the check cells of the solved notebooks run as a Jupyter kernel runs them (cells
compiled as ipykernel names them, :func:`lesson10.checks.refused.helper_note` asking a kernel),
from a notebook folder that holds the student's helper files too. ``make test`` runs one
layout on notebook 03 (seconds); ``make test-slow`` runs every layout on notebooks 01-05,
solved and blank, and the pip install.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

import lesson10
from lesson10.checks import helper_files as rule

ROOT = Path(lesson10.__file__).resolve().parents[1]
#: where the running interpreter's numpy is: every layout reaches this folder's libraries
HOST = Path(np.__file__).resolve().parents[1]
SOLVED = ["01_sequence_parallel", "02_ring_attention", "03_load_balance", "04_ulysses", "05_moe_dispatch"]

#: a right ring_time, as the student's helper module holds it
RING_TIME = "import numpy as np\n\n\ndef ring_time(work):\n    return np.asarray(work).max(axis=1).sum()\n"

#: run by the layout's interpreter in the notebook's folder: each cell of the job (stdin) as a
#: kernel runs it; prints what each cell printed, and where numpy and lesson10 were found
RUNNER = r"""
import contextlib, io, json, os, sys, sysconfig, tempfile, traceback
job = json.load(sys.stdin)
import numpy
from lesson10.checks import helper_files, refused
refused._in_kernel = lambda: True           # what helper_note asks: a Jupyter kernel
cells = os.path.join(tempfile.gettempdir(), f"ipykernel_{os.getpid()}")
space, said = {"__name__": "__main__"}, []
for i, code in enumerate(job):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            exec(compile(code, os.path.join(cells, f"{i}.py"), "exec"), space)
        except BaseException:
            print("CELL RAISED " + traceback.format_exc())
    said.append(out.getvalue())
methods = sys.modules.get("numpy._core._methods") or sys.modules.get("numpy.core._methods")
import lesson10
print(json.dumps({"said": said, "numpy": methods.__file__, "lesson10": lesson10.__file__,
                  "prefix": sys.prefix, "base_prefix": sys.base_prefix,
                  "purelib": sysconfig.get_paths()["purelib"],
                  "own": helper_files.is_own(methods.__file__, os.getcwd()),
                  "who": refused._who(methods.__file__)}))
"""


@dataclass
class Layout:
    """An interpreter, the environment it runs with, and the notebook's folder."""
    name: str
    python: str
    folder: Path
    env: dict[str, str] = field(default_factory=dict)
    inside_prefix: bool = False       # numpy under sys.prefix or base_prefix (no bug to catch)

    def run(self, cells: list[str]) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "COV"))}
        env.update({"LESSON10_STRICT_CHECKS": "show", "MPLBACKEND": "Agg"}, **self.env)
        proc = subprocess.run([self.python, "-c", RUNNER], input=json.dumps(cells), cwd=self.folder,
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{self.name}: {proc.stderr[-3000:]}"
        return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- making layouts
def _venv(path: Path, *, system: bool = False, python: str = sys.executable, env=None) -> Path:
    """A venv without pip at ``path``; its site-packages folder."""
    argv = [python, "-m", "venv", "--without-pip", *(["--system-site-packages"] if system else []), str(path)]
    subprocess.run(argv, check=True, env={**os.environ, **(env or {})}, capture_output=True)
    return _site(str(path / "bin" / "python"), env=env)


def _site(python: str, env=None, what: str = "site.getsitepackages()[0]") -> Path:
    out = subprocess.run([python, "-c", f"import site; print({what})"], check=True, text=True,
                         capture_output=True, env={**os.environ, **(env or {})})
    return Path(out.stdout.strip())


def _fill(folder: Path, lesson10_too: bool = True) -> Path:
    """Link the running interpreter's libraries (and lesson10) into ``folder``, as an install
    there would put them (no ``.pth`` file, no editable finder: those are the host's)."""
    folder.mkdir(parents=True, exist_ok=True)
    for entry in HOST.iterdir():
        if entry.suffix != ".pth" and not entry.name.startswith(("__editable__", "lesson10")):
            (folder / entry.name).symlink_to(entry)
    if lesson10_too:
        (folder / "lesson10").symlink_to(ROOT / "lesson10")
    return folder


def _notebook_folder(tmp: Path, name: str = "course") -> Path:
    """The student's folder: the helpers of RING_TIME beside the notebook, a linked and an
    oversize one, one in a package folder."""
    nb = tmp / name
    (nb / "pkg").mkdir(parents=True)
    for rel in ("mine.py", "pkg/__init__.py", "pkg/inner.py"):
        (nb / rel).write_text(RING_TIME)
    (nb / "big.py").write_text(RING_TIME + "#" * rule.MAX_HELPER_BYTES)
    (nb / "linked.py").symlink_to(nb / "mine.py")
    return nb


def make_stacked(tmp: Path) -> Layout:
    """A venv whose ``.pth`` names another site-packages, here one inside the notebook's folder."""
    nb = _notebook_folder(tmp)
    site = _venv(tmp / "env")
    base = _fill(nb / "base-env" / "site")
    (site / "_stacked.pth").write_text(f"# the base environment\n{base}\n")
    return Layout("stacked", str(tmp / "env" / "bin" / "python"), nb)


def make_venv(tmp: Path) -> Layout:
    nb = _notebook_folder(tmp)
    site = _venv(nb / ".venv")
    for entry in site.iterdir():
        entry.unlink() if entry.is_file() or entry.is_symlink() else shutil.rmtree(entry)
    _fill(site)
    return Layout("venv", str(nb / ".venv" / "bin" / "python"), nb, inside_prefix=True)


def make_system(tmp: Path) -> Layout:
    """``--system-site-packages`` over a base interpreter (its home made here: the running
    base's standard library, and a site-packages holding the libraries)."""
    nb = _notebook_folder(tmp)
    base = getattr(sys, "_base_executable", sys.executable)
    home = tmp / "base"
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    mine = home / stdlib.relative_to(sys.base_prefix)
    mine.mkdir(parents=True)
    for entry in stdlib.iterdir():
        if entry.name not in ("site-packages", "dist-packages"):
            (mine / entry.name).symlink_to(entry)
    env = {"PYTHONHOME": str(home)}
    _fill(_site(base, env))
    _venv(tmp / "env", system=True, python=base, env=env)
    return Layout("system", str(tmp / "env" / "bin" / "python"), nb, env, inside_prefix=True)


def make_user(tmp: Path) -> Layout:
    """The user site of the base interpreter, under the notebook's folder (``~/.local`` of
    a notebook in ``~``)."""
    nb = _notebook_folder(tmp)
    base = getattr(sys, "_base_executable", sys.executable)
    env = {"PYTHONUSERBASE": str(nb / ".local")}
    _fill(_site(base, env, "site.getusersitepackages()"))
    return Layout("user", base, nb, env)


def make_pythonpath(tmp: Path) -> Layout:
    nb = _notebook_folder(tmp)
    _venv(tmp / "env")
    libs = _fill(nb / "modules" / "numpy-stack", lesson10_too=False)
    course = _fill(tmp / "lab" / "course", lesson10_too=True)
    for entry in list(course.iterdir()):
        if entry.name != "lesson10":
            entry.unlink()
    return Layout("pythonpath", str(tmp / "env" / "bin" / "python"), nb,
                  {"PYTHONPATH": os.pathsep.join([str(libs), str(course)])})


def make_colab(tmp: Path) -> Layout:
    """Colab's: the libraries in a ``dist-packages`` folder of /usr/local, which Debian's
    ``site`` puts on ``sys.path`` (here a ``sitecustomize`` of the venv does)."""
    nb = _notebook_folder(tmp, "content")
    site = _venv(tmp / "usr")
    dist = _fill(tmp / "usr" / "local" / "lib" / "python3" / "dist-packages")
    (site / "sitecustomize.py").write_text(f"import sys\nsys.path.append({str(dist)!r})\n")
    return Layout("colab", str(tmp / "usr" / "bin" / "python"), nb, inside_prefix=True)   # /usr/local is in /usr


def make_release(tmp: Path) -> Layout:
    """lesson10 installed by pip, from a copy of the project, into a venv whose libraries a
    ``.pth`` names."""
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode:
        pytest.skip("no pip in the running interpreter to install the release with")
    nb = _notebook_folder(tmp)
    site = _venv(tmp / "env")
    libs = _fill(tmp / "elsewhere", lesson10_too=False)
    (site / "_stacked.pth").write_text(f"{libs}\n")
    src = tmp / "src"
    shutil.copytree(ROOT / "lesson10", src / "lesson10", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    proc = subprocess.run([sys.executable, "-m", "pip", "--python", str(tmp / "env" / "bin" / "python"),
                           "install", "-q", "--no-deps", "--no-index", "--no-build-isolation", str(src)],
                          capture_output=True, text=True, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Layout("release", str(tmp / "env" / "bin" / "python"), nb)


MAKERS = {"venv": make_venv, "system": make_system, "user": make_user, "pythonpath": make_pythonpath,
          "stacked": make_stacked, "colab": make_colab, "release": make_release}


# --------------------------------------------------------------------------- the cells
def notebook_cells(path: Path) -> list[str]:
    """A notebook's import cell, its exercise cells (solved or stubs) and its check cells."""
    out: list[str] = []
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        code = "".join(cell["source"]) if cell["cell_type"] == "code" else ""
        first_import = not out and "from lesson10 import" in code and "_install_lesson10" not in code
        if first_import or "### BEGIN SOLUTION" in code or "raise NotImplementedError" in code \
                or re.search(r"^checks\.check_\w+\(", code, re.M):
            out.append(code)
    return out


#: the helper cells, and what the check cell says of each (None: it passes)
HELPERS = {
    "from mine import ring_time as r; checks.check_ring_time(r)": None,
    "from linked import ring_time as r; checks.check_ring_time(r)": rule.note("linked.py", rule.LINK),
    "from big import ring_time as r; checks.check_ring_time(r)":
        rule.note("big.py", rule.OVER.format(limit=rule.MAX_HELPER_BYTES)),
    "from pkg.inner import ring_time as r; checks.check_ring_time(r)": rule.note("pkg/inner.py", rule.IN_FOLDER),
}


def assert_layout(layout: Layout, notebooks: list[str], *, blank: list[str] = ()) -> None:
    """Solved check cells pass, blank ones are not attempted, each helper is judged as the
    grader would copy it, and numpy is a library's, not the student's."""
    solved = [c for nb in notebooks for c in notebook_cells(ROOT / "solutions" / f"{nb}.ipynb")]
    stubs = [c for nb in blank for c in notebook_cells(ROOT / "notebooks" / f"{nb}.ipynb")]
    cells = [("solved", c) for c in solved] + [("helper", c) for c in HELPERS] + [("blank", c) for c in stubs]
    got = layout.run([c for _, c in cells])
    where = f"{layout.name}: numpy at {got['numpy']}, lesson10 at {got['lesson10']}"
    assert not got["own"] and got["who"] == "library", where
    if not layout.inside_prefix:       # the layout is one where the rule used to misfire
        assert not got["numpy"].startswith((got["prefix"], got["base_prefix"], got["purelib"])), where
    assert sum("checks.check_" in c for c in solved) >= 3 * len(notebooks), solved
    for (kind, code), said in zip(cells, got["said"]):
        if kind == "helper":
            says = HELPERS[code]
            expected = " passed" if says is None else f"check_ring_time failed: {says}"
        elif "checks.check_" in code:
            expected = " passed" if kind == "solved" else ": not attempted"
        else:
            expected = ""
        assert expected in said and (expected == "" or said.count("\n") == 1) and "RAISED" not in said, \
            f"{where}\n{kind}: {code}\n{said}"


# --------------------------------------------------------------------------- the tests
def test_a_stacked_environment_passes_notebook_03_and_still_names_the_helpers(tmp_path):
    """make test's layout: numpy through a .pth, lesson10 elsewhere, the base environment
    in the notebook's folder (so the site rule, not the folder rule, says it is a library's)."""
    assert_layout(make_stacked(tmp_path), ["03_load_balance"])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MAKERS))
def test_every_layout_passes_the_solved_notebooks_and_names_the_helpers(tmp_path, name):
    assert_layout(MAKERS[name](tmp_path), SOLVED, blank=["03_load_balance", "05_moe_dispatch"])


def test_whose_files_the_rule_says_are_the_students(tmp_path, monkeypatch):
    """In the notebook's tree and no library's: a site-packages, a PYTHONPATH entry and a
    folder a .pth adds are libraries' wherever they are; a library folder that holds the
    notebook's folder itself (PYTHONPATH=.) is the student's working folder."""
    nb = tmp_path / "nb"
    for rel in ("mine.py", "sub/x.py", "venv/lib/site-packages/np.py", "pp/lib.py", "stack/s.py"):
        (nb / rel).parent.mkdir(parents=True, exist_ok=True)
        (nb / rel).write_text("")
    (tmp_path / "up.py").write_text("")
    (nb / "venv" / "lib" / "site-packages" / "more.pth").write_text(f"# comment\nimport os\n{nb / 'stack'}\n")
    monkeypatch.setattr(sys, "path", [*sys.path, str(nb / "venv" / "lib" / "site-packages")])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(nb / "pp"), str(tmp_path)]))
    rule.library_folders.cache_clear()
    try:
        own = {rel: rule.is_own(str(nb / rel), str(nb)) for rel in
               ("mine.py", "sub/x.py", "venv/lib/site-packages/np.py", "pp/lib.py", "stack/s.py")}
        assert own == {"mine.py": True, "sub/x.py": True, "venv/lib/site-packages/np.py": False,
                       "pp/lib.py": False, "stack/s.py": False}
        assert not rule.is_own(str(tmp_path / "up.py"), str(nb))       # outside the tree
        assert not rule.is_own(np.__file__, str(nb))
        assert rule.reaches_grader(str(nb / "pp" / "lib.py"), str(nb)) is None
        assert rule.reaches_grader(str(nb / "sub" / "x.py"), str(nb)) == rule.note("sub/x.py", rule.IN_FOLDER)
    finally:
        rule.library_folders.cache_clear()


def test_an_installed_distribution_s_files_are_not_the_students(tmp_path, monkeypatch):
    """A distribution installed into the notebook's tree (``pip install --target``) holds its
    recorded files; an editable install holds its source folder, unless that folder holds
    the notebook's folder itself (the project the notebook is in)."""
    nb = tmp_path / "nb"
    target = nb / "vendor"
    (target / "tool").mkdir(parents=True)
    (target / "tool" / "__init__.py").write_text("")
    info = target / "tool-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tool\nVersion: 1.0\n")
    (info / "RECORD").write_text("tool/__init__.py,,\n")
    (nb / "src" / "mylib").mkdir(parents=True)
    (nb / "src" / "mylib" / "core.py").write_text("")
    (nb / "mine.py").write_text("")
    edit = tmp_path / "site" / "mylib-0.1.dist-info"
    edit.mkdir(parents=True)
    (edit / "METADATA").write_text("Metadata-Version: 2.1\nName: mylib\nVersion: 0.1\n")
    (edit / "direct_url.json").write_text(json.dumps({"url": (nb / "src").as_uri(), "dir_info": {"editable": True}}))
    monkeypatch.setattr(sys, "path", [*sys.path, str(target), str(tmp_path / "site")])
    assert not rule.is_own(str(target / "tool" / "__init__.py"), str(nb))
    assert not rule.is_own(str(nb / "src" / "mylib" / "core.py"), str(nb))
    assert rule.is_own(str(nb / "mine.py"), str(nb))
    assert rule.is_own(str(nb / "src" / "mylib" / "core.py"), str(nb / "src"))    # the project's own
