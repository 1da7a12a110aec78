"""A class graded again writes the same outputs: the whole pipeline (plan, the results
folder, every output) with the judge replaced by a stand-in whose verdicts depend on each
notebook's bytes and seed (no sandbox, seconds per run). Graded twice with nothing changed,
every output file is byte-identical; when one student's notebook changes, no other
student's row changes; a student who handed in nothing has no seed to change."""
import csv
import hashlib
import io
import json
import shutil
from pathlib import Path

import pytest

from lesson10.checks.verdict import Status
from lesson10.course.grade import course, judge, pipeline, session, store
from lesson10.course.grade.config import GradeConfig
from lesson10.course.grade.request import Request

ROOT = Path(__file__).resolve().parents[1]
NB01, NB02 = "01_sequence_parallel", "02_ring_attention"


def _fake_run(cells, notebook_id, settings, deadline, workdir, files=()):
    """The judge's run of a notebook, faked: each exercise passed or failed by a digest of
    the notebook's code and the seed, each cell printing its index."""
    code = "".join(src for _, src in cells).encode()
    run = session.Run()
    for i, ex in enumerate(course.exercises(notebook_id)):
        bit = hashlib.sha256(code + str(settings.seed).encode()).digest()[i] % 2
        run.record((i, 0), judge.entry(ex, Status.PASSED if bit else Status.FAILED, f"case {i}"))
    run.outputs = {i: {"outputs": [{"name": "stdout", "text": f"cell {i}\n"}], "error": None}
                   for i, _ in cells}
    return run


@pytest.fixture
def fake_judge(monkeypatch, tmp_path):
    def config(request, seed):
        box = tmp_path / "standin"
        box.mkdir(exist_ok=True)
        return GradeConfig(seed=seed, standin=box / "general",
                           save_executed=request.save_executed), box
    monkeypatch.setattr(pipeline, "_config", config)
    monkeypatch.setattr(session, "run_notebook", _fake_run)


def _class(tmp_path) -> Path:
    cls = tmp_path / "class"
    for who, nids in (("alice", [NB01]), ("bob", [NB01, NB02]), ("carol", [NB02])):
        for nid in nids:
            (cls / who).mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / "notebooks" / f"{nid}.ipynb", cls / who / f"{nid}.ipynb")
    (tmp_path / "roster.csv").write_text(
        "student,sis_id,email\nalice,S1,a@x.example\nbob,S2,b@x.example\ncarol,S3,c@x.example\n"
        "dan,S4,d@x.example\n", encoding="utf-8")
    return cls


def _run(tmp_path, cls: Path, out: Path, **kw) -> dict[str, bytes]:
    """Grade ``cls`` into the results folder ``tmp_path/results`` (a new secret seed each
    run, as a regrade has); every output file's bytes, by its path under ``out``."""
    given = dict(notebooks=(cls,), roster=tmp_path / "roster.csv", results=tmp_path / "results",
                 output=out / "report.json", csv=out / "grades.csv", junit=out / "junit.xml",
                 feedback=out / "feedback", report=out / "report", export=("canvas", "moodle"),
                 export_dir=out / "lms")
    assert pipeline.run(Request(**(given | kw))) in (0, 1)
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def _rows(files: dict) -> dict[str, list[str]]:
    return {r[0]: r for r in csv.reader(io.StringIO(files["grades.csv"].decode()))}


def test_a_class_graded_twice_with_nothing_changed_writes_the_same_bytes(tmp_path, fake_judge):
    cls = _class(tmp_path)
    first = _run(tmp_path, cls, tmp_path / "out1")
    kept = (tmp_path / "results" / "class.json").read_bytes()
    second = _run(tmp_path, cls, tmp_path / "out2")
    assert (tmp_path / "results" / "class.json").read_bytes() == kept   # its seed and all
    assert store.Store(tmp_path / "results").seed() == json.loads(first["report.json"])["seed"]
    assert len(first) >= 8 and "junit.xml" in first and "lms/canvas-grades.csv" in first
    assert sorted(first) == sorted(second)
    changed = [name for name in first if first[name] != second[name]]
    assert not changed, changed


def test_one_students_change_leaves_every_other_row_as_it_was(tmp_path, fake_judge):
    cls = _class(tmp_path)
    first = _run(tmp_path, cls, tmp_path / "out1")
    nb = json.loads((cls / "bob" / f"{NB02}.ipynb").read_text(encoding="utf-8"))
    nb["cells"].append({"cell_type": "markdown", "metadata": {}, "source": "resubmitted"})
    (cls / "bob" / f"{NB02}.ipynb").write_text(json.dumps(nb), encoding="utf-8")
    second = _run(tmp_path, cls, tmp_path / "out2")
    before, after = _rows(first), _rows(second)
    assert set(before) == set(after) == {"student", "alice", "bob", "carol", "dan"}
    for who in ("student", "alice", "carol", "dan"):
        assert before[who] == after[who], who
    seed = before["student"].index("seed")
    assert before["dan"][seed] == "" and before["alice"][seed] != ""
    for page in ("alice", "carol", "dan"):                  # their feedback too
        assert first[f"feedback/{page}.md"] == second[f"feedback/{page}.md"]
    doc1, doc2 = (json.loads(f["report.json"]) for f in (first, second))
    assert doc1["seed"] != doc2["seed"]           # bob's changed file met new cases
    assert [r for r in doc1["students"] if r["student"] != "bob"] == \
        [r for r in doc2["students"] if r["student"] != "bob"]


def test_a_class_graded_anew_with_its_seed_writes_the_same_bytes(tmp_path, fake_judge):
    cls = _class(tmp_path)
    runs = [_run(tmp_path, cls, tmp_path / out, seed=5, results=None, no_results=True,
                 junit=None, save_executed=tmp_path / out / "executed") for out in ("o1", "o2")]
    assert sum(name.startswith("executed/") for name in runs[0]) == 4
    assert sorted(runs[0]) == sorted(runs[1])
    changed = [name for name in runs[0] if runs[0][name] != runs[1][name]]
    assert not changed, changed


def test_two_course_notebooks_saved_under_one_file_name_are_both_kept(tmp_path, fake_judge):
    mine = tmp_path / "mine"
    for part, nid in (("part1", NB01), ("part2", NB02)):
        (mine / part).mkdir(parents=True)
        shutil.copy(ROOT / "notebooks" / f"{nid}.ipynb", mine / part / "homework.ipynb")
    executed = tmp_path / "executed"
    assert pipeline.run(Request(notebooks=(mine,), student="ann", no_results=True,
                                save_executed=executed)) in (0, 1)
    saved = sorted(p.relative_to(executed).as_posix() for p in executed.rglob("*.ipynb"))
    assert saved == [f"ann/{NB01}.ipynb", f"ann/{NB02}.ipynb"]
    for nid in (NB01, NB02):
        nb = json.loads((executed / "ann" / f"{nid}.ipynb").read_text(encoding="utf-8"))
        top = "".join(nb["cells"][0]["source"])
        assert all(f"| {ex.id} |" in top for ex in course.exercises(nid)), nid
