"""An instructor's class, as issue 24 asks: output folders that do not exist yet, nested
downloads and a roster, every file accounted for, a run killed midway and resumed (outputs
byte for byte those of one uninterrupted run), one student graded again, partial credit,
the class report read by headless Chromium. Reduced notebooks (the exercises and their
checks) keep it to a few seconds a notebook."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lesson10.checks.exercises import maximum
from lesson10.course import report as class_report
from lesson10.course.grade import gradebook, main, pipeline

pytestmark = pytest.mark.slow   # a whole command end to end: make test-slow

ROOT = Path(__file__).resolve().parent.parent
COURSE_MAX = maximum()                  # the course file in force
NB03 = "03_load_balance.ipynb"


def _reduced(name: str, edit=None) -> dict:
    """The solution notebook ``name`` without its exploration cells (faster to grade)."""
    nb = json.loads((ROOT / "solutions" / name).read_text())
    keep = [c for c in nb["cells"] if c["cell_type"] == "markdown" or any(
        w in "".join(c["source"]) for w in ("check_", "def ", "import"))]
    nb["cells"] = [c for c in keep if "figures." not in "".join(c["source"])
                   and "summary()" not in "".join(c["source"])]
    for c in nb["cells"]:
        if edit and c["cell_type"] == "code":
            c["source"] = edit("".join(c["source"]))
    return nb


def _put(path: Path, nb) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(nb if isinstance(nb, str) else json.dumps(nb))
    return path


def _class(base: Path) -> Path:
    """alice: a notebook in her folder and one in a nested GitHub download; bob: a wrong
    ring_time, notes.ipynb, a renamed notebook and a stray .py; carol: only a file that is
    not a notebook; dave: nothing (on the roster)."""
    cls = base / "class"
    _put(cls / "alice" / NB03, _reduced(NB03))
    _put(cls / "alice" / "lesson10-main" / "notebooks" / "03_load_balance (1).ipynb",
         _reduced(NB03))                                                     # a second copy
    _put(cls / "alice" / "lesson10-main" / "notebooks" / "01_sequence_parallel.ipynb",
         (ROOT / "notebooks" / "01_sequence_parallel.ipynb").read_text())
    wrong = _reduced(NB03, lambda s: s.replace("return np.asarray(work).max(axis=1).sum()",
                                               "return np.asarray(work).sum(axis=0).max()"))
    _put(cls / "bob" / NB03, wrong)
    _put(cls / "bob" / "notes.ipynb", {"cells": [], "metadata": {}, "nbformat": 4,
                                       "nbformat_minor": 5})
    _put(cls / "bob" / "02_ring_attention.ipynb.txt", "{}")
    _put(cls / "bob" / "scratch" / "tool.py", "x = 1\n")
    _put(cls / "carol" / "04_ulysses.ipynb.txt", "{}")
    (base / "roster.txt").write_text("alice\nbob\ncarol\ndave\n")
    return cls


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("cls")
    cls = _class(base)
    out = base / "not" / "there" / "yet"                 # no such folder before grading
    args = [str(cls), "--roster", str(base / "roster.txt"), "--seed", "5", "-j", "2",
            "--output", str(out / "report.json"), "--csv", str(out / "grades.csv"),
            "--feedback", str(out / "feedback"), "--report", str(out / "report"),
            "--timeout", "60"]
    status = main(args)
    doc = json.loads((out / "report.json").read_text())
    return {"status": status, "doc": doc, "out": out, "cls": cls, "base": base, "args": args,
            "rows": {r["student"]: r for r in doc["students"]}}


def test_output_folders_are_made_and_a_bad_one_stops_before_grading(graded, tmp_path, capsys,
                                                                   monkeypatch):
    assert graded["status"] == 1 and (graded["out"] / "grades.csv").is_file()
    (tmp_path / "a-folder").mkdir()
    graded_now = []                 # the rule, not a time: no notebook is graded at all
    monkeypatch.setattr(pipeline, "_one", lambda *a, **k: graded_now.append(a) or {})
    assert main([str(graded["cls"]), "--csv", str(tmp_path / "a-folder"), "--no-results"]) == 2
    assert "--csv" in capsys.readouterr().err and not graded_now
    (tmp_path / "file").write_text("")
    assert main([str(graded["cls"]), "--feedback", str(tmp_path / "file"), "--no-results"]) == 2
    assert "is a file" in capsys.readouterr().err


def test_nested_downloads_are_the_students_and_the_roster_decides(graded):
    rows = graded["rows"]
    assert list(rows) == ["alice", "bob", "carol", "dave"]       # one row each, roster order
    alice = rows["alice"]
    assert set(alice["notebooks"]) == {"01_sequence_parallel", "03_load_balance"}
    assert alice["points"] == 4 and len(alice["ignored"]) == 1   # the copy counts once
    assert rows["bob"]["points"] == 3
    assert rows["dave"]["missing"] == gradebook.graded_notebooks()


def test_every_file_not_graded_is_named_with_its_reason(graded):
    bob = {Path(f["path"]).name: f["reason"] for f in graded["rows"]["bob"]["not_graded"]}
    assert set(bob) == {"02_ring_attention.ipynb.txt", "tool.py"}
    assert "rename it 02_ring_attention.ipynb" in bob["02_ring_attention.ipynb.txt"]
    assert "beside no notebook" in bob["tool.py"]
    assert [Path(p).name for p in graded["rows"]["bob"]["unknown"]] == ["notes.ipynb"]
    carol = graded["rows"]["carol"]["not_graded"]
    assert [Path(f["path"]).name for f in carol] == ["04_ulysses.ipynb.txt"]
    fb = (graded["out"] / "feedback" / "bob.md").read_text()
    assert "02_ring_attention.ipynb.txt" in fb and "tool.py" in fb and "notes.ipynb" in fb
    # Gradescope's output names them too (one student's submission)
    sub = graded["base"] / "gs"
    shutil.copytree(graded["cls"] / "bob", sub)
    results = graded["base"] / "results.json"
    main([str(sub), "--student", "submission", "--gradescope", str(results), "--seed", "5"])
    gs = json.loads(results.read_text())
    assert "02_ring_attention.ipynb.txt" in gs["output"] and "tool.py" in gs["output"]
    assert "notes.ipynb" in gs["output"]


def test_the_class_report_has_every_part(graded):
    md = (graded["out"] / "report" / class_report.MD_NAME).read_text()
    assert "| ring_time | 1 | 0 | 1 | 0 | 2 | 0 |" in md        # alice passed, bob failed
    assert "ring_time_mistake" in md                           # bob's mistake, by name
    assert "## Distribution of totals" in md and "| 0 | 2 |" in md
    assert md.index("| dave |") < md.index("| alice |")       # most missing first
    html = (graded["out"] / "report" / class_report.HTML_NAME).read_text()
    assert html.count("data:image/png;base64,") >= 3 and "http" not in html


def test_the_report_command_reads_the_results_folder(graded, tmp_path):
    results = graded["out"] / "lesson10-results"
    proc = subprocess.run([sys.executable, "-m", "lesson10", "report", str(results),
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / class_report.MD_NAME).read_text() == \
        (graded["out"] / "report" / class_report.MD_NAME).read_text()
    bad = subprocess.run([sys.executable, "-m", "lesson10", "report", str(tmp_path / "nothing")],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "no graded class" in bad.stderr


def test_the_class_report_reads_in_headless_chromium(graded, tmp_path):
    chromium = os.environ.get("LESSON10_CHROMIUM") or shutil.which("chromium")
    playwright = pytest.importorskip("playwright.sync_api")
    if not chromium:
        pytest.skip("no chromium (apt-get install chromium)")
    page_file = graded["out"] / "report" / class_report.HTML_NAME
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page()
        requests = []
        page.on("request", lambda r: requests.append(r.url))
        page.goto(page_file.as_uri())
        widths = page.eval_on_selector_all("img", "els => els.map(e => e.naturalWidth)")
        headline = page.inner_text("#headline")
        tables = page.eval_on_selector_all("table", "els => els.length")
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        browser.close()
    assert len(widths) >= 3 and all(w > 100 for w in widths)    # every plot decoded
    assert headline.startswith("4 students") and tables == 6   # and every student, similarity flags
    assert all(u.startswith(("file:", "data:")) for u in requests)   # nothing from the network
    assert (tmp_path / "report.png").stat().st_size > 10_000


def _outputs(out: Path) -> dict:
    files = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*")
             if p.is_file() and "lesson10-results" not in p.parts}
    assert files
    return files


def test_a_killed_run_resumes_and_writes_what_one_run_writes(graded, tmp_path):
    cls, roster = graded["cls"], graded["base"] / "roster.txt"

    def command(out: Path) -> list[str]:
        return [sys.executable, "-m", "lesson10", "grade", str(cls), "--roster", str(roster),
                "--seed", "5", "-j", "1", "--resume", str(out / "results"), "--csv",
                str(out / "o" / "grades.csv"), "--output", str(out / "o" / "report.json"),
                "--feedback", str(out / "o" / "feedback"), "--timeout", "60"]

    first = tmp_path / "killed"
    proc = subprocess.Popen(command(first), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stored = first / "results" / "results"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None and \
            not (stored.is_dir() and any(stored.glob("*.json"))):
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)                         # the grader dies midway
    proc.wait(timeout=30)
    done = len(list(stored.glob("*.json")))
    assert 1 <= done < 4, f"{done} results before the kill: not midway"
    assert not (first / "o" / "grades.csv").exists()
    again = subprocess.run(command(first), capture_output=True, text=True, timeout=600)
    assert again.returncode == 1, again.stderr
    assert f"{done} of 4 notebooks already graded" in again.stderr
    whole = tmp_path / "whole"
    one = subprocess.run(command(whole), capture_output=True, text=True, timeout=600)
    assert one.returncode == 1, one.stderr
    assert _outputs(first / "o") == _outputs(whole / "o")


def test_grading_one_student_again_updates_their_rows(graded, tmp_path):
    base = tmp_path / "c"
    shutil.copytree(graded["base"], base, ignore=shutil.ignore_patterns("not", "gs*", "*.json"))
    cls, out = base / "class", base / "out"
    args = [str(cls), "--roster", str(base / "roster.txt"), "--seed", "5", "-j", "2",
            "--csv", str(out / "grades.csv"), "--output", str(out / "r.json"), "--timeout", "60"]
    assert main(args) == 1
    before = {r["student"]: r["points"] for r in json.loads((out / "r.json").read_text())["students"]}
    _put(cls / "bob" / NB03, _reduced(NB03))                    # bob hands in a fixed notebook
    assert main([str(cls / "bob"), *args[1:]]) == 1             # only bob is graded again
    after = {r["student"]: r for r in json.loads((out / "r.json").read_text())["students"]}
    assert list(after) == list(before) and after["bob"]["points"] == before["bob"] + 1
    assert {s: r["points"] for s, r in after.items() if s != "bob"} == \
        {s: p for s, p in before.items() if s != "bob"}
    assert [Path(f["path"]).name for f in after["bob"]["not_graded"]] == \
        ["02_ring_attention.ipynb.txt", "tool.py"]
    csv_rows = (out / "grades.csv").read_text().splitlines()
    assert len(csv_rows) == 5 and csv_rows[2].startswith("bob,")
