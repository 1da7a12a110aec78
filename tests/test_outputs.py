"""lesson10.course.grade.outputs: the paths checked before grading, and the JSON written
without timings."""
from types import SimpleNamespace

from lesson10.course.grade import outputs


def _args(**paths):
    return SimpleNamespace(**{name: None for name in outputs.FILE_OUTPUTS + outputs.FOLDER_OUTPUTS}
                           | paths)


def test_good_paths_pass_and_their_folders_are_made(tmp_path):
    args = _args(csv=tmp_path / "deep" / "x.csv", feedback=tmp_path / "fb" / "inner")
    assert outputs.check(args) is None
    assert (tmp_path / "deep").is_dir() and not (tmp_path / "deep" / "x.csv").exists()
    assert (tmp_path / "fb" / "inner").is_dir() and not list((tmp_path / "fb" / "inner").iterdir())


def test_an_existing_file_output_is_kept(tmp_path):
    kept = tmp_path / "old.json"
    kept.write_text("old", encoding="utf-8")
    assert outputs.check(_args(output=kept)) is None
    assert kept.read_text(encoding="utf-8") == "old"


def test_a_folder_given_for_a_file_is_refused_with_its_option(tmp_path):
    why = outputs.check(_args(junit=tmp_path))
    assert why is not None and why.startswith(f"--junit {tmp_path}:") and "is a folder" in why


def test_a_file_given_for_a_folder_is_refused_with_its_option(tmp_path):
    (tmp_path / "f").write_text("", encoding="utf-8")
    why = outputs.check(_args(save_executed=tmp_path / "f"))
    assert why is not None and why.startswith("--save-executed ") and "is a file" in why


def test_a_path_under_a_file_cannot_be_written(tmp_path):
    (tmp_path / "f").write_text("", encoding="utf-8")
    why = outputs.check(_args(markdown=tmp_path / "f" / "x.md"))
    assert why is not None and why.startswith("--markdown ") and "cannot write" in why


def test_timings_are_removed_at_every_depth_and_nothing_else():
    doc = {"seconds": 1.5, "a": [{"sandbox_cpu_seconds": 2, "b": 3}, 4],
           "c": {"seconds": 0, "d": "seconds"}}
    assert outputs.without_timings(doc) == {"a": [{"b": 3}, 4], "c": {"d": "seconds"}}
    assert doc["seconds"] == 1.5                              # the input is left as it was


def test_every_writer_is_an_option_the_checks_know():
    checked = set(outputs.FILE_OUTPUTS + outputs.FOLDER_OUTPUTS)
    assert {option for option, _ in outputs.WRITERS} <= checked
    assert set(outputs.STUDENT_OUTPUTS) <= checked
