"""`bench class`: a generated class is graded and the rate, the CPU per notebook and the
estimate for 200 students are written."""
import re
import shutil

import pytest

from benchmarks.tooling import classroom
from lesson10 import bench

pytestmark = pytest.mark.slow   # a whole command end to end: make test-slow


def test_the_generated_class_has_every_shape(tmp_path):
    n = classroom.make_class(tmp_path, 6, seed=1)
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.ipynb"))
    assert n == len(files) == 30
    assert any("/lesson10-main/notebooks/" in f for f in files)          # nested downloads
    assert len({f.split("/")[0] for f in files}) == 6
    # no two the same bytes: the grader grades identical files once, copies would time nothing
    assert len({p.read_bytes() for p in tmp_path.rglob("*.ipynb")}) == 30


def test_bench_class_writes_the_rate_and_the_estimate(tmp_path, capsys):
    extra = [] if shutil.which("bwrap") else ["--no-sandbox"]
    assert bench.main(["class", "--students", "1", "--out", str(tmp_path), *extra]) == 0
    md = (tmp_path / "class.md").read_text()
    row = re.search(r"^\| 5 \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", md, re.M)
    assert row, md
    wall, rate, cpu, per = map(float, row.groups())
    assert wall > 0 and cpu > 0
    # the table rounds wall, rate and CPU to 0.1: the rate of any wall within that rounding
    assert 60 * 5 / (wall + 0.05) - 0.05 <= rate <= 60 * 5 / (wall - 0.05) + 0.05
    assert abs(per - cpu / 5) <= 0.05 / 5 + 0.005
    minutes = float(re.search(r"200 students x 5 notebooks at this rate: \*\*(\d+) min\*\*", md).group(1))
    assert 1000 / (rate + 0.05) - 0.5 <= minutes <= 1000 / max(rate - 0.05, 1e-9) + 0.5
    assert "wrote" in capsys.readouterr().out
