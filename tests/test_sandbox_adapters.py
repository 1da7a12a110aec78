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
