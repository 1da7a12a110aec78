"""The two set-up paths (pip via pyproject.toml, conda via environment.yml) never drift apart,
and the README opens with the two commands."""
import re
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]

# conda name -> pip name; entries that are not Python packages of the course
CONDA_TO_PIP = {"pytorch": "torch", "pytorch-cpu": "torch", "pytorch-gpu": "torch"}
CONDA_IGNORE = {"python", "pip", "cpuonly"}

_REQ = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(\[[^\]]*\])?\s*(.*?)\s*$")


def _split(requirement: str) -> tuple[str, str]:
    """'numpy>=1.24' -> ('numpy', '>=1.24'); names normalised as pip does (PEP 503)."""
    m = _REQ.match(requirement.split(";")[0])
    assert m, f"cannot parse requirement {requirement!r}"
    name = re.sub(r"[-_.]+", "-", m.group(1)).lower()
    return name, m.group(3).replace(" ", "")


def conda_dependencies(text: str) -> list[str]:
    """The top-level entries of ``dependencies:`` in an environment.yml (no YAML library).

    Nested lists (the ``pip:`` section) are skipped: they are deeper-indented ``-`` items.
    """
    deps, inside, indent = [], False, None
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        if not raw.startswith((" ", "\t", "-")):
            inside = line.strip() == "dependencies:"
            indent = None
            continue
        if not inside:
            continue
        m = re.match(r"^(\s*)-\s*(.+)$", line)
        if not m:
            continue
        if indent is None:
            indent = len(m.group(1))
        if len(m.group(1)) == indent:
            item = m.group(2).strip().strip("'\"")
            if not item.endswith(":"):          # "pip:" opens the nested pip list
                deps.append(item)
    return deps


def test_conda_parser_on_a_sample():
    sample = "name: x\nchannels:\n  - conda-forge\ndependencies:\n  - python>=3.10\n  - numpy >=1.24  # arrays\n" \
             "  - pip\n  - pip:\n      - -e .\n      - something\n"
    assert conda_dependencies(sample) == ["python>=3.10", "numpy >=1.24", "pip"]


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _pip_requirements() -> dict[str, str]:
    project = _pyproject()["project"]
    reqs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    out = {}
    for req in reqs:
        name, spec = _split(req)
        out[name] = spec
    return out


def _conda_requirements() -> dict[str, str]:
    out = {}
    for item in conda_dependencies((ROOT / "environment.yml").read_text()):
        name, spec = _split(item.split("::")[-1])      # allow channel::name
        if name in CONDA_IGNORE:
            continue
        out[CONDA_TO_PIP.get(name, name)] = spec
    return out


def test_environment_yml_names_the_same_packages_as_pyproject():
    pip, conda = _pip_requirements(), _conda_requirements()
    assert set(conda) == set(pip), (
        f"only in environment.yml: {sorted(set(conda) - set(pip))}; "
        f"only in pyproject.toml: {sorted(set(pip) - set(conda))}")


def test_lower_bounds_agree():
    pip, conda = _pip_requirements(), _conda_requirements()
    for name in set(pip) & set(conda):
        if pip[name] and conda[name]:
            assert pip[name] == conda[name], f"{name}: pyproject says {pip[name]!r}, environment.yml {conda[name]!r}"


def test_environment_yml_installs_the_package_itself():
    text = (ROOT / "environment.yml").read_text()
    assert re.search(r"^\s*-\s*-e\s+\.\s*$", text, flags=re.M), "environment.yml should pip install -e ."


def test_runtime_dependencies_are_never_pinned():
    for req in _pyproject()["project"]["dependencies"]:
        assert "==" not in req, f"{req}: use a lower bound, pins belong in constraints.txt"


def test_required_runtime_and_extras():
    project = _pyproject()["project"]
    runtime = {_split(r)[0] for r in project["dependencies"]}
    assert {"numpy", "matplotlib", "ipywidgets", "nbformat"} <= runtime
    assert "nbclient" not in runtime, "nbclient runs notebooks in the tests: the test extra, not the package"
    assert "torch" not in runtime, "torch belongs to the spmd extra: notebooks 01-05 and the grader run without it"
    extras = project["optional-dependencies"]
    assert {_split(r)[0] for r in extras["spmd"]} == {"torch"}
    assert {"pytest", "nbval", "hypothesis", "nbclient"} <= {_split(r)[0] for r in extras["test"]}
    assert "jupyterlab" in {_split(r)[0] for r in extras["lab"]}


def test_readme_opens_with_the_two_commands():
    readme = ROOT / "README.md"
    assert readme.exists(), "README.md is missing"
    head = "\n".join(readme.read_text().splitlines()[:15])
    assert "make lab" in head and "make test" in head, "README.md should open with `make lab` and `make test`"


def test_makefile_has_lab_and_test_targets():
    text = (ROOT / "Makefile").read_text()
    for target in ("lab", "test"):
        assert re.search(rf"^{target}\s*:", text, flags=re.M), f"Makefile has no `{target}` target"


def test_readme_shows_each_figure_and_says_how_to_use_colab():
    from lesson10 import figures

    text = (ROOT / "README.md").read_text()
    names = [n[len("draw_"):] for n in figures.__all__ if n.startswith("draw_")]
    assert len(names) == 5
    for name in names:
        picture = f"docs/figures/{name}.png"
        assert f"]({picture})" in text, f"README does not show {picture}"
        assert (ROOT / picture).is_file() and (ROOT / picture).stat().st_size > 1000, \
            f"{picture} missing: `make test-frontends` writes it"
    assert "## Use in Colab" in text and "[release]" in text and "python -m lesson10 course" in text


def test_makefile_and_ci_run_the_slow_targets():
    makefile = (ROOT / "Makefile").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    for target in ("test-slow", "test-redteam", "test-colab", "test-frontends", "test-multinode"):
        assert re.search(rf"^{target}\s*:", makefile, flags=re.M), f"Makefile has no `{target}` target"
        assert re.search(rf"^step {target}$", ci, flags=re.M), f".ci/run does not run make {target}"
    assert "apt-get install" in ci and "chromium" in ci
    assert "iproute2" in ci, ".ci/run does not install `ip` for the two-host test"
    other = re.search(r"^OTHER\s*:=(.*)$", makefile, flags=re.M).group(1).split(" or ")
    assert {"colab", "frontends", "multinode", "redteam"} <= {m.strip() for m in other}, other
    fast = re.search(r"^FAST\s*:=(.*)$", makefile, flags=re.M).group(1)
    assert "not slow and not ($(OTHER))" in fast, "make test would run the slow targets' tests too"
