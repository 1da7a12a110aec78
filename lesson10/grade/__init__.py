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
from .cli import exit_status, main
from .notebook import Options, grade_notebook
from .sandbox import Package

__all__ = ["main", "exit_status", "grade_notebook", "Options", "Package"]
