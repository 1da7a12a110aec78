"""``python -m lesson10 release DIR``: the student repository holds the package, the
exercise notebooks, a README for students and the Classroom workflow, and nothing of a
solution."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lesson10.course import release
from lesson10.course.build import BEGIN, END, install_url, plan, repository_setting

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    folder = tmp_path_factory.mktemp("release") / "student-repo"
    proc = subprocess.run([sys.executable, "-m", "lesson10", "release", str(folder)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return folder


def test_the_release_has_what_students_need(released):
    top = sorted(p.name for p in released.iterdir())
    assert top == sorted([".github", ".gitignore", release.MARKER, "README.md", "lesson10",
                          "notebooks", "pyproject.toml", "course.toml"])
    built = {p.name: t for p, t in plan(ROOT).items() if p.parent.name == "notebooks"}
    assert {p.name: p.read_text() for p in (released / "notebooks").glob("*.ipynb")} == built
    assert (released / "lesson10" / "course" / "grade" / "judge.py").is_file()
    assert not list(released.rglob("__pycache__"))
    proc = subprocess.run([sys.executable, "-c", "import lesson10, lesson10.checks, lesson10.course.grade;"
                           "print(lesson10.__file__)"], cwd=released, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith(str(released)), proc.stderr


def test_no_solutions_in_the_release(released):
    assert not any(p.name == "solutions" for p in released.rglob("*"))
    assert not any(p.name.startswith("answers_") for p in released.rglob("*"))
    assert not (released / "tests").exists()
    for nb in (released / "notebooks").glob("*.ipynb"):
        text = nb.read_text()
        assert BEGIN not in text and END not in text, nb
    assert release.leaks(released, release._solution_regions(ROOT)) == []


def test_the_leak_check_finds_a_solution_cell(released, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(released, copy)
    nb = json.loads((copy / "notebooks" / "03_load_balance.ipynb").read_text())
    solved = json.loads((ROOT / "solutions" / "03_load_balance.ipynb").read_text())
    body = next("".join(c["source"]) for c in solved["cells"] if BEGIN in "".join(c["source"]))
    nb["cells"].append({"cell_type": "code", "metadata": {}, "outputs": [],
                        "execution_count": None,
                        "source": body.replace(BEGIN, "").replace(END, "")})
    (copy / "notebooks" / "03_load_balance.ipynb").write_text(json.dumps(nb))
    found = release.leaks(copy, release._solution_regions(ROOT))
    assert found and "the code of a solution region" in found[0]
    (copy / "solutions").mkdir()
    assert any("solutions folder" in f for f in release.leaks(copy, []))


def test_readme_and_workflow(released):
    readme = (released / "README.md").read_text()
    assert "Instructors" not in readme and "solutions/" not in readme
    assert release.NOTEBOOKS_MARK not in readme
    repository, ref = repository_setting(ROOT)
    for nb in (released / "notebooks").glob("*.ipynb"):
        assert f"colab.research.google.com/github/{repository}/blob/{ref}/notebooks/{nb.name}" in readme
    flow = (released / ".github" / "workflows" / "classroom.yml").read_text()
    assert f'COURSE_PACKAGE: "lesson10 @ {install_url(repository, ref)}"' in flow
    assert flow.replace(install_url(repository, ref), "") == \
        (ROOT / "classroom" / ".github" / "workflows" / "classroom.yml").read_text().replace(
            install_url(repository, ref), "")
    assert release.workflow_problem(ROOT) is None          # the committed template is pinned
    meta = json.loads((released / release.MARKER).read_text())
    assert (meta["repository"], meta["ref"]) == (repository, ref)


def test_writing_over_an_earlier_release_keeps_git_and_refuses_other_folders(tmp_path):
    folder = tmp_path / "repo"
    release.release(folder)
    (folder / ".git").mkdir()
    (folder / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (folder / "stale.txt").write_text("from an old release")
    release.release(folder)
    assert (folder / ".git" / "HEAD").is_file() and not (folder / "stale.txt").exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "thesis.tex").write_text("x")
    with pytest.raises(release.ReleaseError, match="--force"):
        release.release(other)
    assert (other / "thesis.tex").exists()
    release.release(other, force=True)
    assert not (other / "thesis.tex").exists() and (other / "notebooks").is_dir()
    with pytest.raises(release.ReleaseError, match="inside the course repository"):
        release.release(ROOT / "build" / "release")


def test_release_warns_while_the_repository_and_ref_are_the_defaults(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "lesson10", "release", str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    repository, ref = repository_setting(ROOT)
    said = [line for line in proc.stderr.splitlines() if line.startswith("release: warning:")]
    expected = release.default_warnings(repository, ref)
    assert len(said) == len(expected)
    if repository == release.DEFAULT_REPOSITORY:
        assert any("repository is still the default" in line for line in said)
    assert release.default_warnings("my-school/lesson10-2026", "fall-2026") == []
    assert len(release.default_warnings(release.DEFAULT_REPOSITORY, "main")) == 2


def test_the_released_fallback_names_the_course_maximum(released):
    from lesson10.course.grade.gradebook import course_max
    text = (released / ".github" / "workflows" / "classroom.yml").read_text()
    fallback = next(line for line in text.splitlines() if "printf" in line)
    assert f'"max_score": {course_max()}' in fallback and '"max_score": 0' not in fallback
