"""A submission's own files (issue 23): helper modules and notebooks are read as regular
files, never through a link, and in a folder several students share a helper is only the
student's it is named after."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from lesson10.course.grade import gradebook
from lesson10.course.grade.pipeline import _helpers
from lesson10.course.grade.submission_files import (
    MAX_HELPER_BYTES,
    MAX_HELPERS,
    FileRefused,
    helper_files,
    owner,
    read_regular,
)


def _names(h) -> list[str]:
    return [n for n, _ in h.files]


def test_helpers_beside_a_notebook_are_copied_and_links_are_refused(tmp_path):
    (tmp_path / "nb.ipynb").write_text("{}")
    (tmp_path / "mine.py").write_text("X = 1\n")
    (tmp_path / ".hidden.py").write_text("")
    (tmp_path / "notes.txt").write_text("")
    other = tmp_path.parent / f"{tmp_path.name}-classmate"
    other.mkdir()
    (other / "theirs.py").write_text("SECRET = 2\n")
    os.symlink(other / "theirs.py", tmp_path / "linked.py")
    os.symlink("mine.py", tmp_path / "samefolder.py")            # even inside the folder
    os.symlink(other, tmp_path / "folder.py")
    os.symlink(tmp_path / "gone", tmp_path / "dangling.py")
    os.mkfifo(tmp_path / "pipe.py")
    (tmp_path / "sub.py").mkdir()
    h = helper_files(tmp_path / "nb.ipynb")
    assert h.files == [("mine.py", "X = 1\n")] == list(h) and len(h) == 1   # also a list of pairs
    said = "\n".join(h.notes)
    for name in ("linked.py", "samefolder.py", "folder.py", "dangling.py"):
        assert f"{name} was not copied into the sandbox: it is a symbolic link" in said, said
    assert "pipe.py was not copied into the sandbox: it is not a regular file" in said
    assert "sub.py was not copied" in said and "SECRET" not in str(h.files)


def test_large_and_many_helpers_are_capped_with_a_note(tmp_path):
    (tmp_path / "big.py").write_bytes(b"#" * (MAX_HELPER_BYTES + 1))
    for i in range(MAX_HELPERS + 3):
        (tmp_path / f"m{i:02d}.py").write_text(f"I = {i}\n")
    h = helper_files(tmp_path / "nb.ipynb")
    assert "big.py" not in _names(h) and len(h.files) == MAX_HELPERS
    assert any("big.py" in n and "over" in n for n in h.notes)
    assert any(f"more than {MAX_HELPERS} helper files" in n for n in h.notes)


def test_read_regular_refuses_links_and_reads_files(tmp_path):
    (tmp_path / "a.ipynb").write_bytes(b"abc")
    os.symlink(tmp_path / "a.ipynb", tmp_path / "b.ipynb")
    assert read_regular(tmp_path / "a.ipynb") == b"abc"
    with pytest.raises(FileRefused, match="symbolic link"):
        read_regular(tmp_path / "b.ipynb")
    with pytest.raises(FileRefused, match="over 2 bytes"):
        read_regular(tmp_path / "a.ipynb", 2)
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "none.ipynb")


@pytest.mark.parametrize("name, rx, who, alias", [
    ("alice_helper.py", None, "alice", None),
    ("alice-utils.py", None, "alice", None),
    ("Alice_x.py", None, "alice", None),
    ("alicea_x.py", None, None, None),                 # not "alice" followed by a separator
    ("al_x.py", None, "al", None),
    ("alice_b_x.py", None, "alice_b", None),           # the longest name wins
    ("helper.py", None, None, None),                   # nobody's
    ("bob_03_helper.py", r"(?P<student>[^/_]+)_\d\d_", "bob", "helper.py"),
    ("bob_03_2x.py", r"(?P<student>[^/_]+)_\d\d_", "bob", None),     # not a module name
    ("eve_03_helper.py", r"(?P<student>[^/_]+)_\d\d_", None, None),  # not a student here
])
def test_the_owner_of_a_helper_in_a_shared_folder(name, rx, who, alias):
    students = ["al", "alice", "alice_b", "bob"]
    assert owner(Path("subs") / name, students, rx) == (who, alias)


def test_a_flat_folder_gives_each_student_only_their_own_helpers(tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    for who in ("alice", "bob"):
        (flat / f"{who}_03_load_balance.ipynb").write_text("{}")
    (flat / "alice_zz.py").write_text("A = 1\n")
    (flat / "bob_03_rt.py").write_text("B = 1\n")
    (flat / "shared.py").write_text("S = 1\n")
    paths = sorted(flat.glob("*.ipynb"))
    contents = {p: p.read_bytes() for p in paths}
    rx = r"(?P<student>[^/_]+)_\d\d_"
    plan = gradebook.plan(paths, contents, student_from=rx)
    got = {it.student: _names(h) for it, h in
           zip(plan.graded, _helpers(plan, contents, rx).values())}
    assert got == {"alice": ["alice_zz.py"], "bob": ["bob_03_rt.py", "rt.py"]}


def test_a_folder_of_one_student_gives_every_helper_beside_the_notebook(tmp_path):
    for who in ("alice", "bob"):
        (tmp_path / who).mkdir()
        (tmp_path / who / "03_load_balance.ipynb").write_text("{}")
        (tmp_path / who / "helper.py").write_text(f"WHO = {who!r}\n")
    paths = sorted(tmp_path.glob("*/*.ipynb"))
    contents = {p: p.read_bytes() for p in paths}
    plan = gradebook.plan(paths, contents)
    helpers = _helpers(plan, contents, None)
    for it in plan.graded:
        assert helpers[it.path].files == [("helper.py", f"WHO = {it.student!r}\n")]
