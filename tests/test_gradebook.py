"""The gradebook without grading: who a notebook's student is, copies and collisions, rows
with every course exercise, the class CSV, Gradescope's and Classroom's one-student files,
JUnit, Markdown, the feedback files and the executed notebooks' summary. Reports are made
by hand here; tests/test_gradebook_cli.py grades a real class once."""
import json
import os
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from lesson10.checks import EXERCISES
from lesson10.checks.exercises import maximum
from lesson10.course.grade import classroom, course, exit_status, feedback, gradebook, reports

ROOT = Path(__file__).resolve().parent.parent
COURSE_MAX = maximum()                  # the course file in force
BLANK = (ROOT / "notebooks" / "03_load_balance.ipynb").read_bytes()
_nb = json.loads(BLANK)
_nb["metadata"].pop("lesson10")
UNTAGGED = json.dumps(_nb).encode()          # as Colab's copy may be: no notebook id inside


def _fake(student, notebook, entries, ok=True, path=None):
    return {"notebook": path or f"subs/{student}/{notebook}.ipynb", "student": student,
            "course_notebook": notebook, "ok": ok, "error": None if ok else "boom",
            "feedback": [], "sandboxed": True, "seconds": 1.5,
            "exercises": [{"exercise": e, "status": st, "passed": st == "passed",
                           "points": p, "max_points": m, "message": msg}
                          for e, st, p, m, msg in entries],
            "points": sum(e[2] for e in entries), "max_points": sum(e[3] for e in entries)}


WRONG = ("check_ring_time failed: rank 2: ring time differs\n  yours : 3\n  target: 4\n"
         "hint: take the busiest rank of each round (max over axis 1), then sum the rounds")
ALICE = _fake("alice", "03_load_balance", [
    ("zigzag_positions", "passed", 1, 1, "12 cases"), ("causal_work", "passed", 2, 2, "13 cases"),
    ("ring_time", "failed", 0, 1, WRONG)])
BOB = _fake("bob", "02_ring_attention", [
    ("block_attention", "not attempted", 0, 1, "block_attention still raises NotImplementedError"),
    ("merge", "passed", 1, 1, "ok"), ("ring_attention", "check removed", 0, 2, "restore it")])


def _write(path: Path, data: bytes = BLANK, mtime=None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def _plan(paths, **kw):
    return gradebook.plan(paths, {p: p.read_bytes() if p.is_file() else None for p in paths}, **kw)


# ------------------------------------------------------------------ names and students
@pytest.mark.parametrize("name, nid", [
    ("Copy of 01_sequence_parallel.ipynb", "01_sequence_parallel"),
    ("Copy of Copy of 02_ring_attention (1).ipynb", "02_ring_attention"),
    ("03_load_balance-Copy1.ipynb", "03_load_balance"),
    ("04_ulysses copy 2.ipynb", "04_ulysses"),
    ("alice_4711_05_moe_dispatch.ipynb", "05_moe_dispatch"),
    ("homework.ipynb", None),
])
def test_copies_and_downloads_are_identified_by_name(name, nid):
    assert course.identify({"metadata": {}}, Path(name))[0] == nid
    assert course.copy_base("Copy of 03_load_balance-Copy2.ipynb") == "03_load_balance"
    assert course.is_copy_name("03_load_balance (1).ipynb")
    assert not course.is_copy_name("03_load_balance.ipynb")


def test_the_student_is_the_folder_relative_to_the_common_parent(tmp_path):
    a = _write(tmp_path / "subs" / "sec1" / "s01" / "03_load_balance.ipynb")
    b = _write(tmp_path / "subs" / "sec2" / "s01" / "03_load_balance.ipynb")
    p = _plan([a, b])
    assert [it.student for it in p.graded] == ["sec1/s01", "sec2/s01"]
    assert p.students == ["sec1/s01", "sec2/s01"] and not p.ignored
    alone = _plan([a])                          # one folder: that folder's name
    assert alone.students == ["s01"]
    assert _plan([a, b], student="ann").students == ["ann"]


def test_student_from_a_regex_and_its_errors(tmp_path):
    a = _write(tmp_path / "flat" / "alice_4711_03_load_balance.ipynb")
    b = _write(tmp_path / "flat" / "bob_4712_03_load_balance.ipynb")
    p = _plan([a, b], student_from=r"(?P<student>[a-z]+)_\d+_")
    assert [it.student for it in p.graded] == ["alice", "bob"]
    with pytest.raises(gradebook.PlanError, match="no group named 'student'"):
        _plan([a], student_from=r"([a-z]+)_")
    with pytest.raises(gradebook.PlanError, match="finds no student"):
        _plan([a], student_from=r"(?P<student>zz+)")
    with pytest.raises(gradebook.PlanError, match="not a regular expression"):
        _plan([a], student_from=r"(?P<student>")


def test_a_flat_download_is_refused_not_merged(tmp_path):
    a = _write(tmp_path / "flat" / "alice_4711_03_load_balance.ipynb")
    b = _write(tmp_path / "flat" / "bob_4712_03_load_balance.ipynb")
    with pytest.raises(gradebook.PlanError, match="merges nobody") as err:
        _plan([a, b])
    assert "alice_4711_03_load_balance.ipynb" in str(err.value)
    c = _write(tmp_path / "flat2" / "alice_01_sequence_parallel.ipynb", UNTAGGED)
    d = _write(tmp_path / "flat2" / "bob_02_ring_attention.ipynb", UNTAGGED)  # none shared
    with pytest.raises(gradebook.PlanError, match="alice, bob"):
        _plan([c, d])


def test_copies_count_once_by_the_documented_rule(tmp_path):
    solved = json.loads(BLANK)
    for cell in solved["cells"]:
        if cell["cell_type"] == "code":
            cell["source"] = [re.sub(r"raise NotImplementedError\(.*\)", "return 0", line)
                              for line in cell["source"]]
    solved = json.dumps(solved).encode()
    folder = tmp_path / "s1"
    plain = _write(folder / "03_load_balance.ipynb", BLANK, mtime=2_000_000)
    colab = _write(folder / "Copy of 03_load_balance.ipynb", solved, mtime=1_000_000)
    p = _plan([plain, colab])
    assert [it.path for it in p.graded] == [colab]          # fewer stubs beats newer
    assert p.ignored == {plain: p.graded[0]}
    # equal work: the newer file, then the name without a copy's decoration
    one = _write(tmp_path / "s2" / "03_load_balance.ipynb", BLANK, mtime=1_000_000)
    two = _write(tmp_path / "s2" / "03_load_balance-Copy1.ipynb", BLANK, mtime=3_000_000)
    assert [it.path for it in _plan([one, two]).graded] == [two]
    os.utime(two, (1_000_000, 1_000_000))
    assert [it.path for it in _plan([one, two]).graded] == [one]
    assert "NotImplementedError" in gradebook.COPY_RULE


def test_versions_count_once_and_one_name_from_two_places_collides(tmp_path):
    a = _write(tmp_path / "s1" / "03_load_balance.ipynb", mtime=1_000_000)
    b = _write(tmp_path / "s1" / "03_load_balance_final.ipynb", mtime=2_000_000)
    p = _plan([a, b])                                    # one student's two versions
    assert [it.path for it in p.graded] == [b] and p.ignored == {a: p.graded[0]}
    c = _write(tmp_path / "repos" / "ann" / "notebooks" / "03_load_balance.ipynb")
    d = _write(tmp_path / "repos" / "ann" / "03_load_balance.ipynb")      # any depth, one repo
    e = _write(tmp_path / "repos" / "bob" / "03_load_balance.ipynb")
    p = _plan([c, d, e], student_from=r"repos/(?P<student>[^/]+)/")
    assert p.students == ["ann", "bob"] and len(p.graded) == 2 and len(p.ignored) == 1
    f = _write(tmp_path / "sec1" / "s01" / "03_load_balance.ipynb")
    g = _write(tmp_path / "sec2" / "s01" / "03_load_balance.ipynb")
    with pytest.raises(gradebook.PlanError, match="s01 / 03_load_balance") as err:
        _plan([f, g], student_from=r"(?P<student>s\d+)/")
    assert "sec1/s01/03_load_balance.ipynb" in str(err.value)
    p = _plan([f, g], student="s01")                     # one student's batch: one is chosen
    assert len(p.graded) == 1 and len(p.ignored) == 1


def test_folders_are_searched_at_any_depth(tmp_path):
    a = _write(tmp_path / "sub" / "deep" / "er" / "03_load_balance.ipynb")
    _write(tmp_path / "sub" / "deep" / ".ipynb_checkpoints" / "03_load_balance-checkpoint.ipynb")
    _write(tmp_path / "sub" / "__MACOSX" / "03_load_balance.ipynb")
    _write(tmp_path / "sub" / "._03_load_balance.ipynb")
    (tmp_path / "sub" / "notes.txt").write_text("x")
    assert gradebook.find_notebooks([tmp_path / "sub"]) == [a]
    missing = tmp_path / "nope.ipynb"
    assert gradebook.find_notebooks([missing, a, a]) == [missing, a]


def test_roster(tmp_path):
    (tmp_path / "r.csv").write_text("name,student\nAnn,alice\nCarl,carl\n")
    assert gradebook.read_roster(tmp_path / "r.csv") == ["alice", "carl"]
    (tmp_path / "r.txt").write_text("# class of 2026\nalice\n\nbob, extra\n")
    assert gradebook.read_roster(tmp_path / "r.txt") == ["alice", "bob"]
    (tmp_path / "d.txt").write_text("alice\nalice\n")
    with pytest.raises(gradebook.PlanError, match="more than once"):
        gradebook.read_roster(tmp_path / "d.txt")
    a = _write(tmp_path / "subs" / "alice" / "03_load_balance.ipynb")
    b = _write(tmp_path / "subs" / "dave" / "03_load_balance.ipynb")
    p = _plan([a, b], roster=["alice", "carl"])
    assert p.students == ["alice", "carl", "dave"] and p.not_on_roster() == ["dave"]


# ------------------------------------------------------------------ rows and the CSV
def test_rows_list_every_exercise_and_missing_notebooks_count_zero():
    rows = gradebook.rows([ALICE, BOB])
    assert [r["student"] for r in rows] == ["alice", "bob"]
    alice = rows[0]
    assert [e["exercise"] for e in alice["exercises"]] == list(EXERCISES)
    assert alice["max_points"] == COURSE_MAX and alice["points"] == 3
    assert alice["missing"] == ["01_sequence_parallel", "02_ring_attention", "04_ulysses",
                                "05_moe_dispatch"]
    status = {e["exercise"]: e["status"] for e in alice["exercises"]}
    assert status["reduce_scatter"] == "missing" and status["ring_time"] == "failed"
    assert exit_status([ALICE, BOB], students=rows) == 1
    full = [_fake("ann", nb, [(ex.id, "passed", ex.points, ex.points, "ok")
                              for ex in course.exercises(nb)]) for nb in gradebook.graded_notebooks()]
    assert exit_status(full, students=gradebook.rows(full)) == 0
    assert exit_status(full[:1], students=gradebook.rows(full[:1])) == 1     # only notebook 01
    assert exit_status(full[:1], fail_under=10, students=gradebook.rows(full[:1])) == 1
    broken = _fake("ann", "03_load_balance", [], ok=False)
    assert exit_status(full + [broken], students=gradebook.rows(full + [broken])) == 2


def test_class_csv_has_every_exercise_the_course_max_and_statuses():
    text = reports.class_csv([ALICE, BOB], seed=9)
    head = text.splitlines()[0].split(",")
    assert head[0] == "student" and head[1:1 + len(EXERCISES)] == list(EXERCISES)
    assert head[-2:] == ["total", "max"]
    rows = list(__import__("csv").DictReader(text.splitlines()))
    assert [r["student"] for r in rows] == ["alice", "bob"]
    for r in rows:
        assert set(EXERCISES) <= set(r) and r["max"] == str(COURSE_MAX) and r["seed"] == "9"
    assert rows[0]["ring_time"] == "0" and rows[0]["causal_work"] == "2" and rows[0]["total"] == "3"
    assert rows[0]["ring_time status"] == "failed" and rows[0]["merge status"] == "missing"
    assert rows[1]["block_attention status"] == "not attempted"
    assert rows[1]["ring_attention status"] == "check removed"
    assert rows[1]["missing"].split() == ["01_sequence_parallel", "03_load_balance",
                                          "04_ulysses", "05_moe_dispatch"]


def test_split_message_separates_the_hint():
    body, hints = gradebook.split_message(WRONG)
    assert body.startswith("check_ring_time failed") and "target: 4" in body
    assert hints == ["take the busiest rank of each round (max over axis 1), then sum the rounds"]


# ------------------------------------------------------------------ one student's files
def test_gradescope_is_one_student_with_every_exercise():
    with pytest.raises(ValueError, match="2 students"):
        reports.gradescope([ALICE, BOB])
    doc = json.loads(reports.gradescope([ALICE], seed=5, sandboxed=False,
                                        notes=["Not sandboxed: ..."]))
    assert len(doc["tests"]) == len(EXERCISES)
    assert sum(t.get("max_score", 0) for t in doc["tests"]) == COURSE_MAX == doc["max_score"]
    practice = [t for t in doc["tests"] if "max_score" not in t]
    assert len(practice) == sum(ex.optional for ex in EXERCISES.values())
    assert all(t["name"].endswith("(optional practice)") and "status" not in t and "score" not in t
               and t["output"].startswith("optional: ") for t in practice)
    assert doc["score"] == 3 and doc["visibility"] == "visible" and doc["extra_data"]["seed"] == 5
    assert all(t["visibility"] == "visible" for t in doc["tests"])
    ring = next(t for t in doc["tests"] if t["name"] == "03_load_balance: ring_time")
    assert "Hint: take the busiest rank" in ring["output"] and ring["score"] == 0
    assert "Missing (0 points each): 01_sequence_parallel" in doc["output"]
    assert "Not sandboxed" in doc["output"] and "seed 5" in doc["output"]
    err = json.loads(reports.gradescope([_fake("x", "03_load_balance", [], ok=False)]))
    assert "GRADER ERROR" in err["output"] and len(err["tests"]) == len(EXERCISES)


def test_classroom_runner_results():
    with pytest.raises(ValueError):
        classroom.runner_results([ALICE, BOB])
    doc = classroom.runner_results([ALICE], seed=5)
    assert doc["version"] == 1 and doc["status"] == "fail" and doc["max_score"] == COURSE_MAX
    # one point per test (a test per part of a multi-point exercise): the reporter's log,
    # (tests passed / tests) x max, is then Classroom's points
    assert doc["seed"] == 5 and len(doc["tests"]) == COURSE_MAX
    assert all(t["max_score"] == 1 for t in doc["tests"])
    passed = sum(t["status"] == "pass" for t in doc["tests"])
    assert passed / len(doc["tests"]) * doc["max_score"] == sum(t["score"] for t in doc["tests"])
    for t in doc["tests"]:
        assert set(t) >= {"name", "status", "score", "max_score", "message"}
        assert t["status"] in ("pass", "fail", "error")
    ring = next(t for t in doc["tests"] if t["name"].endswith("ring_time"))
    assert ring["message"].startswith("failed: check_ring_time") and "hint: take" in ring["message"]
    assert sum(t["score"] for t in doc["tests"]) == 3
    full = [_fake("ann", nb, [(ex.id, "passed", ex.points, ex.points, "ok" * 5000)
                              for ex in course.exercises(nb)]) for nb in gradebook.graded_notebooks()]
    doc = classroom.runner_results(full)
    assert doc["status"] == "pass" and sum(t["score"] for t in doc["tests"]) == COURSE_MAX
    assert max(len(t["message"]) for t in doc["tests"]) <= classroom.MESSAGE_LIMIT + 10
    assert classroom.runner_results([_fake("x", "03_load_balance", [], ok=False)])["status"] == "error"
    err = classroom.error_results("no kernel")
    assert err["status"] == "error" and err["max_score"] == COURSE_MAX
    assert {t["status"] for t in err["tests"]} == {"error"} and len(err["tests"]) == COURSE_MAX


# ------------------------------------------------------------------ JUnit and Markdown
def test_junit_has_times_and_real_error_elements(tmp_path):
    junitparser = pytest.importorskip("junitparser")
    broken = _fake("carl", "04_ulysses", [("seq_to_heads", "grader error", 0, 1, "no sandbox")],
                   ok=False)
    gone = {**_fake("dan", "05_moe_dispatch", [], ok=False), "error": "no such file"}
    reps = [ALICE, BOB, broken, gone]
    rows = gradebook.rows(reps)
    path = tmp_path / "j.xml"
    path.write_text(reports.junit(reps, rows, seed=3, timestamp="2026-01-01T00:00:00"))
    xml = junitparser.JUnitXml.fromfile(str(path))
    n_cases = n_fail = n_err = 0
    for suite in xml:
        cases = list(suite)
        fails = [c for c in cases if any(isinstance(r, junitparser.Failure) for r in c.result)]
        errs = [c for c in cases if any(isinstance(r, junitparser.Error) for r in c.result)]
        assert suite.tests == len(cases) and suite.failures == len(fails)
        assert suite.errors == len(errs) and suite.time is not None and suite.time >= 0
        assert all(c.time is not None for c in cases)
        props = {p.name: p.value for p in suite.properties()}
        assert props["seed"] == "3"
        n_cases, n_fail, n_err = n_cases + len(cases), n_fail + len(fails), n_err + len(errs)
    assert n_err == 2                                   # the grader error and the missing file
    missing = sum(1 for r in rows for e in r["exercises"] if e["status"] == "missing")
    assert n_cases == 3 + 3 + 1 + 1 + missing           # a suite per missing notebook too
    root = __import__("xml.etree.ElementTree", fromlist=["x"]).fromstring(path.read_bytes())
    assert root.get("tests") == str(n_cases) and root.get("errors") == str(n_err)
    assert root.get("failures") == str(n_fail)
    assert len(root.findall(".//error")) == n_err


def test_markdown_has_the_messages():
    md = reports.markdown([ALICE], seed=4)
    assert md.startswith(f"## Score: 3 / {COURSE_MAX}")
    assert "| subs/alice/03_load_balance.ipynb | ring_time | failed | 0/1 |" in md
    assert "take the busiest rank" in md and "seed 4" in md
    assert "01_sequence_parallel (not handed in) | reduce_scatter | missing" in md
    md2 = reports.markdown([ALICE, BOB])
    assert f"### alice: 3 / {COURSE_MAX}" in md2 and f"### bob: 1 / {COURSE_MAX}" in md2


# ------------------------------------------------------------------ feedback files
class _Checker(HTMLParser):
    VOID = {"meta", "br"}

    def __init__(self):
        super().__init__()
        self.stack, self.text = [], []

    def handle_starttag(self, tag, attrs):
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack.pop() == tag, tag

    def handle_data(self, data):
        self.text.append(data)


def test_feedback_files_per_student(tmp_path):
    sec = {**ALICE, "student": "sec1/s01"}
    other = {**ALICE, "student": "sec2/s01", "exercises": [dict(e) for e in ALICE["exercises"]]}
    other["exercises"][2]["message"] = "<script>alert(1)</script>\nhint: escape me"
    rows = gradebook.rows([sec, other])
    written = feedback.write(tmp_path, rows, [sec, other], seed=8)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in written) == [
        "sec1/s01.html", "sec1/s01.md", "sec2/s01.html", "sec2/s01.md"]
    md = (tmp_path / "sec1" / "s01.md").read_text()
    assert f"**Score: 3 / {COURSE_MAX}**" in md and "seed 8" in md
    assert f"### ring_time: failed (0/{EXERCISES['ring_time'].points})" in md and "target: 4" in md
    assert "**Hint:** take the busiest rank" in md
    assert "Not handed in: no 01_sequence_parallel notebook" in md
    page = (tmp_path / "sec2" / "s01.html").read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page
    checker = _Checker()
    checker.feed(page)
    assert checker.stack == [] and "Hint:" in "".join(checker.text)


def test_executed_notebook_says_what_the_grade_says(tmp_path):
    import nbformat
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("checks.check_ring_time(ring_time)"),
                nbformat.v4.new_code_cell("checks.check_ring_time(ring_time2)")]
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout",
                                                  text="[grader] check_ring_time: passed (1/1)\n")]
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout",
                                                  text="[grader] check_ring_time: failed (0/1)\n")]
    path = tmp_path / "run.ipynb"
    nbformat.write(nb, str(path))
    feedback.annotate_executed(path, ALICE, seed=12)
    out = nbformat.read(str(path), as_version=4)
    nbformat.validate(out)
    assert out.cells[0].cell_type == "markdown" and "3 / 4" in out.cells[0].source
    assert "seed 12" in out.cells[0].source and "| ring_time | failed | 0/1 |" in out.cells[0].source
    first = "".join(o.get("text", "") for o in out.cells[1].outputs)
    assert "not the verdict that counts" in first and "failed (0/1)" in first.split("counts")[1]
    second = "".join(o.get("text", "") for o in out.cells[2].outputs)
    assert "not the verdict that counts" not in second
