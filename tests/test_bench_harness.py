"""lesson10.bench.harness and lesson10.bench.paths: the helpers every benchmark shares that
need no rank (tables, ratios, interleaving, the results folder)."""
from pathlib import Path

import torch

from lesson10.bench import harness
from lesson10.bench.paths import RESULTS_DIR


def test_every_benchmark_writes_under_one_relative_results_folder():
    assert harness.RESULTS_DIR is RESULTS_DIR
    assert not RESULTS_DIR.is_absolute() and RESULTS_DIR.parts[-1] == "results"


def test_md_table_has_a_header_rule_and_one_line_per_row():
    text = harness.md_table(["a", "b"], [(1, "x"), (2.5, None)])
    assert text.splitlines() == ["| a | b |", "|---|---|", "| 1 | x |", "| 2.5 | None |"]


def test_ratio_median_and_ms():
    assert harness.ratio([1, 1, 4]) == 2.0
    assert harness.ratio([0, 0]) == 1.0
    assert harness.median([3, 1, 2]) == 2 and harness.median([]) is None
    assert harness.ms(0.01234) == "12.3"


def test_interleaved_runs_configs_in_turn_and_drops_the_warmup_and_none():
    calls = []

    def step(cfg, state):
        calls.append(cfg)
        state["n"] = state.get("n", 0) + 1
        return None if cfg == "skip" else float(state["n"])

    times, states = harness.interleaved(["a", "skip"], step, reps=2, warmup=1)
    assert calls == ["a", "skip"] * 3
    assert times == [[2.0, 3.0], []] and states == [{"n": 3}, {"n": 3}]


def test_write_table_writes_and_prints(tmp_path, capsys):
    md = tmp_path / "t.md"
    harness.write_table(md, ["# t", "| a |"])
    assert md.read_text() == "# t\n| a |\n"
    assert f"wrote {md}" in capsys.readouterr().out


def test_moe_tokens_are_seeded_by_seed_and_rank():
    x0, dy0 = harness.moe_tokens(4, 3, rank=0, seed=1, dtype=torch.float32)
    again, _ = harness.moe_tokens(4, 3, rank=0, seed=1, dtype=torch.float32)
    other, _ = harness.moe_tokens(4, 3, rank=1, seed=1, dtype=torch.float32)
    assert x0.shape == dy0.shape == (4, 3) and x0.dtype == torch.float32
    assert torch.equal(x0, again) and not torch.equal(x0, other) and not torch.equal(x0, dy0)


def test_stacked_parts_draws_one_bar_per_row_and_part(tmp_path):
    rows = [{"parts": [0.001, 0.002]}, {"parts": None}]
    fig, ax = harness.stacked_parts(["x", "y"], rows, ["p", "q"])
    heights = [round(bar.get_height(), 6) for bar in ax.patches]
    assert heights == [1.0, 0.0, 2.0, 0.0]
    assert harness.save_figure(fig, tmp_path / "f.png") == Path(tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 0
