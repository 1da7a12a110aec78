"""The autograder: ``python -m lesson10 grade submissions/*/*.ipynb``.

Each notebook's cells run once, top to bottom, in an operating-system sandbox
(:mod:`.sandbox`: bubblewrap, no network, read-only files, limits) that holds a stand-in
``lesson10`` with the course's names and none of its code (:mod:`.standin`). The runner
there (:mod:`.runner`) reports each cell's output; at each check cell it forks, and the
judge outside (:mod:`.judge`) runs the course's check on hidden cases, calling the
student's function in the fork over a plain-data wire (:mod:`.wire`) and serving what the
exercise may use (an op, a ring network, an attention kernel) as callbacks it counts.
Which exercises count comes from the course (:mod:`.course`); one notebook's report:
:mod:`.notebook`; outputs: :mod:`.reports`. A run is four stages (plan, grade, collect,
write) in :mod:`.pipeline`, over one :class:`~.request.Request` that the command line
(:mod:`.cli`) parses; its exit status is 0 all passed, 1 points lost, 2 the grader or the
environment failed.
"""
import importlib

#: public name -> submodule, imported on first use
_LAZY = {"main": "cli", "exit_status": "pipeline", "grade_notebook": "notebook",
         "Request": "request", "run": "pipeline", "GradeConfig": "config"}

__all__ = list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
