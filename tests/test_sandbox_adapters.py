"""The grader's stand-in keeps its adapters to itself: each ``_adapt_*`` refuses while an
exercise is judged, however student code reaches it (a module attribute, a stub's closure)."""
from __future__ import annotations

import inspect

import pytest

from lesson10.course.grade import standin


def test_the_adapters_refuse_while_judged(tmp_path):
    """Each ``_adapt_*`` of the stand-in refuses while an exercise is judged (reached as a
    module attribute or out of a stub's closure), and still runs in a display-only cell."""
    box = standin.write(tmp_path / "box", notebook="01_sequence_parallel")
    ns: dict = {"__name__": "lesson10._standin"}
    exec(compile((box / "lesson10" / "_standin.py").read_text(), "_standin.py", "exec"), ns)
    names = [n for n in ns if n.startswith("_adapt_")]
    assert len(names) >= 10, names
    assert ns["_adapt_comm_bytes"]("ring", 4096, 512, 8) > 0         # not judged: it runs
    ns["JUDGING"] = ("sp_bytes", "write it with NumPy")
    for name in names:
        with pytest.raises(ns["NotAvailable"], match=f"_standin.{name}"):
            params = inspect.signature(ns[name]).parameters.values()
            ns[name](*[1] * sum(p.default is p.empty for p in params))


def test_the_runtime_is_a_real_module_each_adapter_first_refusing_while_judged(capsys, monkeypatch):
    """The stand-in's runtime is ordinary code (linted, typed, tested here) that travels
    verbatim: each adapter's first statement is ``_not_judging(its name)``, a course
    reference refuses, and a check with no grader behind it says it was not judged."""
    import ast
    from pathlib import Path

    from lesson10.course.grade import standin_runtime as rt
    tree = ast.parse(Path(rt.__file__).read_text(encoding="utf-8"))
    adapters = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("_adapt_")]
    assert len(adapters) >= 10
    for fn in adapters:
        first = fn.body[0]
        assert isinstance(first, ast.Expr) and ast.unparse(first) == f"_not_judging({fn.name!r})", fn.name
    with pytest.raises(rt.NotAvailable, match="not available while the grader runs this notebook"):
        rt.reference("lesson10.sim.ring_attention")()
    monkeypatch.setattr(rt, "JUDGING", ("sp_bytes", "write it with NumPy"))
    with pytest.raises(rt.NotAvailable, match="exercise sp_bytes may not call lesson10.cost.x; write it"):
        rt.reference("lesson10.cost.x")()
    monkeypatch.setattr(rt, "JUDGING", None)
    assert rt.check_stub("sp_bytes")(lambda: None) is None
    assert "check_sp_bytes: not judged" in capsys.readouterr().out
