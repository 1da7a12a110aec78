"""A notebook the grader could not run (Gradescope without user namespaces, where the
grading user cannot run the Python) is said once: graded as its course notebook, a grader
error, never also "not a course notebook" and "missing"."""
import json

from adjusted_class import BLANK

from lesson10.course.grade import main, pipeline, sandbox

RING = "02_ring_attention"


def test_a_refused_notebook_is_one_grader_error_not_unknown_and_missing(tmp_path, monkeypatch):
    nb = tmp_path / "submission" / f"{RING}.ipynb"
    nb.parent.mkdir()
    nb.write_bytes(BLANK[RING])

    def refuse(*a, **k):
        raise sandbox.Unprotected("user lesson10 cannot run this Python (/root/py): install "
                                  "it where every user can")

    monkeypatch.setattr(pipeline, "grade_notebook", refuse)
    out = tmp_path / "results.json"
    status = main([str(nb), "--student", "submission", "--no-sandbox", "--gradescope", str(out),
                   "--output", str(tmp_path / "report.json")])
    assert status == 2                                    # the grader failed: not a score
    doc = json.loads((tmp_path / "report.json").read_text())
    (row,) = doc["students"]
    assert row["unknown"] == [] and RING not in row["missing"]
    ring = [e for e in row["exercises"] if e["notebook"] == RING]
    assert ring and all(e["status"] == "grader error" for e in ring)
    assert all("cannot run this Python" in e["message"] for e in ring)
    gs = json.loads(out.read_text())
    assert "Not a course notebook" not in gs["output"]
    missing = [line for line in gs["output"].splitlines() if line.startswith("Missing")]
    assert missing and RING not in missing[0]             # the others are missing, not it
    assert f"Graded {nb} as {RING}." in gs["output"] and "GRADER ERROR in" in gs["output"]
