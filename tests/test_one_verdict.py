"""The check cell and the grader give one verdict (issue 30).

* a one-line wrapper around the course's own code (tests/course_wrappers.py) is refused by
  both, for every exercise, with the same sentence naming what to write instead
  (lesson10/checks/refused.py);
* what an answer may return is one rule (lesson10/checks/returns.py): exact numbers, torch
  tensors, object arrays are converted by both (tests/answers_one_verdict.py), what the rule
  refuses is refused by both in one sentence;
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import answers_one_verdict as A
import course_wrappers as W
import numpy as np
import pytest

from lesson10 import checks
from lesson10.checks import EXERCISES, refused, returns
from lesson10.course.grade import course, main, sandbox

HERE = Path(__file__).resolve().parent
KERNEL = {"kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"}}


def check_cell(exercise: str, fn) -> dict:
    """The outcome of the check cell ``check_<exercise>(fn)`` in this process."""
    try:
        getattr(checks, f"check_{exercise}")(fn)
    except AssertionError:
        pass
    return checks.OUTCOMES[-1]


def grade(tmp: Path, notebooks: dict, helpers=(), timeout: int = 60) -> dict:
    """``{file name: {exercise: entry}}`` of grading ``{file name: (course notebook, cells)}``
    in one batch, with the test files ``helpers`` beside each notebook."""
    paths = []
    for fname, (nb_id, cells) in notebooks.items():
        folder = tmp / Path(fname).stem
        folder.mkdir()
        for helper in helpers:
            shutil.copyfile(HERE / helper, folder / helper)
        code = [dict(cell_type="code", source=c, outputs=[], execution_count=None, metadata={})
                for c in cells]
        nb = {"cells": code, "nbformat": 4, "nbformat_minor": 5,
              "metadata": dict(KERNEL, lesson10={"notebook": nb_id})}
        (folder / fname).write_text(json.dumps(nb), encoding="utf-8")
        paths.append(folder / fname)
    extra = [] if sandbox.probe() is None else ["--no-sandbox"]
    main([*map(str, paths), "--seed", "5", "--no-results", "-j", "2",
          "--output", str(tmp / "r.json"), "--exercise-timeout", str(timeout), *extra])
    doc = json.loads((tmp / "r.json").read_text())
    return {Path(rep["notebook"]).name: {e["exercise"]: e for e in rep["exercises"]}
            for rep in doc["notebooks"]}


# --------------------------------------------------------------------------- course code
def test_every_wrapper_of_course_code_is_refused_in_the_check_cell():
    for ex in EXERCISES.values():
        out = check_cell(ex.id, getattr(W, ex.function))
        assert out["status"] == "failed", (ex.id, out["message"][:300])
        assert "NotAvailable" in out["message"] and f"exercise {ex.id} may not call lesson10." \
            in out["message"], (ex.id, out["message"][:300])
        assert refused.use_instead(ex.id) in out["message"]


def test_the_check_s_own_references_still_run_and_are_restored_after():
    from lesson10 import sim
    before = sim.keep_within_capacity.__code__
    import test_checks_answers as T
    out = check_cell("capacity", T.RIGHT["capacity"][0])
    assert out["status"] == "passed", out["message"]
    assert sim.keep_within_capacity.__code__ is before
    assert sim.keep_within_capacity(__import__("numpy").zeros((3, 1), dtype=int), 1, 2).sum() == 2


def test_whose_code_a_frame_runs():
    from lesson10 import layouts
    from lesson10.checks import feedback, nb03_load_balance
    assert refused._who(nb03_load_balance.__file__) == "check"
    assert refused._who(layouts.__file__) == "course"
    assert refused._who(feedback.__file__) == "course"     # its fallback runs what it is given
    assert refused._who(np.__file__) == refused._who(json.__file__) == "library"
    assert refused._who(__file__) == refused._who("/tmp/ipykernel_1/2.py") == "student"


def test_course_code_outside_a_check_is_not_refused():
    assert W.zigzag_positions(8, 2)[0].tolist() == [0, 1, 6, 7]
    with refused.guard("zigzag_positions", "03_load_balance"):
        with pytest.raises(refused.NotAvailable, match="may not call lesson10.layouts.shard"):
            W.zigzag_positions(8, 2)
        assert refused._from_student(sys._getframe()) is True     # this file: a student's
    assert W.zigzag_positions(8, 2)[0].tolist() == [0, 1, 6, 7]


# --------------------------------------------------------------------------- stub modules
def _through_stubs():
    have_torch = importlib.util.find_spec("torch") is not None
    return [(ex, fn) for ex, fn in W.THROUGH_STUBS if have_torch or "spmd" not in fn.__name__]


def test_a_call_into_a_module_the_sandbox_holds_as_a_stub_is_refused_in_the_check_cell():
    """The checks' own code, spmd and the figures are stubs in the grader's sandbox; a
    function that reaches its answer through them fails the check cell too, in the same
    sentence (and test_both_paths_give_one_verdict grades the same wrappers)."""
    for ex, fn in _through_stubs():
        out = check_cell(ex, fn)
        assert out["status"] == "failed", (ex, out["message"][:300])
        assert f"NotAvailable: exercise {ex} may not call lesson10." in out["message"], out["message"]
    assert sys.getprofile() is None                       # the hook is gone after the check


def test_what_a_check_serves_is_callable_and_only_that():
    from lesson10.checks import network, served_ring
    assert refused._served_method(served_ring.ServedMerge.__call__.__code__)
    assert refused._served_method(network.RingNetwork.ring_shift.__code__)
    for maker in (network.Referee.__init__, served_ring.ServedMerge.__init__, network.served_call):
        assert not refused._served_method(maker.__code__)
    assert refused._kind(refused.__file__) == refused._kind(np.__file__) == ""
    assert refused._kind(network.__file__) == "served"
    assert refused._kind(checks.core.__file__) == "stub"


def test_a_course_module_being_imported_is_not_a_call_but_its_function_is():
    """A first import of a stub module inside a student's function runs that module's code
    (which may call its own functions): no refusal, as the sandbox imports its stub."""
    from lesson10.checks import core
    fake = os.path.join(refused._COURSE, "bench", "not_a_file.py")
    at_import = compile("plural(2, 'rank')", fake, "exec")                     # <module>
    in_function = compile("def f():\n    return plural(2, 'rank')\n", __file__, "exec")
    space = {"plural": core.plural}
    exec(in_function, space)
    with refused.guard("ring_time", "03_load_balance"):
        exec(at_import, dict(space))
        with pytest.raises(refused.NotAvailable, match="ring_time may not call lesson10.checks.precision.plural"):
            space["f"]()
    assert space["f"]() == "2 ranks"


#: a right ring_time, as a student's helper module holds it
RING_TIME = "import numpy as np\n\ndef ring_time(work):\n    return np.asarray(work).max(axis=1).sum()\n"


def test_a_helper_file_the_grader_would_not_copy_fails_the_check_cell(tmp_path, monkeypatch):
    """In a kernel, the check cell notes every file of the student's code it ran and says,
    in the grader's sentence, when one would not be beside the notebook for the grader."""
    from lesson10.checks import helper_files as rule
    (tmp_path / "pkg").mkdir()
    for rel in ("mine.py", "pkg/__init__.py", "pkg/inner.py"):
        (tmp_path / rel).write_text(RING_TIME)
    (tmp_path / "big.py").write_text(RING_TIME + "#" * rule.MAX_HELPER_BYTES)
    os.symlink(tmp_path / "mine.py", tmp_path / "linked.py")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    fns = {m: importlib.import_module(m).ring_time for m in ("mine", "pkg.inner", "linked", "big")}
    assert check_cell("ring_time", fns["pkg.inner"])["status"] == "passed"      # not in a kernel
    monkeypatch.setattr(refused, "_in_kernel", lambda: True)
    expected = {"mine": None, "pkg.inner": rule.note("pkg/inner.py", rule.IN_FOLDER),
                "linked": rule.note("linked.py", rule.LINK),
                "big": rule.note("big.py", rule.OVER.format(limit=rule.MAX_HELPER_BYTES))}
    for module, says in expected.items():
        out = check_cell("ring_time", fns[module])
        if says is None:
            assert out["status"] == "passed", out["message"]
        else:
            assert out["status"] == "failed" and out["message"] == f"check_ring_time failed: {says}"
    for i in range(rule.MAX_HELPERS):
        (tmp_path / f"a{i:02d}.py").write_text("")
    assert check_cell("ring_time", fns["mine"])["message"].endswith(rule.too_many("big.py"))
    outside = tmp_path / "nb"
    outside.mkdir()
    monkeypatch.chdir(outside)                     # the notebook one folder down: mine.py is up,
    assert check_cell("ring_time", fns["mine"])["status"] == "passed"      # no file of its tree
    assert check_cell("ring_time", fns["pkg.inner"])["status"] == "passed"


def test_the_grader_says_the_same_of_those_helper_files(tmp_path):
    from lesson10.checks import helper_files as rule
    from lesson10.course.grade.submission_files import helper_files
    (tmp_path / "nb.ipynb").write_text("{}")
    (tmp_path / "big.py").write_text("#" * (rule.MAX_HELPER_BYTES + 1))
    (tmp_path / "mine.py").write_text(RING_TIME)
    os.symlink(tmp_path / "mine.py", tmp_path / "linked.py")
    got = helper_files(tmp_path / "nb.ipynb")
    assert [n for n, _ in got] == ["mine.py"]
    assert sorted(got.notes) == sorted(rule.reaches_grader(str(tmp_path / n), str(tmp_path))
                                       for n in ("big.py", "linked.py"))
    for i in range(rule.MAX_HELPERS):
        (tmp_path / f"a{i:02d}.py").write_text("")
    said = helper_files(tmp_path / "nb.ipynb").notes
    assert "mine.py" not in [n for n, _ in helper_files(tmp_path / "nb.ipynb")]
    assert said == [rule.reaches_grader(str(tmp_path / "mine.py"), str(tmp_path))], said


#: (exercise, answer in answers_one_verdict or course_wrappers, status both paths give,
#: a sentence both say)
JUDGED = [(ex, fn.__name__, "passed", "") for ex, fns in A.CONVERTED.items() for fn in fns] + [
    ("ring_attention", "ring_threads", "passed", ""),
    ("ring_attention", "ring_fork_pool", "failed", "was called from another process"),
    ("sp_bytes", "sp_bytes_set", "failed", "check_sp_bytes failed: your function returned a set: "
                                           + returns.WHAT_TO_RETURN),
] + [(ex, fn.__name__, "failed", f"exercise {ex} may not call lesson10.") for ex, fn in _through_stubs()]


def _answer(name: str):
    return getattr(A, name, None) or getattr(W, name)


@pytest.mark.slow
def test_both_paths_give_one_verdict(tmp_path):
    """One grader batch: the wrappers of course code (refused by both, in one sentence), the
    answers whose return the rule converts, and served functions called from threads
    (passed by both) or from a forked pool (refused by both, in one sentence)."""
    notebooks = _wrapper_notebooks()
    for ex_id, fn, _, _ in JUDGED:
        ex = EXERCISES[ex_id]
        notebooks[f"{ex.notebook}-{fn}.ipynb"] = (ex.notebook, [
            "from lesson10 import checks\nimport answers_one_verdict as A, course_wrappers as W",
            f"{ex.function} = {'A' if hasattr(A, fn) else 'W'}.{fn}",
            f"checks.check_{ex_id}({ex.function})"])
    graded = grade(tmp_path, notebooks, helpers=("course_wrappers.py", "answers_one_verdict.py",
                                                 "answers_01_03.py"))
    differ = _wrappers_differ(graded)
    for ex_id, fn, status, sentence in JUDGED:
        here = check_cell(ex_id, _answer(fn))
        there = graded[f"{EXERCISES[ex_id].notebook}-{fn}.ipynb"][ex_id]
        for where, out in (("check cell", here), ("grader", there)):
            if out["status"] != status or sentence not in out["message"]:
                differ.append(f"{ex_id} {fn}: {where} {out['status']}: {out['message'][:300]}")
    assert not differ, "\n".join(differ)


def _wrapper_notebooks() -> dict:
    notebooks = {}
    for nb_id in course.course_notebooks():
        exs = course.exercises(nb_id)
        if not exs:
            continue
        cells = ["from lesson10 import checks\nimport course_wrappers as W"]
        for ex in exs:
            cells += [f"{ex.function} = W.{ex.function}", f"checks.check_{ex.id}({ex.function})"]
        notebooks[f"{nb_id}.ipynb"] = (nb_id, cells)
    return notebooks


def _wrappers_differ(graded) -> list:
    differ = []
    for ex in EXERCISES.values():
        here = check_cell(ex.id, getattr(W, ex.function))
        there = graded[f"{ex.notebook}.ipynb"][ex.id]
        sentence = refused.refusal(ex.id, "")[:-len(refused.use_instead(ex.id)) - 2]
        if here["status"] != there["status"] or sentence not in there["message"] \
                or refused.use_instead(ex.id) not in there["message"]:
            differ.append(f"{ex.id}: check cell {here['status']}, grader {there['status']}: "
                          f"{there['message'][:200]}")
    return differ


# --------------------------------------------------------------------------- the return rule
def test_the_return_rule_converts_exact_numbers_tensors_and_object_arrays():
    from decimal import Decimal
    from fractions import Fraction
    assert returns.plain(Fraction(6, 3)) == 2 and type(returns.plain(Fraction(6, 3))) is int
    assert returns.plain(Fraction(1, 3)) == 1 / 3
    assert returns.plain(Decimal("2.5")) == 2.5 and type(returns.plain(Decimal("1"))) is float
    got = returns.plain({"a": (Fraction(1, 2), [np.float32(1.5)]), "b": range(3)})
    assert got == {"a": (0.5, [np.float32(1.5)]), "b": [0, 1, 2]}
    assert isinstance(got["a"], tuple) and isinstance(got["a"][1][0], np.float32)
    obj = returns.plain(np.array([Fraction(1, 4), Decimal("0.5")], dtype=object))
    assert obj.dtype == np.float64 and obj.tolist() == [0.25, 0.5]
    text = np.array(["a", None], dtype=object)
    assert returns.plain(text) is text             # not numbers: the check says what is wrong
    a = np.arange(3)
    assert returns.plain(a) is a


def test_the_return_rule_converts_cpu_tensors_and_refuses_the_rest():
    torch = pytest.importorskip("torch")
    t = torch.arange(6, dtype=torch.float64).reshape(2, 3).requires_grad_()
    got = returns.plain([t, torch.tensor(2.0)])
    assert isinstance(got[0], np.ndarray) and got[0].shape == (2, 3) and got[0][1, 2] == 5
    assert isinstance(got[1], np.floating) and got[1] == 2
    for bad, says in ((torch.zeros(2, device="meta"), "on meta: move it to the CPU"),
                      (torch.zeros(2, dtype=torch.bfloat16), "bfloat16"),
                      ({1, 2}, "returned a set"), ((x for x in ()), "returned a generator")):
        with pytest.raises(returns.ReturnRefused, match=says):
            returns.plain(bad)


def test_a_refused_return_is_one_sentence_in_the_check_cell():
    out = check_cell("sp_bytes", A.sp_bytes_set)
    assert out["status"] == "failed"
    assert out["message"] == ("check_sp_bytes failed: your function returned a set: "
                              + returns.WHAT_TO_RETURN)


# --------------------------------------------------------------------------- served elsewhere
def test_what_the_check_serves_refuses_another_process_with_a_sentence_about_pools():
    import pickle

    from lesson10.checks.network import Referee
    ref = Referee("ring_attention", "case 1")
    ref.guard("block_attention")                          # this process: fine
    ref._pid = -1                                         # as seen from a forked worker
    with pytest.raises(returns.ServedElsewhere, match="multiprocessing pool worker"):
        ref.guard("block_attention")
    gone = pickle.loads(pickle.dumps(returns.Elsewhere("merge")))   # a spawned worker's copy
    with pytest.raises(returns.ServedElsewhere, match="the check's merge was called from another"):
        gone(1, 2)


def test_the_sandbox_s_served_stubs_pickle_to_refusing_ones(tmp_path):
    import pickle
    import threading

    from lesson10.course.grade import standin
    folder = standin.write(tmp_path / "box")
    sys.path.insert(0, str(folder))
    try:
        import _lesson10_runner as runner
        import _lesson10_wire as wire
        stub = runner._Callback(None, threading.Lock(), 3, "block_attention")
        served = wire.Served({"ring_shift": runner._Callback(None, threading.Lock(), 4,
                                                             "ring_shift")})
        copy = pickle.loads(pickle.dumps(stub))                 # a spawned worker's copy
        with pytest.raises(Exception, match="block_attention was called from another") as e1:
            copy()
        with pytest.raises(Exception, match="ring_shift was called from another"):
            pickle.loads(pickle.dumps(served)).ring_shift([1])
        stub._pid = -1                                          # a forked worker's stub
        with pytest.raises(Exception, match="pool") as e2:
            stub()
        assert type(e1.value).__name__ == type(e2.value).__name__ == "ServedElsewhere"
    finally:
        sys.path.remove(str(folder))


def test_the_wire_names_an_out_of_step_channel():
    import os
    import struct

    from lesson10.course.grade import wire
    r, w = os.pipe()
    try:
        os.write(w, struct.pack(">Q", 8872774558292261408))
        with pytest.raises(wire.WireError, match="out of step.*multiprocessing pool worker"):
            wire.Conn(r, w).recv(deadline=None)
    finally:
        os.close(r)
        os.close(w)


# --------------------------------------------------------------------------- kernels
def _kernel(name=None, language=None, info=None) -> dict:
    spec = {k: v for k, v in (("name", name), ("language", language)) if v is not None}
    meta = {"kernelspec": spec} if spec else {}
    if info is not None:
        meta["language_info"] = {"name": info}
    return {"metadata": meta, "cells": []}


@pytest.mark.parametrize("nb", [
    _kernel("conda-env-ml-py", "python", "python"),          # nb_conda_kernels
    _kernel("xpython", "python", "python"),                  # xeus-python
    _kernel("pyenv-3.11", "python"), _kernel(".venv", None, "python"),
    _kernel("python3"), _kernel(), {"metadata": {}}, {},
    _kernel("my-env", None, "Python"),                       # a language in capitals
    {"metadata": {"kernelspec": "python3", "language_info": ["python"]}},   # wrong types
    {"metadata": {"kernelspec": {"name": 3, "language": None}, "language_info": {"name": 7}}},
    {"metadata": "python"},
])
def test_every_python_kernel_grades(nb):
    assert course.language_problem(nb) is None


@pytest.mark.parametrize("nb, says", [
    (_kernel("ir", "R", "R"), "language 'r'"),
    (_kernel("python3", "python", "julia"), "language 'julia'"),    # what ran it decides
    (_kernel("julia-1.10", None, None), "language 'julia'"),        # no language: the name
    (_kernel("xpython", "javascript"), "kernel 'xpython', language 'javascript'"),
])
def test_another_language_scores_0_with_a_message_that_names_it(nb, says):
    problem = course.language_problem(nb)
    assert problem is not None and says in problem and "Python 3 kernel" in problem


# --------------------------------------------------------------------------- the worked copy
def _notebook_bytes(nb_id: str, *sources: str) -> bytes:
    code = [dict(cell_type="code", source=c, outputs=[], execution_count=None, metadata={})
            for c in sources]
    return json.dumps({"cells": code, "nbformat": 4, "nbformat_minor": 5,
                       "metadata": dict(KERNEL, lesson10={"notebook": nb_id})}).encode()


def _plan(folder: Path):
    from lesson10.course.grade import gradebook
    from lesson10.course.grade.submission_files import read_regular
    paths = gradebook.find_notebooks([folder])
    contents = {}
    for p in paths:
        try:
            contents[p] = read_regular(p)
        except OSError:
            contents[p] = None
    return gradebook.plan(paths, contents, student="alice")


WORKED = "def merge(o1, lse1, o2, lse2):\n    return o1, lse1\n"
STUB = "def merge(o1, lse1, o2, lse2):\n    raise NotImplementedError\n"


def test_a_link_beside_the_real_file_is_named_and_skipped(tmp_path):
    import os
    real = tmp_path / "02_ring_attention.ipynb"
    real.write_bytes(_notebook_bytes("02_ring_attention", WORKED))
    for name in ("Copy of 02_ring_attention.ipynb", "02_ring_attention (1).ipynb"):
        (tmp_path / name).symlink_to(real)
    plan = _plan(tmp_path)
    assert [it.path for it in plan.graded] == [real]
    assert sorted(p.name for p in plan.ignored) == ["02_ring_attention (1).ipynb",
                                                    "Copy of 02_ring_attention.ipynb"]
    assert all(chosen.path == real for chosen in plan.ignored.values())
    os.utime(real, (1, 1))                       # an older real file still wins over a link
    assert [it.path for it in _plan(tmp_path).graded] == [real]


def test_a_link_alone_stays_in_the_plan(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "x.ipynb").write_bytes(_notebook_bytes("02_ring_attention", WORKED))
    folder = tmp_path / "alice"
    folder.mkdir()
    (folder / "02_ring_attention.ipynb").symlink_to(elsewhere / "x.ipynb")
    plan = _plan(folder)
    assert [it.path.name for it in plan.graded] == ["02_ring_attention.ipynb"] and not plan.ignored


def test_the_copy_rule_counts_stubs_that_can_run_not_stub_text(tmp_path):
    import os
    worked = tmp_path / "02_ring_attention.ipynb"          # worked, the stub kept as text
    worked.write_bytes(_notebook_bytes("02_ring_attention", WORKED.replace(
        "    return", "    # raise NotImplementedError   (the stub, kept)\n    return")
        + "    raise NotImplementedError\n", "x = 1  # raise NotImplementedError"))
    older = tmp_path / "02_ring_attention-Copy1.ipynb"     # newer, still a stub
    older.write_bytes(_notebook_bytes("02_ring_attention", STUB))
    os.utime(worked, (1, 1))
    plan = _plan(tmp_path)
    assert [it.path for it in plan.graded] == [worked], plan.graded
    assert course.unwritten(json.loads(worked.read_bytes())) == 0
    assert course.unwritten(json.loads(older.read_bytes())) == 1


def test_unwritten_reads_code_as_python():
    def nb(*sources):
        return {"cells": [{"cell_type": "code", "source": s} for s in sources]
                + [{"cell_type": "markdown", "source": "raise NotImplementedError"}]}
    assert course.unwritten(nb(STUB, STUB.replace("merge", "other"))) == 2
    assert course.unwritten(nb("def f():\n    if x:\n        raise NotImplementedError()\n"
                               "    return 1\n")) == 1       # a live branch counts
    assert course.unwritten(nb('def f():\n    """raise NotImplementedError"""\n    return 1\n',
                               "def g():\n    return 1\n    raise NotImplementedError\n",
                               "# raise NotImplementedError\n")) == 0
    assert course.unwritten(nb("def f(:\n    raise NotImplementedError\n")) == 1  # not Python
    assert course.unwritten({"cells": "x"}) == course.unwritten([]) == 0


def test_every_withheld_function_is_guarded_in_the_check_cell_and_the_sandbox_says_the_same(
        tmp_path):
    from lesson10.course.grade import standin, withheld
    assert withheld.WITHHELD is refused.WITHHELD                      # one table
    for table in refused.WITHHELD.values():
        for qualified in table:
            found = refused._resolve(qualified)
            assert found is not None and not found[0].__closure__, qualified
    folder = standin.write(tmp_path / "box", notebook="05_moe_dispatch")
    text = (folder / "lesson10" / "_standin.py").read_text()
    refusal = (folder / "lesson10" / "checks" / "refused.py").read_text()   # the sentence, once
    assert "from lesson10.checks.refused import REFUSAL" in text and \
        f"REFUSAL = {refused.REFUSAL!r}" in refusal.splitlines()
    assert (folder / "_lesson10_returns.py").read_text() == Path(returns.__file__).read_text()
