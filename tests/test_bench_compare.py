"""`bench compare` (all-gather, ring, Ulysses, USP at equal N) and `run allgather|usp`, tiny."""
import re

import pytest

from lesson10 import bench
from lesson10.runs import cli as run

pytestmark = pytest.mark.slow   # a whole command end to end: make test-slow


def test_bench_compare_writes_times_and_bytes_next_to_the_formulas(tmp_path, capsys):
    rc = bench.main(["compare", "--nproc", "4", "--seq", "64", "--heads", "4", "--kv-heads", "2",
                     "--dim", "8", "--reps", "1", "--out", str(tmp_path)])
    assert rc == 0
    md = (tmp_path / "compare.md").read_text()
    rows = re.findall(r"^\| 4 \| ([a-z]+)[^|]*\|.*\| ([\d.]+) \| ([\d.]+) \|$", md, re.M)
    assert sorted(m for m, _, _ in rows) == ["allgather", "ring", "usp"]   # Ulysses: 2 kv heads < 4
    for _, measured, formula in rows:
        assert measured == formula                      # forward bytes per rank = the lesson's
    assert "wrote" in capsys.readouterr().out


def test_run_usp(capsys):
    """`run usp` (the `run allgather` path is the same worker, checked in test_spmd_allgather.py)."""
    rc = run.main(["usp", "--nproc", "4", "--ulysses-size", "2", "--seq", "32", "--heads", "4",
                   "--kv-heads", "2", "--dim", "8", "--dtype", "float64"])
    out = capsys.readouterr().out
    assert rc == 0 and "-> OK" in out, out
    fwd = re.search(r"forward: ([\d,]+) \(lesson's formula: ([\d,]+)\)", out)
    assert fwd and fwd.group(1) == fwd.group(2)


def test_bench_memory_writes_a_row_per_rank_count(tmp_path):
    rc = bench.main(["memory", "--nproc", "2", "--block", "256", "--heads", "2", "--dim", "8",
                     "--out", str(tmp_path)])
    assert rc == 0
    md = (tmp_path / "memory.md").read_text()
    rows = re.findall(r"^\| (\d) \| 256 \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", md, re.M)
    assert [(n, s) for n, s, *_ in rows] == [("2", "512")]
    for n, _, inputs, rise, single in rows:
        assert float(rise) >= 0 and float(single) == pytest.approx(int(n) * float(inputs), abs=0.2)


def test_bench_compare_on_pretend_nodes_shows_what_crosses(tmp_path, monkeypatch):
    monkeypatch.setenv("LESSON10_NODE_SIZE", "4")       # restored after the test (bench sets it)
    rc = bench.main(["compare", "--nproc", "4", "--seq", "2048", "--heads", "4", "--kv-heads", "2",
                     "--dim", "16", "--reps", "1", "--node-size", "2", "--out", str(tmp_path)])
    assert rc == 0
    md = (tmp_path / "compare.md").read_text()
    assert "across nodes" in md
    rows = {m: (float(a), float(b)) for m, a, b in
            re.findall(r"^\| 4 \| ([a-z]+)[^|]*\|.*\| ([\d.]+) \| [\d.]+ \| ([\d.]+) \|$", md, re.M)}
    assert sorted(rows) == ["allgather", "ring", "usp"]
    measured, across = rows["ring"]
    assert across == pytest.approx(measured / 2, abs=0.011)   # ranks 1 and 3 send everything across
    assert 0 < rows["usp"][1] < rows["usp"][0]                # its all-to-all stays inside a node
