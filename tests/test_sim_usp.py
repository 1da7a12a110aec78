"""USP: Ulysses inside groups of consecutive ranks, ring attention across them."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lesson10 import cost
from lesson10.layouts import shard_positions
from lesson10.sim import SimGroup, attention, ring_attention, ulysses_attention, usp_attention, usp_groups

LAYOUTS = ["contiguous", "zigzag", "striped"]


def _qkv(s, a, a_kv, d, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((s, a, d)), rng.standard_normal((s, a_kv, d)),
            rng.standard_normal((s, a_kv, d)))


def _args(q, k, v, pos):
    return [q[p] for p in pos], [k[p] for p in pos], [v[p] for p in pos], pos


def _check(out, ref, pos):
    for o, p in zip(out, pos):
        assert o.shape == (len(p),) + ref.shape[1:]
        np.testing.assert_allclose(o, ref[p], rtol=0, atol=1e-12)


@pytest.mark.parametrize("n,u", [(2, 1), (2, 2), (4, 2), (6, 2), (6, 3), (8, 2), (8, 4)])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [True, False])
def test_usp_equals_full_attention(n, u, layout, causal):
    a_kv = 12 if u == 3 else 4                       # u must divide a_kv
    q, k, v = _qkv(4 * n, 2 * a_kv, a_kv, 2, seed=n * u)
    ref = attention(q, k, v, causal=causal)[0]
    pos = shard_positions(4 * n, n, layout)
    _check(usp_attention(*_args(q, k, v, pos), u, causal=causal), ref, pos)


def test_usp_is_exact_for_any_assignment_of_tokens():
    n, u, s = 4, 2, 16
    q, k, v = _qkv(s, 4, 2, 3)
    perm = np.random.default_rng(1).permutation(s)
    pos = [perm[r::n] for r in range(n)]               # scrambled, not a named layout
    _check(usp_attention(*_args(q, k, v, pos), u), attention(q, k, v, causal=True)[0], pos)


@pytest.mark.parametrize("lengths", [[7, 1, 8], [1] * 16, [2, 3, 5, 6]])
def test_usp_with_document_masks(lengths):
    n, u, s = 4, 2, 16
    doc = np.repeat(np.arange(len(lengths)), lengths)
    q, k, v = _qkv(s, 4, 2, 2, seed=len(lengths))
    pos = shard_positions(s, n, "zigzag")
    ref = attention(q, k, v, causal=True, doc_ids=doc)[0]
    out = usp_attention(*_args(q, k, v, pos), u, doc_ids=doc)
    _check(out, ref, pos)
    # the mask changes the answer (so the doc_ids really reached the attention)
    assert max(np.abs(o - r).max() for o, r in
               zip(out, usp_attention(*_args(q, k, v, pos), u))) > 1e-3


@pytest.mark.parametrize("n,u", [(2, 1), (2, 2), (4, 1), (4, 2), (4, 4), (8, 2), (8, 4), (6, 3)])
@pytest.mark.parametrize("g", [1, 2])
def test_usp_bytes_equal_the_formula(n, u, g):
    a_kv, d, e = 12, 2, 2
    a, s = a_kv * g, 4 * n
    q, k, v = _qkv(s, a, a_kv, d)
    group = SimGroup(n, e=e)
    usp_attention(*_args(q, k, v, shard_positions(s, n, "contiguous")), u, group=group)
    h, r, c = a * d, n // u, s // n
    expect = cost.usp_bytes(s, h, u, r, g=g, e=e)
    np.testing.assert_allclose(group.bytes_sent, expect, rtol=1e-15)
    by_hand = (u - 1) / u * (2 + 2 / g) * c * h * e + (r - 1) * 2 * (s / r) * h * e / (g * u)
    np.testing.assert_allclose(group.bytes_sent, by_hand, rtol=1e-15)
    ops = [rec.op for rec in group.history]
    assert ops.count("all_to_all") == 4 * r                           # Q, K, V, out per group
    assert ops.count("ring_shift") == 2 * (r - 1) * u                # K and V, per ring


@pytest.mark.parametrize("n", [2, 4, 8])
def test_usp_ends_are_ulysses_and_the_ring(n):
    s, a, a_kv, d = 4 * n, 8, 8, 2
    q, k, v = _qkv(s, a, a_kv, d)
    pos = shard_positions(s, n, "zigzag")
    ref = attention(q, k, v, causal=True)[0]
    for u, method, other in ((n, "ulysses", ulysses_attention), (1, "ring", ring_attention)):
        g_usp, g_other = SimGroup(n), SimGroup(n)
        out = usp_attention(*_args(q, k, v, pos), u, group=g_usp)
        _check(out, ref, pos)
        other(*_args(q, k, v, pos), group=g_other)
        np.testing.assert_allclose(g_usp.bytes_sent, g_other.bytes_sent, rtol=1e-15)
        np.testing.assert_allclose(g_usp.bytes_sent, cost.comm_bytes(method, s, a * d, n),
                                   rtol=1e-15)


def test_usp_goes_beyond_the_ulysses_head_limit():
    """32 query heads, 8 K/V heads, 16 ranks: Ulysses alone fails, USP with u = 8 works."""
    n, s = 16, 32
    q, k, v = _qkv(s, 32, 8, 1)
    pos = shard_positions(s, n, "zigzag")
    with pytest.raises(ValueError, match="usp_attention"):
        ulysses_attention(*_args(q, k, v, pos))
    _check(usp_attention(*_args(q, k, v, pos), 8), attention(q, k, v, causal=True)[0], pos)
    with pytest.raises(ValueError) as err:
        usp_attention(*_args(q, k, v, pos), 16)
    msg = str(err.value)
    assert "ulysses_size = 16" in msg and "n_kv = 8" in msg and "ring" in msg


def test_usp_bad_sizes():
    q, k, v = _qkv(12, 4, 4, 1)
    pos = shard_positions(12, 6, "contiguous")
    with pytest.raises(ValueError, match="divides N"):
        usp_attention(*_args(q, k, v, pos), 4)          # 6 ranks, groups of 4
    for bad in (0, 2.0, True, None):
        with pytest.raises(ValueError, match="ulysses_size"):
            usp_attention(*_args(q, k, v, pos), bad)
    with pytest.raises(ValueError, match="ulysses_size"):
        cost.usp_bytes(12, 4, 0, 6)
    with pytest.raises(ValueError, match="ulysses_size \\* ring_size"):
        cost.usp_bytes(10, 4, 2, 3)


def test_usp_groups_and_subgroup_ledger():
    assert usp_groups(2, 6) == ([[0, 1], [2, 3], [4, 5]], [[0, 2, 4], [1, 3, 5]])
    assert usp_groups(3, SimGroup(6)) == ([[0, 1, 2], [3, 4, 5]], [[0, 3], [1, 4], [2, 5]])
    with pytest.raises(ValueError, match="SimGroup or a number"):
        usp_groups(2, "six")
    parent = SimGroup(6, e=1)
    sub = parent.subgroup([1, 3, 5])
    sub.ring_shift([np.zeros(4)] * 3)
    assert parent.bytes_sent.tolist() == [0, 4, 0, 4, 0, 4]
    assert sub.bytes_sent.tolist() == [4, 4, 4]
    with pytest.raises(ValueError, match="distinct"):
        parent.subgroup([1, 1])
    with pytest.raises(ValueError, match="distinct"):
        parent.subgroup([6])


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([(1, 1), (2, 1), (2, 2), (4, 2), (4, 4), (6, 2), (6, 3)]),
       st.sampled_from(LAYOUTS), st.booleans(), st.booleans(), st.integers(0, 2**16))
def test_usp_random_cases(nu, layout, causal, docs, seed):
    n, u = nu
    rng = np.random.default_rng(seed)
    s = 2 * n * int(rng.integers(1, 3))
    a_kv = u * int(rng.integers(1, 3))
    g = int(rng.integers(1, 3))
    q, k, v = _qkv(s, a_kv * g, a_kv, 2, seed=seed)
    doc = np.cumsum(rng.random(s) < 0.3) if docs else None
    pos = shard_positions(s, n, layout)
    group = SimGroup(n)
    out = usp_attention(*_args(q, k, v, pos), u, causal=causal, doc_ids=doc, group=group)
    _check(out, attention(q, k, v, causal=causal, doc_ids=doc)[0], pos)
    np.testing.assert_allclose(group.bytes_sent,
                               cost.usp_bytes(s, a_kv * g * 2, u, n // u, g=g), rtol=1e-14)
