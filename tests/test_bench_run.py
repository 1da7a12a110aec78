"""The benchmark harness and the `run` command on tiny sizes (gloo, 2 ranks)."""
import re

import pytest

from lesson10 import bench
from lesson10.runs import cli as run

pytestmark = pytest.mark.slow   # a whole command end to end: make test-slow


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
    rc = run.main(["ring", "--nproc", "2", "--seq", "32", "--heads", "4", "--kv-heads", "2",
                         "--dim", "8", "--dtype", "float64", "--layout", "contiguous"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "-> OK" in out
    # forward bytes equal the formula: (N_c - 1) * 2 c h e / g = 1 * 2*16*32*8/2
    m = re.search(r"forward: ([\d,]+) \(lesson's formula: ([\d,]+)\); besides: \{'metadata'", out)
    assert m and m.group(1) == m.group(2) == f"{2 * 16 * 32 * 8 // 2:,}", out


# `python -m lesson10 run sp | moe | ulysses` (the ring case is above); expected bytes from
# the lesson's formulas, written out here
def _run(capsys, *argv):
    rc = run.main([*argv, "--nproc", "2", "--dtype", "float64"])
    return rc, capsys.readouterr().out


def test_run_sp_tp_and_sp_match_and_send_the_same_bytes(capsys):
    t, s, h, e = 2, 8, 8, 8                                  # h = heads * dim
    rc, out = _run(capsys, "sp", "--seq", str(s), "--heads", "2", "--dim", "4")
    assert rc == 0 and out.rstrip().endswith("OK")
    one_all_reduce = 2 * (t - 1) / t * s * h * e            # one block: one all-reduce = RS + AG
    blocks = out.split("sp on N=2 ranks")[1:]
    assert len(blocks) == 2 and "sequence_parallel=True" in blocks[1], out
    for text in blocks:
        err = re.search(r"max \|error\| vs single-process reference: (\S+) -> OK", text)
        fwd = re.search(r"forward: ([\d,]+) \(lesson's formula: ([\d,]+)\)", text)
        assert err and float(err.group(1)) < 1e-12, text
        assert int(fwd.group(1).replace(",", "")) == int(fwd.group(2).replace(",", "")) == one_all_reduce


def test_run_moe_uniform_routing_sends_the_formula(capsys):
    n, T, h, k, e = 2, 8, 8, 2, 8                           # T = seq / N_e, h = heads * dim
    rc, out = _run(capsys, "moe", "--seq", str(n * T), "--heads", "2", "--dim", "4")
    assert rc == 0 and out.rstrip().endswith("OK")
    uni, capped = out.split("moe on N=2 ranks")[1:]
    assert "routing=uniform" in uni and "capacity_factor=1.25" in capped, out
    for text in (uni, capped):
        err = re.search(r"max \|error\| vs single-process reference: (\S+) -> OK", text)
        assert err and float(err.group(1)) < 1e-12, text
    fwd = re.search(r"forward: ([\d,]+) \(lesson's formula: ([\d,]+)\)", uni)
    assert int(fwd.group(1).replace(",", "")) == int(fwd.group(2).replace(",", "")) \
        == 2 * k * T * h * e * (n - 1) / n


def test_run_ulysses_checks_against_reference_and_cost(capsys):
    n, s, a, a_kv, d, e = 2, 16, 4, 2, 4, 8
    rc, out = _run(capsys, "ulysses", "--seq", str(s), "--heads", str(a), "--kv-heads", str(a_kv),
                   "--dim", str(d))
    assert rc == 0 and "-> OK" in out
    # Q and out: s/N_c tokens x h columns; K and V: h/g columns; (N_c - 1)/N_c of each sent
    h, g = a * d, a // a_kv
    want = (n - 1) / n * (2 * s // n * h + 2 * s // n * h // g) * e
    m = re.search(r"forward: ([\d,]+) \(lesson's formula: ([\d,]+)\)", out)
    assert m and m.group(1) == m.group(2) == f"{int(want):,}", out
    assert re.search(rf"backward: {int(want):,}$", out, re.M), out
