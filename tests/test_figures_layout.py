"""lesson10.figures.grids and lesson10.figures.plots: their rules without looking at pixels
(bad arguments refused, the Ulysses warning, the TP degrees and axis ceilings)."""
import pytest

from lesson10.figures import grids, plots


def test_tp_degrees_divide_tokens_hidden_and_heads():
    assert plots.tp_degrees(s=12, h=8, a=4, largest=8) == [1, 2, 4]
    assert plots.tp_degrees(s=6, h=6, a=3, largest=2) == [1]
    assert all(8192 % t == 0 and 4096 % t == 0 and 32 % t == 0 for t in plots.tp_degrees())


@pytest.mark.parametrize("x, ceiling", [(1.0, 1.0), (1.2, 1.5), (2.5, 3.0), (7.0, 8.0), (9.0, 10.0),
                                        (0.031, 0.04), (4500, 5000)])
def test_nice_ceiling_is_the_next_round_number(x, ceiling):
    assert plots.nice_ceiling(x) == pytest.approx(ceiling)


def test_the_ring_figure_refuses_a_round_outside_the_ring():
    with pytest.raises(ValueError, match=r"round must be in 0..1 for n = 2"):
        grids.ring(None, n=2, s=8, layout="zigzag", round=2, causal=True)


def test_the_ulysses_grid_refuses_bad_heads_and_ranks():
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        grids.ulysses(None, n=2, s=4, heads=3, kv_heads=2, state="heads", rank=0, arrived=None)
    with pytest.raises(ValueError, match=r"rank must be in 0..1"):
        grids.ulysses(None, n=2, s=4, heads=4, kv_heads=2, state="heads", rank=2, arrived=None)


def test_the_ulysses_grid_warns_when_kv_heads_are_fewer_than_ranks():
    few = grids.ulysses(None, n=4, s=4, heads=4, kv_heads=2, state="heads", rank=0, arrived=None)
    assert "4 ranks but only 2 K/V heads" in few.ulysses_warning
    enough = grids.ulysses(None, n=2, s=4, heads=4, kv_heads=2, state="heads", rank=0, arrived=None)
    assert enough.ulysses_warning == ""
