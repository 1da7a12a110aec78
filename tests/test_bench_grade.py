"""`bench grade` on one small notebook: both commands run and the table and csv are written."""
import csv
import re
import shutil

import pytest
from redteam import build

from lesson10 import bench

pytestmark = pytest.mark.slow   # a whole command end to end: make test-slow


def test_bench_grade_writes_the_table_and_the_csv(tmp_path, capsys):
    nb = build.write(tmp_path / "sub", "03_load_balance.ipynb", build.reduced("03_load_balance"))
    extra = [] if shutil.which("bwrap") else ["--no-sandbox"]
    rc = bench.main(["grade", "--notebooks", str(nb), "--out", str(tmp_path), *extra])
    assert rc == 0
    md = (tmp_path / "grade.md").read_text()
    grade = re.search(r"^\| grade \(.*\| ([\d.]+) \| (?:[\d.]+|n/a) \| ([\d.]+) \| 4/4 points \|$", md, re.M)
    run = re.search(r"^\| nbclient .*\| ([\d.]+) \| (?:[\d.]+|n/a) \| ([\d.]+) \| 1 notebook executed \|$",
                    md, re.M)
    assert grade and run, md
    assert float(grade.group(1)) > 0 and float(run.group(1)) > 0          # CPU seconds
    assert re.search(r"CPU ratio grade / nbclient: \*\*[\d.]+\*\* \(target <= 1.2: (yes|no)\)", md)
    with open(tmp_path / "grade.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["command"] for r in rows) == ["grade", "nbclient"]
    assert all(float(r["cpu_s"]) >= float(r["user_s"]) for r in rows)
    assert "wrote" in capsys.readouterr().out

