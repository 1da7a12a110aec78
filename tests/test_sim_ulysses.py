"""Ulysses: all-to-all resharding, exact attention, bytes, and the head-count limit."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sim_strategies import FAST, attention_case

from lesson10 import cost, sim
from lesson10.layouts import shard_positions
from lesson10.sim import (
    SimGroup,
    attention,
    heads_to_seq,
    kv_replication,
    ring_attention,
    seq_to_heads,
    ulysses_attention,
)


def _qkv(s, a, a_kv, d, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((s, a, d)), rng.standard_normal((s, a_kv, d)),
            rng.standard_normal((s, a_kv, d)))


def _shards(q, k, v, n, layout):
    pos = shard_positions(q.shape[0], n, layout)
    return [q[p] for p in pos], [k[p] for p in pos], [v[p] for p in pos], pos


def test_seq_to_heads_is_a_block_transpose():
    n, c, a, d = 4, 2, 8, 3
    x = np.random.default_rng(0).standard_normal((n * c, a, d))
    shards = [x[r * c:(r + 1) * c] for r in range(n)]
    group = SimGroup(n, e=2)
    heads = seq_to_heads(shards, group)
    for j in range(n):
        assert np.array_equal(heads[j], x[:, j * a // n:(j + 1) * a // n])   # all tokens, head group j
    # each rank keeps 1 of N_c blocks and sends the other N_c - 1
    np.testing.assert_allclose(group.bytes_sent, (n - 1) / n * c * a * d * 2)
    back = heads_to_seq(heads, group)
    assert all(np.array_equal(b, s) for b, s in zip(back, shards))      # exact round trip
    np.testing.assert_allclose(group.bytes_sent, 2 * (n - 1) / n * c * a * d * 2)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n,a,a_kv", [(1, 2, 1), (2, 4, 2), (4, 8, 4), (4, 8, 8), (2, 6, 2)])
def test_ulysses_equals_full_attention(layout, causal, n, a, a_kv):
    q, k, v = _qkv(16, a, a_kv, 3, seed=n + a)
    ref = attention(q, k, v, causal=causal)[0]
    qs, ks, vs, pos = _shards(q, k, v, n, layout)
    out = ulysses_attention(qs, ks, vs, pos, causal=causal)
    for o, p in zip(out, pos):
        assert o.shape == (16 // n, a, 3)
        np.testing.assert_allclose(o, ref[p], rtol=0, atol=1e-12)


@pytest.mark.parametrize("a,a_kv", [(8, 8), (8, 4), (16, 4)])
def test_bytes_equal_the_lesson_formula(a, a_kv):
    n, s, d, e = 4, 32, 4, 2
    q, k, v = _qkv(s, a, a_kv, d)
    group = SimGroup(n, e=e)
    ulysses_attention(*_shards(q, k, v, n, "contiguous"), group=group)
    g = a // a_kv
    np.testing.assert_allclose(group.bytes_sent, cost.comm_bytes("ulysses", s, a * d, n, g=g, e=e))
    # the lesson's derivation: Q and the output (s/N_c tokens, h = a d columns) and K, V
    # (h/g columns), each all-to-all sending (N_c - 1)/N_c of it
    c, h = s // n, a * d
    np.testing.assert_allclose(group.bytes_sent, (n - 1) / n * (2 * c * h + 2 * c * h / g) * e)
    assert [r.op for r in group.history] == ["all_to_all"] * 4


def test_ulysses_sends_nc_over_2_times_fewer_bytes_than_ring():
    """Multi-head attention: ring / Ulysses bytes = N_c / 2 (lesson, worked example (d))."""
    n, s, a, d = 8, 64, 8, 2
    q, k, v = _qkv(s, a, a, d)
    g_ring, g_uly = SimGroup(n), SimGroup(n)
    ring_attention(*_shards(q, k, v, n, "zigzag"), group=g_ring)
    ulysses_attention(*_shards(q, k, v, n, "zigzag"), group=g_uly)
    np.testing.assert_allclose(g_ring.bytes_sent / g_uly.bytes_sent, n / 2)


def test_more_ranks_than_kv_heads_names_the_limit_and_the_ways_out():
    """Check yourself 5: 32 query heads, 8 K/V heads; Ulysses over 16 ranks fails."""
    q, k, v = _qkv(32, 32, 8, 1)
    qs, ks, vs, pos = _shards(q, k, v, 16, "contiguous")
    with pytest.raises(ValueError) as err:
        ulysses_attention(qs, ks, vs, pos)
    msg = str(err.value)
    assert "n_kv = 8" in msg and "N_c = 16" in msg
    assert "ring attention" in msg and "replicate_kv=True" in msg
    # degree 8 works without copies
    ulysses_attention(*_shards(q, k, v, 8, "contiguous"))


@pytest.mark.parametrize("n,a,a_kv", [(4, 8, 2), (4, 4, 1), (4, 12, 6), (8, 8, 1)])
def test_replicate_kv_is_exact_and_its_copies_are_counted(n, a, a_kv):
    s, d, e = 16, 2, 2
    q, k, v = _qkv(s, a, a_kv, d, seed=a_kv)
    qs, ks, vs, pos = _shards(q, k, v, n, "zigzag")
    group = SimGroup(n, e=e)
    out = ulysses_attention(qs, ks, vs, pos, group=group, replicate_kv=True)
    ref = attention(q, k, v, causal=True)[0]
    for o, p in zip(out, pos):
        np.testing.assert_allclose(o, ref[p], atol=1e-12)
    rep = kv_replication(a, a_kv, n)
    assert (a_kv * rep) % n == 0 and (a // a_kv) % rep == 0
    g_eff = a // (a_kv * rep)                       # K/V now have a_kv * rep heads
    np.testing.assert_allclose(group.bytes_sent, cost.comm_bytes("ulysses", s, a * d, n, g=g_eff, e=e))
    assert group.bytes_sent[0] > cost.comm_bytes("ulysses", s, a * d, n, g=a // a_kv, e=e)


def test_heads_not_divisible_by_nc():
    q, k, v = _qkv(12, 6, 6, 1)
    with pytest.raises(ValueError, match="multiple of N_c"):
        ulysses_attention(*_shards(q, k, v, 4, "contiguous"))
    with pytest.raises(ValueError, match="multiple of N_c"):
        seq_to_heads([q[:3]] * 4)
    with pytest.raises(ValueError, match="rank 1"):
        seq_to_heads([q[:3], q[:2]])


# --------------------------------------------------------------------------- bad input
# (each case was found misbehaving before its validation was added)
def _bad_qkv(s=4, a=2, d=3, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((s, a, d)) for _ in range(3))


def test_ulysses_helpers_reject_bad_heads():
    with pytest.raises(ValueError, match="a_kv must be an integer >= 1"):
        sim.kv_replication(4, 0, 2)
    with pytest.raises(ValueError, match="not a multiple"):
        sim.kv_replication(6, 4, 2)                     # used to answer 1
    with pytest.raises(ValueError, match="tokens, heads"):
        sim.heads_to_seq([np.float64(1.0)] * 2)
    # the guide's example: more ranks than K/V heads names the limit and ring attention
    q, k, _ = _bad_qkv(s=8, a=4)
    kv = k[:, :2]
    with pytest.raises(ValueError, match="N_c <= n_kv.*ring attention"):
        sim.ulysses_attention(*(sim.shard_sequence(t, "contiguous", 4)[0] for t in (q, kv, kv)), "contiguous")


# --------------------------------------------------------------------------- properties (hypothesis)

@FAST
@given(attention_case(need_kv_split=True))
def test_ulysses_attention_is_exact(case):
    n, layout, causal, q, k, v = case
    pos = shard_positions(q.shape[0], n, layout)
    group = SimGroup(n)
    out = ulysses_attention([q[p] for p in pos], [k[p] for p in pos], [v[p] for p in pos], pos,
                            causal=causal, group=group)
    ref = attention(q, k, v, causal=causal)[0]
    for o, p in zip(out, pos):
        np.testing.assert_allclose(o, ref[p], rtol=0, atol=1e-12)
    g = q.shape[1] // k.shape[1]
    np.testing.assert_allclose(group.bytes_sent,
                               cost.comm_bytes("ulysses", q.shape[0], q.shape[1] * q.shape[2], n, g=g))


@FAST
@given(st.integers(1, 5), st.integers(1, 3), st.integers(1, 3), st.integers(0, 999))
def test_seq_heads_round_trip(n, c, heads_per_rank, seed):
    rng = np.random.default_rng(seed)
    shards = [rng.standard_normal((c, n * heads_per_rank, 2)) for _ in range(n)]
    group = SimGroup(n)
    back = heads_to_seq(seq_to_heads(shards, group), group)
    assert all(np.array_equal(b, x) for b, x in zip(back, shards))
