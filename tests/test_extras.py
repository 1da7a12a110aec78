"""torch is the ``spmd`` extra: the base install serves notebooks 01-05, the checks, the figures
and the grader; ``lesson10.spmd`` (and ``run`` / ``bench``) without torch say which extra to
install. The wheel's own metadata is what pip reads, so it is built and read here."""
from __future__ import annotations

import email
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: run first in a child interpreter: every ``import torch`` fails as if torch were not installed
NO_TORCH = "import sys; sys.modules['torch'] = None\n"


def _python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_TORCH + code], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_wheel_requires_no_torch_but_its_spmd_extra_does(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "lesson10", src / "lesson10", ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(tmp_path / "wheel"), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = (tmp_path / "wheel").glob("lesson10-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        meta = email.message_from_bytes(zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))))
    requires = meta.get_all("Requires-Dist")
    base = [r for r in requires if "extra ==" not in r]
    spmd = [r for r in requires if "extra == \"spmd\"" in r.replace("'", '"')]
    assert not any(r.startswith("torch") for r in base), base
    assert [r.split(";")[0].replace(" ", "") for r in spmd] == ["torch>=2.2"], spmd
    names = {r.split(">")[0].split("<")[0].split("=")[0].strip() for r in base}
    assert names >= {"numpy", "matplotlib", "ipywidgets", "nbformat", "ipykernel"} and "nbclient" not in names
    assert "spmd" in meta.get_all("Provides-Extra")
    import lesson10
    assert meta["Version"] == lesson10.__version__


def test_spmd_without_torch_names_the_extra():
    proc = _python("import lesson10.spmd")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError") and 'pip install "lesson10[spmd]"' in last, proc.stderr


def test_base_install_modules_work_without_torch():
    """What notebooks 01-05 and the grader import, with torch out of reach."""
    proc = _python("import lesson10, lesson10.sim, lesson10.layouts, lesson10.cost, lesson10.checks, "
                   "lesson10.figures, lesson10.course.build, lesson10.course.grade, lesson10.runs.demo\n"
                   "from lesson10.__main__ import main\n"
                   "assert main(['build', '--check']) == 0\n"
                   "print('fine')")
    assert proc.returncode == 0 and proc.stdout.strip().endswith("fine"), proc.stdout + proc.stderr


def test_run_and_bench_without_torch_exit_2_naming_the_extra():
    for argv in (["run", "moe"], ["bench", "ring", "--nproc", "2"]):
        proc = _python(f"from lesson10.__main__ import main\nraise SystemExit(main({argv!r}))")
        assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
        assert 'lesson10[spmd]' in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
