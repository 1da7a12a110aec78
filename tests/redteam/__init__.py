"""Helpers of the grader's red-team suite (tests/test_grade_redteam.py).

:mod:`.build` makes submissions from the course's own notebooks (cut, edited, renamed),
:mod:`.cells` writes the source of the attack and probe cells. Nothing here is copied out of
a notebook by hand: the exercise functions, their check cells, the references the notebooks
use and the signatures of the exercise functions are all read from solutions/ and
notebooks/ at collection time, so the suite follows the course when the course changes.
"""
