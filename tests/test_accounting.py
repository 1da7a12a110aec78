"""lesson10.course.grade.accounting: every file of a submission folder that is not graded,
and the reason a student is given for it."""
import os

from lesson10.checks.helper_files import MAX_HELPERS
from lesson10.course.grade import accounting


def _tree(root):
    files = ["a/01.ipynb", "a/helper.py", "a/notes.txt", "a/02.ipynb.txt", "a/Thumbs.db",
             "a/.hidden", "a/.git/config", "a/__MACOSX/junk.py", "a/.ipynb_checkpoints/x.py",
             "b/lonely.py", "b/readme.md"]
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x = 1\n", encoding="utf-8")
    return root


def test_find_others_skips_notebooks_hidden_noise_and_skipped_folders(tmp_path):
    _tree(tmp_path)
    found = [p.relative_to(tmp_path).as_posix() for p in accounting.find_others([tmp_path])]
    assert found == ["a/02.ipynb.txt", "a/helper.py", "a/notes.txt", "b/lonely.py", "b/readme.md"]


def test_find_others_lists_a_file_once_and_ignores_files_named_directly(tmp_path):
    _tree(tmp_path)
    twice = accounting.find_others([tmp_path / "a", tmp_path / "a", tmp_path / "a" / "notes.txt"])
    assert [p.name for p in twice] == ["02.ipynb.txt", "helper.py", "notes.txt"]
    assert accounting.find_others([tmp_path / "missing"]) == []


def test_each_kind_of_file_gets_its_own_reason(tmp_path):
    folders = {os.path.abspath(tmp_path / "a")}
    near_miss = accounting.reason(tmp_path / "a" / "02.ipynb.txt", folders)
    assert "'.txt'" in near_miss and "rename it 02.ipynb" in near_miss
    assert "over the limit" in accounting.reason(tmp_path / "a" / "extra.py", folders)
    assert "beside no notebook" in accounting.reason(tmp_path / "b" / "lonely.py", folders)
    assert accounting.reason(tmp_path / "a" / "notes.txt", folders).startswith("not a notebook")


def test_not_graded_leaves_out_the_helpers_a_notebook_is_given(tmp_path):
    _tree(tmp_path)
    others = accounting.find_others([tmp_path])
    reasons = accounting.not_graded(others, [tmp_path / "a" / "01.ipynb"])
    names = {os.path.relpath(p, tmp_path): why for p, why in reasons.items()}
    assert "a/helper.py" not in names                   # beside the notebook: it is a helper
    assert set(names) == {"a/02.ipynb.txt", "a/notes.txt", "b/lonely.py", "b/readme.md"}
    assert "beside no notebook" in names["b/lonely.py"]


def test_helpers_over_the_limit_are_reported_not_dropped(tmp_path):
    for i in range(MAX_HELPERS + 2):
        (tmp_path / f"h{i:02d}.py").write_text("", encoding="utf-8")
    notebook = tmp_path / "01.ipynb"
    notebook.write_text("{}", encoding="utf-8")
    helpers = accounting.helpers_of([notebook])
    assert len(helpers) == MAX_HELPERS
    reasons = accounting.not_graded(accounting.find_others([tmp_path]), [notebook])
    assert len(reasons) == 2 and all("over the limit" in why for why in reasons.values())
