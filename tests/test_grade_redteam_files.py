"""Red team of the grader's edges (issue 23): only the student's own files, as regular files;
judge what Jupyter saw; every check call judged.

Every case is one notebook 03 (three exercises, 4 points), made from the course's solution
(:mod:`redteam.build`) and graded in ONE batch of ``python -m lesson10 grade -j 2
--student-from ...``: each case in a folder of its own, and three students (alice, bob,
carol) in one flat folder. A cheat scores exactly 0 on the exercise it targets and full
marks on the others; an honest variant scores 4/4.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from redteam import build as B
from redteam import clock

import lesson10
from lesson10.course.grade import main, sandbox

pytestmark = pytest.mark.redteam   # graded in whole batches: make test-redteam

NB03 = "03_load_balance"
RX = r"(?P<student>[^/_]+)_\d\d_"            # alice_03_load_balance.ipynb -> alice
ALL = ("causal_work", "ring_time", "zigzag_positions")
WRONG_RT = "def ring_time(work):\n    return 0\n"
RT_CHECK = "checks.check_ring_time(ring_time)"
PKG = Path(lesson10.__file__).resolve().parent


def _nb(defs=None, checks=None, before_rt=()):
    """The reduced solution notebook; ``defs``: function -> new cell; ``checks``: a function
    of the check cell's source giving the new one; ``before_rt``: cells put before
    ring_time's definition."""
    nb = B.reduced(NB03)
    for fn, src in (defs or {}).items():
        nb = B.replace_def(nb, fn, src)
    if checks is not None:
        for ex in ALL:
            cell = next(B.source(c) for c in nb["cells"] if ex in B.checked(B.source(c)))
            nb = B.replace_check(nb, ex, checks(cell))
    if before_rt:
        nb = B.insert(nb, *before_rt, before_def="ring_time")
    return nb


def _zz_module() -> str:
    return "import numpy as np\n\n\n" + B.solution_def(NB03, "zigzag_positions")


FROM_ZZ = {"zigzag_positions": "from zz_helper import zigzag_positions\n"}

#: case -> (notebook, the exercises it must lose (0 points); every other one scores full)
CASES = {
    # -- judge what Jupyter saw: magics and shell lines in check cells change nothing
    "time-magic": (_nb(checks=lambda s: "%%time\n" + s), ()),
    "capture-magic": (_nb(checks=lambda s: "%%capture captured\n" + s), ()),
    "shell-line": (_nb(checks=lambda s: "!echo checking\n" + s), ()),
    "line-magic": (_nb(checks=lambda s: "%time " + s.strip()), ()),
    "time-and-capture": (_nb(checks=lambda s: "%%time\n%%capture\n" + s), ()),
    # -- every check call judged: the last one that ran counts
    "four-attempts": (_nb(before_rt=[WRONG_RT, RT_CHECK] * 3), ()),
    "many-attempts": (_nb(before_rt=[WRONG_RT, RT_CHECK] * 13), ()),   # more than CHANNELS
    "right-then-wrong-many": (B.insert(_nb(), *[RT_CHECK] * 12, WRONG_RT, RT_CHECK, at_end=True),
                              ("ring_time",)),
    # -- helper files: the student's own, as regular files
    "helper-beside": (_nb(defs=FROM_ZZ), ()),
    "link-classmate": (_nb(defs=FROM_ZZ), ("zigzag_positions",)),
    "link-course": (_nb(defs={"ring_time": "from course_layouts import ring_time\n"}),
                    ("ring_time",)),
    "link-outside": (_nb(defs=FROM_ZZ), ("zigzag_positions",)),
    "fifo-helper": (_nb(defs=FROM_ZZ), ("zigzag_positions",)),
    "link-notebook": (None, ALL),
    # -- a flat folder: alice's and carol's helpers are theirs alone
    "alice": (_nb(defs={"zigzag_positions": "from alice_zz import zigzag_positions\n"}), ()),
    "carol": (_nb(defs={"zigzag_positions": "from helper import zigzag_positions\n"}), ()),
    "bob": (_nb(defs={"zigzag_positions": "from alice_zz import zigzag_positions\n",
                      "ring_time": "from helper import zigzag_positions as _z\n"
                                   "from carol_03_helper import zigzag_positions as _y\n"
                                   + B.solution_def(NB03, "ring_time")}),
            ("zigzag_positions", "ring_time")),
}
FLAT = ("alice", "bob", "carol")
LINKED = ("link-classmate", "link-course", "link-outside", "link-notebook")


def _write_cases(tmp: Path) -> list[str]:
    paths = []
    for name, (nb, _) in CASES.items():
        folder = tmp / ("flat" if name in FLAT else name)
        rel = f"{folder.name}/{name}_03_load_balance.ipynb"
        if nb is not None:
            B.write(folder, f"{name}_03_load_balance.ipynb", nb)
        paths.append(rel)
    (tmp / "helper-beside" / "zz_helper.py").write_text(_zz_module())
    os.symlink("../helper-beside/zz_helper.py", tmp / "link-classmate" / "zz_helper.py")
    os.symlink(PKG / "layouts.py", tmp / "link-course" / "course_layouts.py")
    (tmp / "outside").mkdir()
    (tmp / "outside" / "answers.py").write_text(_zz_module())
    os.symlink(tmp / "outside" / "answers.py", tmp / "link-outside" / "zz_helper.py")
    os.mkfifo(tmp / "fifo-helper" / "zz_helper.py")
    (tmp / "link-notebook").mkdir()
    os.symlink(B.ROOT / "solutions" / f"{NB03}.ipynb",
               tmp / "link-notebook" / "link-notebook_03_load_balance.ipynb")
    (tmp / "flat" / "alice_zz.py").write_text(_zz_module())
    (tmp / "flat" / "carol_03_helper.py").write_text(_zz_module())
    return paths


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("files")
    paths = _write_cases(tmp)
    extra = [] if sandbox.probe() is None else ["--no-sandbox"]
    here = os.getcwd()
    os.chdir(tmp)
    out = tmp / "report.json"
    try:
        main([*paths, "--student-from", RX, "-j", "2", "--seed", "424242",
              *clock.limits(cell=30, exercise=10, notebook=300), "--output", str(out), *extra])
    finally:
        os.chdir(here)
    report = json.loads(out.read_text())
    return {rep["student"]: rep for rep in report["notebooks"]}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_case_scores_exactly_what_it_earned(graded, name):
    rep = graded[name]
    assert rep["ok"], rep
    lost = set(CASES[name][1])
    got = {e["exercise"]: e for e in rep["exercises"]}
    assert set(got) == set(ALL), rep
    for ex, e in got.items():
        want = 0 if ex in lost else e["max_points"]
        assert e["points"] == want, (name, ex, e["status"], e["message"][:300], rep["feedback"])
    if not lost:
        assert {e["status"] for e in got.values()} == {"passed"}


@pytest.mark.parametrize("name", LINKED)
def test_a_link_is_refused_and_the_feedback_says_so(graded, name):
    assert any("symbolic link" in line for line in graded[name]["feedback"]), graded[name]


def test_a_pipe_in_place_of_a_helper_is_refused_without_a_hang(graded):
    assert any("not a regular file" in line for line in graded["fifo-helper"]["feedback"])


def test_a_check_cell_with_magics_is_no_removed_check(graded):
    for name in ("time-magic", "capture-magic", "shell-line", "line-magic", "time-and-capture"):
        assert "check removed" not in {e["status"] for e in graded[name]["exercises"]}, name
