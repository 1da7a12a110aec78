"""SimGroup: collectives on lists of arrays, and the byte ledger at ring-algorithm cost."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sim_strategies import FAST

from lesson10 import cost, sim
from lesson10.sim import SimGroup, gather_sequence, shard_sequence


def _xs(n, shape, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) for _ in range(n)]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_all_reduce_sums_and_counts_ring_bytes(n):
    xs = _xs(n, (6, 5))
    g = SimGroup(n, e=2)
    out = g.all_reduce(xs)
    expected = sum(xs)
    assert len(out) == n
    for o in out:
        np.testing.assert_allclose(o, expected, rtol=0, atol=1e-14)
    # 2 (n-1)/n of the tensor, e bytes per element (not the float64 itemsize)
    np.testing.assert_allclose(g.bytes_sent, cost.all_reduce_bytes(30 * 2, n))
    np.testing.assert_allclose(g.bytes_sent, 2 * (n - 1) / n * 30 * 2)


def test_results_are_independent_copies():
    xs = _xs(3, (3, 2))
    before = [x.copy() for x in xs]
    g = SimGroup(3)
    out = g.all_reduce(xs)
    out[0][:] = 0.0
    assert np.all(out[1] != 0.0)                  # ranks do not share memory
    for x, b in zip(xs, before):                  # inputs untouched
        assert np.array_equal(x, b)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_reduce_scatter_gives_block_r_of_the_sum(axis):
    n = 4
    xs = _xs(n, (8, 4, 3) if axis == 0 else (3, 8, 4) if axis == 1 else (3, 2, 8))
    g = SimGroup(n, e=1)
    out = g.reduce_scatter(xs, axis=axis)
    blocks = np.split(sum(xs), n, axis=axis)
    for o, b in zip(out, blocks):
        np.testing.assert_allclose(o, b, atol=1e-14)
    np.testing.assert_allclose(g.bytes_sent, cost.reduce_scatter_bytes(xs[0].size, n))
    np.testing.assert_allclose(g.bytes_sent, (n - 1) / n * xs[0].size * 1)   # half an all-reduce


def test_reduce_scatter_rejects_uneven_split():
    with pytest.raises(ValueError, match="multiple of 4"):
        SimGroup(4).reduce_scatter(_xs(4, (6, 2)))


def test_all_gather_concatenates_in_rank_order():
    n = 3
    xs = _xs(n, (2, 5))
    g = SimGroup(n, e=2)
    out = g.all_gather(xs, axis=0)
    for o in out:
        assert np.array_equal(o, np.concatenate(xs))
    # every rank sends its block to the n-1 others along the ring: (n-1)/n of the result
    np.testing.assert_allclose(g.bytes_sent, (n - 1) * xs[0].size * 2)
    np.testing.assert_allclose(g.bytes_sent, cost.all_gather_bytes(n * 10 * 2, n))


def test_reduce_scatter_plus_all_gather_is_an_all_reduce():
    n = 4
    xs = _xs(n, (8, 3))
    g_ar, g_rsag = SimGroup(n), SimGroup(n)
    ar = g_ar.all_reduce(xs)
    rsag = g_rsag.all_gather(g_rsag.reduce_scatter(xs))
    for a, b in zip(ar, rsag):
        assert np.array_equal(a, b)               # same summation order: bit-identical
    assert np.array_equal(g_ar.bytes_sent, g_rsag.bytes_sent)
    assert [r.op for r in g_rsag.history] == ["reduce_scatter", "all_gather"]


def test_all_to_all_is_a_block_transpose_with_off_diagonal_bytes():
    n = 3
    rng = np.random.default_rng(1)
    # blocks[i][j]: rank i -> rank j; sizes differ (like an MoE dispatch)
    blocks = [[rng.standard_normal((i + 2 * j, 4)) for j in range(n)] for i in range(n)]
    g = SimGroup(n, e=2)
    out = g.all_to_all(blocks)
    for i in range(n):
        for j in range(n):
            assert np.array_equal(out[j][i], blocks[i][j])
    expected = [sum(blocks[i][j].size for j in range(n) if j != i) * 2 for i in range(n)]
    assert g.bytes_sent.tolist() == expected
    # transposing twice gives the original blocks back
    back = g.all_to_all(out)
    assert all(np.array_equal(back[i][j], blocks[i][j]) for i in range(n) for j in range(n))


def test_all_to_all_rejects_a_ragged_grid():
    with pytest.raises(ValueError, match="n x n"):
        SimGroup(2).all_to_all([[np.zeros(1), np.zeros(1)], [np.zeros(1)]])


@pytest.mark.parametrize("n", [1, 2, 5])
def test_ring_shift_sends_to_the_next_rank(n):
    xs = [np.full((2, 3), float(r)) for r in range(n)]
    g = SimGroup(n, e=2)
    out = g.ring_shift(xs)
    for r in range(n):
        assert np.all(out[r] == (r - 1) % n)       # rank r received rank r-1's block
    assert g.bytes_sent.tolist() == [6 * 2 * (n > 1)] * n


def test_mismatched_shards_name_the_ranks_and_shapes():
    g = SimGroup(3)
    xs = [np.zeros((4, 2)), np.zeros((4, 2)), np.zeros((5, 2))]
    for op in (g.all_reduce, g.reduce_scatter, g.all_gather, g.ring_shift):
        with pytest.raises(ValueError, match=r"rank 2 has \(5, 2\)"):
            op(xs)
    with pytest.raises(ValueError, match="one array per rank"):
        g.all_reduce(xs[:2])


def test_bad_group_arguments():
    with pytest.raises(ValueError):
        SimGroup(0)
    with pytest.raises(ValueError):
        SimGroup(2, e=0)


def test_ledger_accumulates_and_resets():
    g = SimGroup(2, e=4)
    g.all_reduce(_xs(2, (4,)))
    g.ring_shift(_xs(2, (4,)))
    assert g.bytes_sent.tolist() == [4 * 4 + 16, 4 * 4 + 16]
    assert len(g.history) == 2
    g.reset()
    assert g.bytes_sent.tolist() == [0, 0] and g.history == []


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
def test_shard_and_gather_sequence_round_trip(layout):
    x = np.random.default_rng(0).standard_normal((16, 2, 3))
    shards, pos = shard_sequence(x, layout, SimGroup(4))
    assert all(s.shape == (4, 2, 3) for s in shards)
    assert sorted(np.concatenate(pos).tolist()) == list(range(16))
    assert np.array_equal(gather_sequence(shards, pos), x)


def test_zigzag_needs_a_multiple_of_2n():
    with pytest.raises(ValueError, match="multiple of 8"):
        shard_sequence(np.zeros((12, 1, 1)), "zigzag", 4)     # 12 % 4 == 0 but 12 % 8 != 0


def test_gather_sequence_rejects_inconsistent_positions():
    with pytest.raises(ValueError, match="exactly once"):
        gather_sequence([np.zeros(2), np.zeros(2)], [np.array([0, 1]), np.array([1, 2])])


def test_axis_range_edges():
    xs = _xs(2, (2, 4))
    g = SimGroup(2)
    # axis -ndim is axis 0 (valid); ndim and -ndim - 1 are out of range
    assert np.array_equal(g.all_gather(xs, axis=-2)[0], np.concatenate(xs, axis=0))
    assert np.array_equal(g.reduce_scatter(xs, axis=1)[1], sum(xs)[:, 2:])
    for bad in (2, -3):
        with pytest.raises(ValueError, match="out of range"):
            g.all_gather(xs, axis=bad)
        with pytest.raises(ValueError, match="out of range"):
            g.reduce_scatter(xs, axis=bad)


def test_gather_sequence_rejects_a_position_past_the_end():
    # 4 tokens: ids must be 0..3; id 4 would index past the end
    with pytest.raises(ValueError, match="exactly once"):
        gather_sequence([np.zeros(2), np.zeros(2)], [np.array([0, 1]), np.array([2, 4])])


# --------------------------------------------------------------------------- bad input
# (each case was found misbehaving before its validation was added)
def _bad_qkv(s=4, a=2, d=3, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((s, a, d)) for _ in range(3))


def test_simgroup_and_shards_reject_garbage():
    with pytest.raises(ValueError, match="bytes per element"):
        sim.SimGroup(2, e="2")
    g = sim.SimGroup(2)
    with pytest.raises(ValueError, match="real numbers"):
        g.all_reduce([None, None])
    with pytest.raises(ValueError, match="ragged"):
        g.all_reduce([[1, [2]], [1, [2]]])
    with pytest.raises(ValueError, match="axis must be an integer"):
        g.reduce_scatter([np.ones((4, 2))] * 2, axis=1.0)
    with pytest.raises(ValueError, match="axis must be an integer"):
        g.all_gather([np.ones((4, 2))] * 2, axis=None)
    with pytest.raises(ValueError, match="real numbers"):
        g.all_to_all([[None, None], [None, None]])    # used to ship object arrays
    with pytest.raises(ValueError, match="list of shards"):
        sim.gather_sequence(None, None)


def test_group_must_be_a_simgroup():
    q, k, v = _bad_qkv(s=8, a=2)
    qs, pos = sim.shard_sequence(q, "contiguous", 2)
    for call in (lambda: sim.ring_attention(qs, qs, qs, pos, group=2),
                 lambda: sim.ulysses_attention(qs, qs, qs, pos, group=2),
                 lambda: sim.seq_to_heads(qs, 2),
                 lambda: sim.sp_forward([np.ones((4, 2))] * 2, np.tanh, 2),
                 lambda: sim.moe_layer([np.ones((2, 3))] * 2, np.ones((3, 2)),
                                       [lambda z: z] * 2, 1, group=2)):
        with pytest.raises(ValueError, match="group must be a SimGroup"):
            call()


# --------------------------------------------------------------------------- properties (hypothesis)

@FAST
@given(st.integers(1, 5), st.integers(1, 4), st.integers(0, 999))
def test_rs_plus_ag_equals_all_reduce(n, rows, seed):
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((n * rows, 3)) for _ in range(n)]
    g1, g2 = SimGroup(n), SimGroup(n)
    a = g1.all_reduce(xs)
    b = g2.all_gather(g2.reduce_scatter(xs))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    np.testing.assert_allclose(g1.bytes_sent, g2.bytes_sent)
