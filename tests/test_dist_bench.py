"""The benchmark harness and the `run` command on tiny sizes (gloo, 2 ranks)."""
import re

from lesson10.dist import bench


def test_bench_ring_writes_the_tables(tmp_path, capsys):
    rc = bench.main(["ring", "--nproc", "2", "--seq", "64", "--heads", "2", "--dim", "8",
                     "--reps", "1", "--out", str(tmp_path), "--no-plot"])
    assert rc == 0
    md = (tmp_path / "ring.md").read_text()
    for title in ("## 1.", "## 2.", "## 3.", "## 4."):
        assert title in md
    # table 1: one row for N_c = 2 with the lesson's ratio (2 - 1/2)/(2/2) = 1.50
    assert re.search(r"^\| 2 \| 64 \|.*\| 1\.50 \|$", md, re.M)
    # table 4: the target row says whether the ratio is within 1.5
    assert re.search(r"^\| 64 \| 2 \| 8 \|.*\| <= 1\.5 \| (yes|no) \|$", md, re.M)
    # per-round table of the overlap benchmark: forward and backward rounds 0 and 1
    for phase in ("forward", "backward"):
        for k in (0, 1):
            assert re.search(rf"^\| 2 \| {phase} \| {k} \|", md, re.M)
    assert "wrote" in capsys.readouterr().out


def test_run_ring_checks_against_reference_and_cost(capsys):
    rc = bench.run_main(["ring", "--nproc", "2", "--seq", "32", "--heads", "4", "--kv-heads", "2",
                         "--dim", "8", "--dtype", "float64", "--layout", "contiguous"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "-> OK" in out
    # forward bytes equal the formula: (N_c - 1) * 2 c h e / g = 1 * 2*16*32*8/2
    m = re.search(r"forward: ([\d,]+) \(cost.comm_bytes\('ring', \.\.\.\) = ([\d,]+)\)", out)
    assert m and m.group(1) == m.group(2) == f"{2 * 16 * 32 * 8 // 2:,}"
