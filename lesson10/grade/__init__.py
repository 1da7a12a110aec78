"""The autograder: ``python -m lesson10 grade submissions/*/*.ipynb``.

The score comes from a judge that no student code runs in (:mod:`.judge`): it draws the
hidden cases from a secret seed, sends only plain data (:mod:`.wire`) to a sandboxed
worker process that runs the student's cells (:mod:`.worker`), compares the results
itself, and fails an exercise whose function runs the course's reference code
(:mod:`.guard`). Each notebook is also executed for its outputs and feedback
(:mod:`.runner`). Which exercises count comes from the course (:mod:`.course`). No
process that runs student code imports the package from a file another one could edit
(:mod:`.sandbox`). Outputs: :mod:`.reports`; command line and exit status: :mod:`.cli`
(0 all passed, 1 points lost, 2 the grader or the environment failed).
"""
import importlib

#: public name -> submodule; imported on first use, so that a worker (which imports
#: ``lesson10.grade.worker``) does not load the command line, nbclient and the reports
_LAZY = {"main": "cli", "exit_status": "cli", "grade_notebook": "notebook", "Options": "notebook",
         "Package": "sandbox"}

__all__ = list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
