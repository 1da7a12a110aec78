"""Zip submissions (issue 32): ``grade`` unpacks them, nested ones too, within limits
(zip-slip, links, file count, unpacked size, nesting), and the files inside count for the
student whose folder the zip is in; an unsafe archive is refused with one sentence."""
import io
import json
import os
import stat
import zipfile
from pathlib import Path

from lesson10.course.grade import archives, gradebook

ROOT = Path(__file__).resolve().parent.parent
NB03 = "03_load_balance.ipynb"


def _zip(entries: dict) -> bytes:
    """A zip of ``name -> bytes`` (a ``zipfile.ZipInfo`` as a name is written as it is)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)
    return out.getvalue()


def _notebook() -> bytes:
    return (ROOT / "notebooks" / NB03).read_bytes()


def _plan(tmp_path: Path, batch: archives.Batch, given=()) -> gradebook.Plan:
    return gradebook.plan(batch.paths, batch.contents, others=batch.others,
                          anchors=batch.unpacked.zips, notes=batch.unpacked.refused,
                          real=batch.real, given=given)


def test_a_canvas_zip_with_a_zip_inside_counts_for_its_student(tmp_path):
    cls = tmp_path / "class"
    (cls / "alice").mkdir(parents=True)
    (cls / "alice" / NB03).write_bytes(_notebook())
    inner = _zip({f"carol_submission/{NB03}": _notebook(), "carol_submission/helper.py": b"x = 1\n",
                  "carol_submission/notes.txt": b"hi"})
    (cls / "carol").mkdir()
    (cls / "carol" / "submissions.zip").write_bytes(_zip({"carol_12_34_lesson10.zip": inner}))
    batch = archives.gather([cls], tmp_path / "unzipped")
    assert len(batch.paths) == 2 and not batch.unpacked.refused
    shown = next(p for p in batch.paths if "carol" in str(p))
    assert str(shown).endswith(f"carol/submissions.zip/carol_12_34_lesson10.zip/carol_submission/{NB03}")
    assert batch.contents[shown] == _notebook() and Path(batch.real[shown]).is_file()
    plan = _plan(tmp_path, batch)
    assert sorted(it.student for it in plan.graded) == ["alice", "carol"]
    assert plan.students == ["alice", "carol"]
    # the zips are no files "not graded"; the text file inside is, with its shown path
    listed = [f["path"] for f in plan.not_graded.get("carol", [])]
    assert [Path(p).name for p in listed] == ["notes.txt"] and "submissions.zip" in listed[0]


def test_a_zip_named_on_the_command_line(tmp_path):
    z = tmp_path / "alice.zip"
    z.write_bytes(_zip({f"lesson10-main/notebooks/{NB03}": _notebook()}))
    batch = archives.gather([z], tmp_path / "u")
    assert len(batch.paths) == 1
    assert [it.student for it in _plan(tmp_path, batch, [z]).graded] == ["alice"]


def test_a_class_zip_with_a_folder_per_student(tmp_path):
    z = tmp_path / "class.zip"
    z.write_bytes(_zip({f"ann/{NB03}": _notebook(), f"ben/{NB03}": _notebook()}))
    batch = archives.gather([tmp_path], tmp_path / "u")
    assert sorted(it.student for it in _plan(tmp_path, batch).graded) == ["ann", "ben"]


def _refusal(tmp_path: Path, data: bytes) -> str:
    folder = tmp_path / "class" / "eve"
    folder.mkdir(parents=True)
    (folder / "hw.zip").write_bytes(data)
    (folder / NB03).write_bytes(_notebook())
    batch = archives.gather([tmp_path / "class"], tmp_path / "u")
    assert len(batch.paths) == 1                       # her own notebook is graded still
    plan = _plan(tmp_path, batch)
    (entry,) = plan.not_graded["eve"]
    assert Path(entry["path"]).name == "hw.zip"
    assert not any(p.name == "evil.txt" for p in (tmp_path / "u").rglob("*"))
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "class" / "evil.txt").exists()
    why = entry["reason"]
    assert why.startswith("an archive the grader does not unpack: ") and "\n" not in why
    return why


def test_zip_slip_is_refused(tmp_path):
    assert "zip-slip" in _refusal(tmp_path, _zip({"../../evil.txt": b"x", NB03: _notebook()}))


def test_an_absolute_member_is_refused(tmp_path):
    assert "zip-slip" in _refusal(tmp_path, _zip({"/tmp/evil.txt": b"x"}))


def test_a_link_in_a_zip_is_refused(tmp_path):
    link = zipfile.ZipInfo("evil.txt")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr(link, "/etc/passwd")
    assert "symbolic link" in _refusal(tmp_path, out.getvalue())


def test_an_encrypted_member_is_refused(tmp_path):
    data = bytearray(_zip({"evil.txt": b"x"}))
    for sig in (b"PK\x03\x04", b"PK\x01\x02"):          # set bit 0 of the general purpose flags
        at = data.index(sig)
        offset = at + (6 if sig == b"PK\x03\x04" else 8)
        data[offset] |= 1
    assert "encrypted" in _refusal(tmp_path, bytes(data))


def test_not_a_zip_is_refused(tmp_path):
    assert "not a zip archive" in _refusal(tmp_path, b"this is no zip")


def test_the_count_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(archives, "MAX_MEMBERS", 3)
    assert "more than 3 files" in _refusal(tmp_path, _zip({f"f{i}.txt": b"x" for i in range(4)}))


def test_the_size_limit_counts_what_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(archives, "MAX_UNPACKED_BYTES", 1000)
    assert "more than" in _refusal(tmp_path, _zip({"big.txt": b"0" * 5000}))


def test_the_nesting_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(archives, "MAX_NESTING", 2)
    deep = _zip({"evil.txt": b"x"})
    for i in range(3):
        deep = _zip({f"level{i}.zip": deep})
    cls = tmp_path / "class" / "eve"
    cls.mkdir(parents=True)
    (cls / "hw.zip").write_bytes(deep)
    batch = archives.gather([tmp_path / "class"], tmp_path / "u")
    (why,) = batch.unpacked.refused.values()
    assert "zip inside 2 zips" in why


def test_member_names_that_are_not_utf8_are_decoded_as_a_file_system_does(tmp_path):
    info = zipfile.ZipInfo("x")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr(info, b"")
    raw = "Jos\xe9".encode("latin-1")                 # a Windows zip: no UTF-8 flag
    info.filename = raw.decode("cp437")
    assert archives.member_name(info) == os.fsdecode(raw)
    utf8 = zipfile.ZipInfo("Jos\u00e9")
    utf8.flag_bits |= 0x800
    assert archives.member_name(utf8) == "José"


def test_find_zips_skips_hidden_and_macosx(tmp_path):
    for rel in ("a/x.zip", ".hidden/y.zip", "__MACOSX/z.zip", "a/.w.zip", "a/n.ZIP"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    assert [p.relative_to(tmp_path).as_posix() for p in archives.find_zips([tmp_path])] == \
        ["a/n.ZIP", "a/x.zip"]


def test_the_student_of_a_lone_zip_is_its_name(tmp_path):
    z = tmp_path / "carol.zip"
    z.write_bytes(_zip({NB03: _notebook()}))
    batch = archives.gather([z], tmp_path / "u")
    assert [it.student for it in _plan(tmp_path, batch, [z]).graded] == ["carol"]
    assert json.loads(batch.contents[batch.paths[0]])["nbformat"] == 4


def test_a_file_over_the_limit_inside_a_zip_costs_its_points_only(tmp_path, monkeypatch, capsys):
    """Refused files are reported before any code runs (no sandbox needed)."""
    from lesson10.course.grade import main, nbread
    monkeypatch.setattr(nbread, "MAX_NOTEBOOK_BYTES", len(_notebook()) - 1)
    (tmp_path / "class" / "carol").mkdir(parents=True)
    (tmp_path / "class" / "carol" / "hw.zip").write_bytes(_zip({NB03: _notebook()}))
    out = tmp_path / "r.json"
    status = main([str(tmp_path / "class"), "--no-sandbox", "--output", str(out), "--no-results"])
    assert status == 1                                    # points lost, no grader error
    (rep,) = json.loads(out.read_text())["notebooks"]
    assert rep["ok"] and rep["student"] == "carol" and rep["notebook"].endswith(f"hw.zip/{NB03}")
    assert {e["status"] for e in rep["exercises"]} == {"unreadable"}
    assert "limit" in rep["feedback"][0]


def test_a_students_zip_beside_the_others_folders_is_named_after_them(tmp_path):
    """Whatever folder the zip holds: never a folder inside a student's zip."""
    cls = tmp_path / "class"
    (cls / "alice").mkdir(parents=True)
    (cls / "alice" / NB03).write_bytes(_notebook())
    (cls / "bob.zip").write_bytes(_zip({f"lesson10-main/notebooks/{NB03}": _notebook()}))
    (cls / "carol.zip").write_bytes(_zip({NB03: _notebook()}))
    (cls / "late.zip").write_bytes(_zip({f"dave/{NB03}": _notebook()}))
    batch = archives.gather([cls], tmp_path / "u")
    assert sorted(it.student for it in _plan(tmp_path, batch).graded) == \
        ["alice", "bob", "carol", "late"]


def test_members_that_cannot_be_written_refuse_the_archive(tmp_path):
    """A file and a folder of one name, a name too long for the file system."""
    assert "cannot be unpacked" in _refusal(tmp_path, _zip({"a": b"x", "a/b.txt": b"y"}))


def test_a_name_too_long_refuses_the_archive(tmp_path):
    assert "cannot be unpacked" in _refusal(tmp_path, _zip({"n" * 300 + ".txt": b"y"}))


def test_an_unknown_compression_refuses_the_archive(tmp_path):
    data = bytearray(_zip({"evil.txt": b"x"}))
    for sig, at in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):   # compression method: 99 (AES)
        i = data.index(sig) + at
        data[i:i + 2] = (99).to_bytes(2, "little")
    assert "cannot be unpacked" in _refusal(tmp_path, bytes(data))
