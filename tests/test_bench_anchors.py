"""benchmarks/tooling/anchors.py without its anchors: the layouts it hands lucidrains and the
table it writes (the run itself needs .venv-anchors: `make bench-anchors`)."""
from __future__ import annotations

import torch

from benchmarks.tooling import anchors


def test_lucidrains_striping_gives_each_rank_half_of_the_residues():
    pos = anchors._striped_positions(2)
    assert pos.shape == (2, anchors.S // 2)
    assert torch.equal(torch.sort(pos.flatten()).values, torch.arange(anchors.S))   # a permutation
    step = anchors.S // anchors.BUCKET
    assert pos[0, :3].tolist() == [0, step, 2 * step] and pos[1, 0] == step // 2
    assert set((pos[0] % step).tolist()) == set(range(step // 2))      # residues 0..3 of 8


def test_a_section_gives_ratios_of_medians_beside_the_load_and_the_checks():
    res = {"times": {"ours": [1.0, 1.2, 1.1], "lucidrains ring (striped)": [4.0, 4.4, 4.2],
                     anchors.FLOOR: [1.0, 1.0, 1.0]},
           "err": {"ours": [3e-8, 2e-7, 2e-7, 2e-7], "lucidrains ring (striped)": [1e-7, 1e-7, 1.0, 1.0]},
           "load": (2.0, 3.0)}
    text = "\n".join(anchors._section("ring", res, 3))
    assert text.startswith("## ring") and "load average (1 min) 2.0 before, 3.0 after" in text
    ours = next(line for line in text.splitlines() if line.startswith("| ours |"))
    assert "| 1.10 (1.10) | 0.26 (0.26) |" in ours and "1e+00" not in ours
    floor = next(line for line in text.splitlines() if line.startswith(f"| {anchors.FLOOR} |"))
    assert "reference" in floor
