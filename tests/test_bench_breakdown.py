"""The breakdown benchmarks: the MoE experts' baseline (the former loop) computes what the
grouped matmul computes, the tables' ratios and shares, and `bench moe --breakdown` end to end."""
import pytest
import torch

from lesson10 import bench
from lesson10.bench import moe_breakdown as mb
from lesson10.spmd.moe import grouped_expert_mlp


def test_the_loop_baseline_is_the_grouped_matmul():
    g = torch.Generator().manual_seed(3)
    eid = torch.tensor([2, 0, 2, 2, 0, 3])                       # expert 1 idle
    x = torch.randn(6, 4, generator=g, dtype=torch.float64)
    w1 = torch.randn(4, 4, 5, generator=g, dtype=torch.float64)
    w2 = torch.randn(4, 5, 4, generator=g, dtype=torch.float64)
    assert torch.allclose(mb.loop_expert_mlp(x, eid, w1, w2), grouped_expert_mlp(x, eid, w1, w2),
                          atol=1e-12)
    wrong = eid.clone()
    wrong[0] = 1                                                 # a row sent to the wrong expert
    assert not torch.allclose(mb.loop_expert_mlp(x, wrong, w1, w2),
                              grouped_expert_mlp(x, eid, w1, w2), atol=1e-6)


def test_breakdown_table_shares_and_ratios():
    rows = [{"n": 2, "experts": "loop", "median_s": 1.0, "parts": [0.1, 0.2, 0.6, 0.1]},
            {"n": 2, "experts": "grouped", "median_s": 0.8, "parts": [0.1, 0.2, 0.3, 0.2]}]
    md = mb.breakdown_table(rows)
    lines = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
             for line in md.splitlines() if line.startswith("| ") and "---" not in line}
    assert lines["loop"][1:] == ["1000.0", "100.0 (10%)", "200.0 (20%)", "600.0 (60%)",
                                 "100.0 (10%)"]
    assert lines["grouped / loop"][1:] == ["0.80x", "1.00x", "1.00x", "0.50x", "2.00x"]
    assert "grouped / loop" not in mb.breakdown_table(rows[:1])  # no ratio without both


@pytest.mark.slow   # a whole command end to end: make test-slow
def test_bench_moe_breakdown_writes_the_table(tmp_path):
    rc = bench.main(["moe", "--breakdown", "--nproc", "2", "--tokens", "32", "--hidden", "8",
                     "--experts", "4", "--topk", "2", "--ffn", "8", "--reps", "1",
                     "--out", str(tmp_path)])
    assert rc == 0
    md = (tmp_path / "moe_breakdown.md").read_text()
    assert (tmp_path / "moe_breakdown.png").read_bytes()[:4] == b"\x89PNG"
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in md.splitlines()
            if line.startswith(("| loop |", "| grouped |"))]
    assert [r[0] for r in rows] == ["loop", "grouped"]
    for r in rows:                                               # the parts add up to the step
        parts = [float(c.split()[0]) for c in r[2:]]
        assert abs(sum(parts) - float(r[1])) <= 0.1 * float(r[1]) + 0.5
        assert float(r[4].split()[0]) > 0                        # the experts took some time


def test_the_ring_breakdown_sums_its_rounds_by_phase():
    from lesson10.bench.attention import breakdown_section
    rounds = [{"phase": "forward", "round": 0, "compute_s": 0.1, "wait_s": 0.01},
              {"phase": "forward", "round": 1, "compute_s": 0.1, "wait_s": 0.03},
              {"phase": "backward", "round": 0, "compute_s": 0.3, "wait_s": 0.02},
              {"phase": "backward", "round": 1, "compute_s": 0.3, "wait_s": 0.04}]
    by = {("ring", 2, "zigzag", True): {"median_s": 0.5, "times": [0.4, 1.0], "per_round": rounds}}
    md = "\n".join(breakdown_section(by, [2]))
    row = next(line for line in md.splitlines() if line.startswith("| 2 |"))
    assert [c.strip() for c in row.strip("|").split("|")] == [
        "2", "1000.0", "200.0 (20%)", "40.0 (4%)", "600.0 (60%)", "60.0 (6%)", "100.0 (10%)"]
    assert breakdown_section({}, [2]) == []                      # no ring row: no section
