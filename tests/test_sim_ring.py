"""Ring attention: exact for every layout, causal or not, GQA; bytes and work per round."""
import numpy as np
import pytest
from hypothesis import given
from sim_strategies import FAST, attention_case

from lesson10 import cost
from lesson10.layouts import causal_work, shard_positions
from lesson10.sim import SimGroup, attention, ring_attention, shard_sequence

LAYOUTS = ["contiguous", "zigzag", "striped"]


def _qkv(s, a, a_kv, d, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((s, a, d)), rng.standard_normal((s, a_kv, d)),
            rng.standard_normal((s, a_kv, d)))


def _run(q, k, v, n, layout, causal=True, group=None, **kw):
    pos = shard_positions(q.shape[0], n, layout)
    return pos, ring_attention([q[p] for p in pos], [k[p] for p in pos], [v[p] for p in pos],
                               pos, causal=causal, group=group, **kw)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_ring_equals_full_attention(layout, causal, n):
    q, k, v = _qkv(16, 4, 2, 3, seed=n)
    ref, ref_lse = attention(q, k, v, causal=causal)
    pos, (out, stats) = _run(q, k, v, n, layout, causal, return_stats=True)
    for r in range(n):
        assert out[r].shape == (16 // n, 4, 3)
        np.testing.assert_allclose(out[r], ref[pos[r]], rtol=0, atol=1e-12)
        np.testing.assert_allclose(stats.lse[r], ref_lse[pos[r]], rtol=0, atol=1e-12)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_work_per_round_matches_layouts_causal_work(layout):
    n, s = 4, 16
    q, k, v = _qkv(s, 2, 2, 2)
    _, (_, stats) = _run(q, k, v, n, layout, return_stats=True)
    assert np.array_equal(stats.work, causal_work(n, layout, s))
    assert stats.work.sum() == s * (s + 1) // 2
    _, (_, full) = _run(q, k, v, n, layout, causal=False, return_stats=True)
    assert np.all(full.work == (s // n) ** 2)       # no mask: every block is full


def test_lesson_example_c_tables():
    """Worked example (c): N_c = 4, s = 8 tokens, causal."""
    q, k, v = _qkv(8, 1, 1, 2)
    _, (_, zz) = _run(q, k, v, 4, "zigzag", return_stats=True)
    assert zz.work.sum(axis=0).tolist() == [9, 9, 9, 9]
    assert zz.work.max(axis=1).tolist() == [3, 2, 2, 2] and zz.ring_time == 9
    _, (_, ct) = _run(q, k, v, 4, "contiguous", return_stats=True)
    assert ct.work.sum(axis=0).tolist() == [3, 7, 11, 15] and ct.ring_time == 15
    # rank 0's query 7 meets K/V {0,7}, then {3,4}, {2,5}, {1,6}
    pos = shard_positions(8, 4, "zigzag")
    assert [sorted(pos[src].tolist()) for src in zz.sources[:, 0]] == [[0, 7], [3, 4], [2, 5], [1, 6]]
    assert all(zz.sources[rnd, r] == (r - rnd) % 4 for rnd in range(4) for r in range(4))


@pytest.mark.parametrize("g", [1, 2, 4])
def test_bytes_equal_the_lesson_formula_and_shrink_with_gqa(g):
    n, s, a, d, e = 4, 32, 4, 8, 2
    q, k, v = _qkv(s, a, a // g, d)
    group = SimGroup(n, e=e)
    _run(q, k, v, n, "zigzag", group=group)
    h = a * d
    np.testing.assert_allclose(group.bytes_sent, cost.comm_bytes("ring", s, h, n, g=g, e=e))
    np.testing.assert_allclose(group.bytes_sent, (n - 1) * 4 * (s // n) * h / g)   # (N_c - 1) 4ch/g
    # the same run with K/V heads expanded to a heads sends g times more
    full = SimGroup(n, e=e)
    _run(q, np.repeat(k, g, axis=1), np.repeat(v, g, axis=1), n, "zigzag", group=full)
    np.testing.assert_allclose(full.bytes_sent, g * group.bytes_sent)


def test_no_shift_after_the_last_round():
    n = 5
    q, k, v = _qkv(10, 1, 1, 2)
    group = SimGroup(n)
    _run(q, k, v, n, "contiguous", group=group)
    assert [r.op for r in group.history] == ["ring_shift"] * (2 * (n - 1))   # K and V, N_c-1 times


def test_single_rank_sends_nothing():
    q, k, v = _qkv(6, 2, 1, 2)
    group = SimGroup(1)
    _, out = _run(q, k, v, 1, "contiguous", group=group)
    np.testing.assert_allclose(out[0], attention(q, k, v, causal=True)[0], atol=1e-13)
    assert group.bytes_sent.tolist() == [0.0]


def test_layout_name_as_positions():
    q, k, v = _qkv(16, 2, 2, 2, seed=3)
    qs, pos = shard_sequence(q, "zigzag", 4)
    out = ring_attention(qs, [k[p] for p in pos], [v[p] for p in pos], "zigzag")
    ref = attention(q, k, v, causal=True)[0]
    for o, p in zip(out, pos):
        np.testing.assert_allclose(o, ref[p], atol=1e-12)


def test_zigzag_rejects_a_sequence_not_divisible_by_2n():
    q, k, v = _qkv(12, 1, 1, 2)
    with pytest.raises(ValueError, match="multiple of 8"):
        shard_sequence(q, "zigzag", 4)
    c = 3                                           # 4 ranks x 3 tokens: 12 = not a multiple of 8
    with pytest.raises(ValueError, match="multiple of 8"):
        ring_attention([q[:c]] * 4, [k[:c]] * 4, [v[:c]] * 4, "zigzag")


def test_bad_shards_and_positions():
    q, k, v = _qkv(8, 2, 2, 2)
    pos = shard_positions(8, 2, "contiguous")
    qs, ks, vs = [q[p] for p in pos], [k[p] for p in pos], [v[p] for p in pos]
    with pytest.raises(ValueError, match="rank 1"):
        ring_attention([qs[0], qs[1][:3]], ks, vs, pos)
    with pytest.raises(ValueError, match="exactly once"):
        ring_attention(qs, ks, vs, [pos[0], pos[0]])
    with pytest.raises(ValueError, match="multiple"):
        ring_attention([x[:, :1] for x in qs], ks, vs, pos)      # 1 query head, 2 K/V heads
    with pytest.raises(ValueError, match="group"):
        ring_attention(qs, ks, vs, pos, group=SimGroup(3))


# --------------------------------------------------------------------------- properties (hypothesis)

@FAST
@given(attention_case())
def test_ring_attention_is_exact(case):
    n, layout, causal, q, k, v = case
    pos = shard_positions(q.shape[0], n, layout)
    group = SimGroup(n)
    out, stats = ring_attention([q[p] for p in pos], [k[p] for p in pos], [v[p] for p in pos], pos,
                                causal=causal, group=group, return_stats=True)
    ref = attention(q, k, v, causal=causal)[0]
    for o, p in zip(out, pos):
        np.testing.assert_allclose(o, ref[p], rtol=0, atol=1e-12)
    if causal:
        assert np.array_equal(stats.work, causal_work(n, layout, q.shape[0]))
    g = q.shape[1] // k.shape[1]
    h = q.shape[1] * q.shape[2]
    np.testing.assert_allclose(group.bytes_sent, cost.comm_bytes("ring", q.shape[0], h, n, g=g, e=2))
