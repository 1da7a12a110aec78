"""No file costs the class its grading (issue 32): every notebook is read with nbformat's
reader and validator within limits (file size, JSON nesting, cell size, expression depth),
and whatever is wrong with one is that file's refusal in one sentence, before planning.
Folder names that are not UTF-8 (surrogate escapes) are written in a safe form."""
import copy
import json
import os
from pathlib import Path

import pytest

from lesson10.course.grade import course, gradebook, nbread
from lesson10.course.grade.config import GradeConfig
from lesson10.course.grade.notebook import grade_notebook

ROOT = Path(__file__).resolve().parent.parent
NB03 = "03_load_balance"


def _solution() -> dict:
    return json.loads((ROOT / "solutions" / f"{NB03}.ipynb").read_text(encoding="utf-8"))


def _code(src: str) -> dict:
    return {"cell_type": "code", "metadata": {}, "source": src, "outputs": [],
            "execution_count": None}


def _with(edit) -> bytes:
    nb = _solution()
    edit(nb)
    return json.dumps(nb).encode()


def _deep_bytes() -> bytes:
    text = json.dumps(_solution())
    deep = '{"a":' * 100_000 + "1" + "}" * 100_000
    return text.replace('"metadata": {', '"metadata": {"deep": ' + deep + ", ", 1).encode()


def _long_sum(terms: int, prefix: str = "") -> str:
    return prefix + "x = " + "+".join(["1"] * terms) + "\n"


#: case -> (the file's bytes, a word its refusal says)
MALFORMED = {
    "source list holds a number": (_with(lambda nb: nb["cells"][1].update(source=["x = 1", 3])),
                                   "validator"),
    "metadata a list": (_with(lambda nb: nb.update(metadata=[])), "validator"),
    "kernelspec a string": (_with(lambda nb: nb["metadata"].update(kernelspec="python3")),
                            "validator"),
    "language_info a string": (_with(lambda nb: nb["metadata"].update(language_info="python")),
                               "validator"),
    "cells a dict": (_with(lambda nb: nb.update(cells={})), "validator"),
    "a code cell without outputs": (_with(lambda nb: nb["cells"].append(
        {"cell_type": "code", "metadata": {}, "source": "x = 1"})), "validator"),
    "metadata nested 100,000 deep": (_deep_bytes(), "nests"),
    "a 200,000-term expression": (_with(lambda nb: nb["cells"].append(
        _code(_long_sum(200_000)))), "expression"),
    "the same under %%time": (_with(lambda nb: nb["cells"].append(
        _code(_long_sum(200_000, "%%time\n")))), "expression"),
    "the same after a line magic": (_with(lambda nb: nb["cells"].append(
        _code("%time " + _long_sum(200_000)))), "expression"),
    "a 600-term expression": (_with(lambda nb: nb["cells"].append(_code(_long_sum(600)))),
                              "expression"),
    "a cell over the size limit": (_with(lambda nb: nb["cells"].append(
        {"cell_type": "markdown", "metadata": {}, "source": "x" * (nbread.MAX_CELL_CHARS + 1)})),
        "characters"),
    "Latin-1 text": (b'{"cells": [], "metadata": {"a": "\xe9"}, "nbformat": 4}', "UTF-8"),
    "not JSON": (b"print('hello')\n", "not JSON"),
    "a JSON list": (b"[1, 2, 3]", "no notebook"),
    "no nbformat field": (b'{"cells": [], "metadata": {}}', "nbformat"),
    "empty": (b"", "not JSON"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_each_malformed_file_is_refused_in_one_sentence(case):
    data, word = MALFORMED[case]
    nb, why = nbread.read(Path(f"s/{NB03}.ipynb"), data)
    assert nb is None and why.startswith("cannot read the notebook: ")
    assert word in why and "\n" not in why and len(why) < 400, why
    assert "Traceback" not in why


@pytest.mark.parametrize("folder", ["notebooks", "solutions"])
def test_every_course_notebook_is_read(folder):
    for path in sorted((ROOT / folder).glob("*.ipynb")):
        nb, why = nbread.read(path)
        assert why is None and nb is not None, (path, why)
        assert course.identify(nb, path)[0] == path.stem


def test_honest_variants_are_read():
    fine = {
        "a 400-term expression": _with(lambda nb: nb["cells"].append(_code(_long_sum(400)))),
        "magics and shell lines": _with(lambda nb: nb["cells"].append(
            _code("%%time\n!echo hi\nx = 1\n%timeit x + 1\n"))),
        "a byte-order mark": b"\xef\xbb\xbf" + json.dumps(_solution()).encode(),
        "cells without ids (nbformat 4.4)": _with(lambda nb: (
            nb.update(nbformat_minor=4), [c.pop("id", None) for c in nb["cells"]])),
        "a syntax error": _with(lambda nb: nb["cells"].append(_code("def f(:\n"))),
        "brackets in strings": _with(lambda nb: nb["cells"].append(
            _code('s = "' + "[{" * 300 + '\\"' + "]}" * 10 + '"\n'))),
    }
    for name, data in fine.items():
        nb, why = nbread.read(Path(f"s/{NB03}.ipynb"), data)
        assert why is None and nb is not None, (name, why)


def test_json_depth_counts_brackets_outside_strings_only():
    assert nbread.json_depth(b'{"a": [1, {"b": "[[[[{"}]}') == 3
    assert nbread.json_depth(b'["\\"[[[", [[]]]') == 3
    assert nbread.json_depth(b"{}") == 1 and nbread.json_depth(b"1") == 0


def test_expression_depth_has_no_recursion_and_sees_the_parser_give_up():
    assert 0 < nbread.expression_depth("x = 1 + 2\n") < 10
    assert nbread.expression_depth(_long_sum(450)) > 450
    assert nbread.expression_depth(_long_sum(200_000)) > nbread.MAX_EXPR_DEPTH
    assert nbread.expression_depth("!ls\n") == 0                     # not Python as written


def test_the_file_size_limit(monkeypatch, tmp_path):
    data = json.dumps(_solution()).encode()
    monkeypatch.setattr(nbread, "MAX_NOTEBOOK_BYTES", len(data) - 1)
    nb, why = nbread.read(Path("x.ipynb"), data)
    assert nb is None and "limit" in why and "Clear All Outputs" in why
    path = tmp_path / f"{NB03}.ipynb"
    path.write_bytes(data)
    nb, why = nbread.read(path)                       # read from disk: refused before reading
    assert nb is None and "limit" in why
    monkeypatch.setattr(nbread, "MAX_NOTEBOOK_BYTES", len(data))
    assert nbread.read(path)[1] is None


def test_the_planner_takes_every_malformed_file_as_its_own_unreadable_file(tmp_path):
    paths, contents = [], {}
    for i, case in enumerate(sorted(MALFORMED)):
        path = tmp_path / f"s{i:02d}" / f"{NB03}.ipynb"
        paths.append(path)
        contents[path] = MALFORMED[case][0]
    good = tmp_path / "ok" / f"{NB03}.ipynb"
    paths.append(good)
    contents[good] = json.dumps(_solution()).encode()
    plan = gradebook.plan(paths, contents)
    items = {it.path: it for it in plan.graded}
    assert len(items) == len(paths) and items[good].readable
    assert all(not items[p].readable and items[p].notebook == NB03 for p in paths[:-1])


def test_grading_a_malformed_file_costs_only_its_points():
    """No sandbox is started: a refused file is reported before anything runs."""
    for case in ("metadata a list", "kernelspec a string", "a 200,000-term expression"):
        rep = grade_notebook(Path(f"s/{NB03}.ipynb"), GradeConfig(), content=MALFORMED[case][0],
                             student="s")
        assert rep["ok"] and rep["course_notebook"] == NB03 and rep["points"] == 0
        assert {e["status"] for e in rep["exercises"]} == {"unreadable"}
        assert rep["max_points"] == course.full_marks(NB03)
        assert rep["feedback"][0].startswith("cannot read the notebook")


# ------------------------------------------------------------------ names that are not UTF-8
def test_surrogate_escapes_are_written_as_latin1_letters():
    name = os.fsdecode(b"Jos\xe9")                 # how Python reads a Latin-1 folder name
    assert name != "José" and gradebook.safe_text(name) == "José"
    assert gradebook.safe_text({"s": [name, ("x", 1)]}) == {"s": ["José", ("x", 1)]}
    assert gradebook.safe_text("caf\ud800") == "caf\ufffd"
    assert gradebook.safe_text("plain") == "plain"
    for text in (gradebook.safe_text(name), gradebook.safe_text("caf\ud800")):
        text.encode("utf-8")                          # any file takes it


def test_a_latin1_folder_is_a_student_with_a_safe_name(tmp_path):
    folder = os.fsencode(str(tmp_path)) + b"/Jos\xe9"
    paths = [Path(os.fsdecode(folder + b"/" + NB03.encode() + b".ipynb")),
             tmp_path / "bob" / f"{NB03}.ipynb"]
    keys = gradebook.student_keys(paths)
    assert [keys[p][0] for p in paths] == ["José", "bob"]
    assert gradebook.student_keys(paths, roster=["José", "bob"])[paths[0]][0] == "José"
    rx = r"(?P<student>[^/]+)/03_"
    assert gradebook.student_keys(paths, student_from=rx)[paths[0]][0] == "José"


def test_the_old_malformed_shapes_are_still_caught_when_given_as_a_dict():
    """The shapes come from the red-team round: each is invalid for nbformat's validator."""
    for case in ("metadata a list", "kernelspec a string", "source list holds a number"):
        raw = json.loads(MALFORMED[case][0])
        with pytest.raises(Exception) as info:
            import nbformat
            nbformat.validate(copy.deepcopy(raw))
        assert "ValidationError" in type(info.value).__name__


def test_the_cell_count_limit(monkeypatch):
    data = json.dumps(_solution()).encode()
    monkeypatch.setattr(nbread, "MAX_CELLS", len(_solution()["cells"]) - 1)
    nb, why = nbread.read(Path("x.ipynb"), data)
    assert nb is None and "cells, over the grader's limit" in why
    monkeypatch.setattr(nbread, "MAX_CELLS", len(_solution()["cells"]))
    assert nbread.read(Path("x.ipynb"), data)[1] is None


def _with_outputs(mb: float) -> bytes:
    """The solution notebook with ``mb`` MB of saved figures (base64 PNG data) in its cells."""
    import base64
    nb = _solution()
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    blob = base64.b64encode(b"\x89PNG" * int(mb * 2**20 / 4 * 3 / 4 / len(code))).decode()
    for c in code:
        c["outputs"] = [{"output_type": "display_data", "metadata": {},
                         "data": {"image/png": blob, "text/plain": ["<Figure>"]}}]
    return json.dumps(nb).encode()


def test_saved_outputs_are_dropped_and_only_the_code_must_fit(monkeypatch):
    data = _with_outputs(2)
    code = len(json.dumps(_solution()))
    monkeypatch.setattr(nbread, "MAX_CODE_BYTES", code + 10_000)       # the code fits, the file not
    nb, why = nbread.read(Path(f"s/{NB03}.ipynb"), data)
    assert why is None and len(data) > 2**20 > nbread.MAX_CODE_BYTES
    assert all(c.get("outputs") == [] for c in nb.cells if c.cell_type == "code")
    assert [c.source for c in nb.cells] == ["".join(c["source"]) for c in _solution()["cells"]]
    slim = nbread.slim(data)
    assert len(slim) < code + 10_000 and nbread.read(Path("x.ipynb"), slim)[1] is None
    assert nbread.slim(slim) == slim and nbread.slim(b"not json") == b"not json"
    monkeypatch.setattr(nbread, "MAX_CODE_BYTES", code // 2)           # the code itself too big
    nb, why = nbread.read(Path(f"s/{NB03}.ipynb"), data)
    assert nb is None and "without its saved outputs" in why and "limit" in why


def test_the_batch_keeps_each_notebook_without_its_outputs(tmp_path):
    from lesson10.course.grade import archives
    for who, mb in (("ann", 1), ("ben", 0.5)):
        (tmp_path / "c" / who).mkdir(parents=True)
        (tmp_path / "c" / who / f"{NB03}.ipynb").write_bytes(_with_outputs(mb))
    batch = archives.gather([tmp_path / "c"], tmp_path / "u", nbread.MAX_NOTEBOOK_BYTES)
    kept = [batch.contents[p] for p in batch.paths]
    assert len(kept) == 2 and kept[0] == kept[1]          # the same code: the same bytes
    assert len(kept[0]) < 2**19 and b"image/png" not in kept[0]


@pytest.mark.slow
def test_a_notebook_with_120_mb_of_saved_output_is_graded_as_read():
    nb, why = nbread.read(Path(f"s/{NB03}.ipynb"), _with_outputs(120))
    assert why is None and course.identify(nb, Path(f"s/{NB03}.ipynb"))[0] == NB03
