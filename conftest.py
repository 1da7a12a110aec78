"""pytest set-up for the whole repository.

In a notebook a failed check shows its verdict and returns, so that Run All reaches the end
whatever the answers (lesson10.checks.feedback). That would let nbval pass a broken
*solution*: so while nbval runs a notebook of a ``solutions/`` folder, its kernel starts
with ``LESSON10_STRICT_CHECKS=1`` and a failed check raises there. The exercise notebooks
(``notebooks/``) run as a student's do. So ``pytest --nbval-lax notebooks solutions`` fails
on a broken solution notebook (tests/test_notebook_feedback.py shows it)."""
import os

import pytest

_STRICT = "LESSON10_STRICT_CHECKS"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """nbval starts a notebook's kernel while its first cell is set up: set the variable
    for the kernel of a solution notebook, and put it back afterwards."""
    path = getattr(item, "path", None)
    solution = path is not None and path.suffix == ".ipynb" and path.parent.name == "solutions"
    before = os.environ.get(_STRICT)
    if solution:
        os.environ[_STRICT] = "1"
    try:
        yield
    finally:
        if solution:
            if before is None:
                os.environ.pop(_STRICT, None)
            else:
                os.environ[_STRICT] = before
