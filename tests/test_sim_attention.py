"""Reference attention with lse, and the logsumexp merge, against a plain loop."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sim_strategies import FAST

from lesson10 import sim
from lesson10.sim import attention, merge


def naive_attention(q, k, v, causal=False, q_pos=None, k_pos=None):
    """One query, one head at a time, straight from the definition."""
    s_q, a, d = q.shape
    s_k, a_kv, _ = k.shape
    g = a // a_kv
    q_pos = np.arange(s_q) if q_pos is None else q_pos
    k_pos = np.arange(s_k) if k_pos is None else k_pos
    out = np.zeros((s_q, a, v.shape[2]))
    lse = np.full((s_q, a), -np.inf)
    for i in range(s_q):
        for hd in range(a):
            keys = [j for j in range(s_k) if not causal or k_pos[j] <= q_pos[i]]
            if not keys:
                continue
            x = np.array([q[i, hd] @ k[j, hd // g] / np.sqrt(d) for j in keys])
            w = np.exp(x - x.max())
            out[i, hd] = sum(wj * v[j, hd // g] for wj, j in zip(w, keys)) / w.sum()
            lse[i, hd] = x.max() + np.log(w.sum())
    return out, lse


def _qkv(s_q, s_k, a, a_kv, d, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((s_q, a, d)), rng.standard_normal((s_k, a_kv, d)),
            rng.standard_normal((s_k, a_kv, d)))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("a,a_kv", [(2, 2), (4, 2), (4, 1)])
def test_attention_matches_the_definition(causal, a, a_kv):
    q, k, v = _qkv(6, 6, a, a_kv, 3)
    out, lse = attention(q, k, v, causal=causal)
    ref_out, ref_lse = naive_attention(q, k, v, causal=causal)
    assert out.shape == (6, a, 3) and lse.shape == (6, a)
    np.testing.assert_allclose(out, ref_out, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-12)


def test_gqa_equals_attention_with_repeated_kv_heads():
    q, k, v = _qkv(5, 7, 6, 2, 4, seed=1)
    out, lse = attention(q, k, v)
    out_rep, lse_rep = attention(q, np.repeat(k, 3, axis=1), np.repeat(v, 3, axis=1))
    np.testing.assert_allclose(out, out_rep, atol=1e-13)
    np.testing.assert_allclose(lse, lse_rep, atol=1e-13)


def test_positions_make_any_token_order_exact():
    q, k, v = _qkv(8, 8, 2, 2, 3, seed=2)
    full, full_lse = attention(q, k, v, causal=True)
    perm = np.random.default_rng(3).permutation(8)
    out, lse = attention(q[perm], k[perm], v[perm], causal=True, q_pos=perm, k_pos=perm)
    np.testing.assert_allclose(out, full[perm], atol=1e-13)
    np.testing.assert_allclose(lse, full_lse[perm], atol=1e-13)


def test_query_that_sees_no_key_gives_zero_and_minus_inf_without_warnings():
    q, k, v = _qkv(3, 4, 2, 2, 3, seed=4)
    with np.errstate(all="raise"):                 # any floating-point warning would raise
        out, lse = attention(q, k, v, causal=True, q_pos=np.array([0, 5, 9]),
                             k_pos=np.array([6, 7, 8, 9]))
    assert np.all(out[:2] == 0) and np.all(np.isneginf(lse[:2]))
    assert np.all(np.isfinite(lse[2])) and not np.isnan(out).any()
    # no keys at all
    with np.errstate(all="raise"):
        out, lse = attention(q, k[:0], v[:0])
    assert out.shape == (3, 2, 3) and np.all(out == 0) and np.all(np.isneginf(lse))


@pytest.mark.parametrize("causal", [False, True])
def test_merge_of_two_key_sets_is_exact_and_commutative(causal):
    q, k, v = _qkv(6, 10, 2, 2, 3, seed=5)
    pos = np.arange(10)
    full, full_lse = attention(q, k, v, causal=causal, q_pos=np.arange(6) + 2, k_pos=pos)
    A = np.array([0, 3, 4, 8])
    B = np.setdiff1d(pos, A)
    oa, la = attention(q, k[A], v[A], causal=causal, q_pos=np.arange(6) + 2, k_pos=A)
    ob, lb = attention(q, k[B], v[B], causal=causal, q_pos=np.arange(6) + 2, k_pos=B)
    for o, l in (merge(oa, la, ob, lb), merge(ob, lb, oa, la)):
        np.testing.assert_allclose(o, full, atol=1e-13)
        np.testing.assert_allclose(l, full_lse, atol=1e-13)


def test_merge_with_empty_blocks_is_nan_free():
    rng = np.random.default_rng(6)
    o = rng.standard_normal((3, 2, 4))
    lse = rng.standard_normal((3, 2))
    empty_o, empty_lse = np.zeros_like(o), np.full_like(lse, -np.inf)
    with np.errstate(all="raise"):
        m1 = merge(o, lse, empty_o, empty_lse)           # one side saw nothing
        m2 = merge(empty_o, empty_lse, o, lse)
        m3 = merge(empty_o, empty_lse, empty_o, empty_lse)   # both saw nothing
    for mo, ml in (m1, m2):
        np.testing.assert_allclose(mo, o, atol=1e-15)
        np.testing.assert_allclose(ml, lse, atol=1e-15)
    assert np.all(m3[0] == 0) and np.all(np.isneginf(m3[1]))


def test_merge_does_not_overflow_for_large_scores():
    o1, o2 = np.ones((1, 1, 2)), 3 * np.ones((1, 1, 2))
    lse1, lse2 = np.array([[1000.0]]), np.array([[1000.0 + np.log(3.0)]])
    with np.errstate(all="raise"):
        o, lse = merge(o1, lse1, o2, lse2)
    np.testing.assert_allclose(o, 0.25 * 1 + 0.75 * 3)      # weights 1 : 3
    np.testing.assert_allclose(lse, 1000.0 + np.log(4.0))


def test_attention_rejects_bad_head_counts_and_shapes():
    q, k, v = _qkv(4, 4, 3, 2, 2)
    with pytest.raises(ValueError, match="multiple"):
        attention(q, k, v)
    q, k, v = _qkv(4, 4, 2, 2, 2)
    with pytest.raises(ValueError):
        attention(q, k[:, :, :1], v)
    with pytest.raises(ValueError, match="q_pos"):
        attention(q, k, v, causal=True, q_pos=np.arange(3))
    with pytest.raises(ValueError):
        merge(np.zeros((2, 1, 1)), np.zeros((2, 1)), np.zeros((3, 1, 1)), np.zeros((3, 1)))


# --------------------------------------------------------------------------- bad input
# (each case was found misbehaving before its validation was added)
def _bad_qkv(s=4, a=2, d=3, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((s, a, d)) for _ in range(3))


def test_sim_attention_rejects_complex_nan_and_empty_head_dim():
    q, k, v = _bad_qkv()
    with pytest.raises(ValueError, match="q must hold real numbers"):
        sim.attention(q + 1j, k, v)                    # used to drop the imaginary part
    with pytest.raises(ValueError, match="k contains NaN or inf"):
        sim.attention(q, np.where(k > 1, np.inf, k), v)
    with pytest.raises(ValueError, match="head dim d is 0"):
        sim.attention(q[..., :0], k[..., :0], v)       # used to return NaN
    # empty sequences are fine: nothing to attend to is (out 0, lse -inf)
    out, lse = sim.attention(q, k[:0], v[:0], causal=True)
    assert np.all(out == 0) and np.all(lse == -np.inf)


def test_sim_attention_positions_must_be_integer_ids():
    q, k, v = _bad_qkv()
    pos = np.array([0.0, 1.0, np.nan, 3.0])            # NaN made every key visible
    with pytest.raises(ValueError, match="integer token ids"):
        sim.attention(q, k, v, causal=True, q_pos=pos)
    with pytest.raises(ValueError, match="integer token ids"):
        sim.attention(q, k, v, causal=True, q_pos=["a", "b", "c", "d"])


def test_sim_merge_rejects_nan_and_plus_inf_lse():
    q, k, v = _bad_qkv()
    o, lse = sim.attention(q, k, v)
    for bad in (np.nan, np.inf):
        with pytest.raises(ValueError, match="NaN and \\+inf are not a logsumexp"):
            sim.merge(o, np.full_like(lse, bad), o, lse)
    with pytest.raises(ValueError, match="same shapes"):
        sim.merge(1.0, 2.0, 1.0, 2.0)                  # scalars used to "merge"
    o2, lse2 = sim.merge(o, np.full_like(lse, -np.inf), o, lse)   # -inf stays neutral
    np.testing.assert_allclose(o2, o, atol=1e-15)


# --------------------------------------------------------------------------- properties (hypothesis)

@FAST
@given(st.integers(1, 12), st.integers(1, 4), st.booleans(), st.data())
def test_merge_in_any_block_order_is_exact(s_k, n_blocks, causal, data):
    """Split the keys into random blocks (some may be empty or fully masked), merge them in a
    random order: the result is full attention."""
    seed = data.draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((4, 2, 3))
    k = rng.standard_normal((s_k, 1, 3))
    v = rng.standard_normal((s_k, 1, 3))
    q_pos = rng.integers(0, s_k, size=4)
    k_pos = np.arange(s_k)
    labels = data.draw(st.lists(st.integers(0, n_blocks - 1), min_size=s_k, max_size=s_k))
    order = data.draw(st.permutations(range(n_blocks)))
    ref, ref_lse = attention(q, k, v, causal=causal, q_pos=q_pos, k_pos=k_pos)
    o, lse = np.zeros((4, 2, 3)), np.full((4, 2), -np.inf)
    with np.errstate(all="raise"):
        for b in order:
            idx = np.nonzero(np.array(labels) == b)[0]
            ob, lb = attention(q, k[idx], v[idx], causal=causal, q_pos=q_pos, k_pos=k_pos[idx])
            o, lse = merge(o, lse, ob, lb)
    np.testing.assert_allclose(o, ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=1e-12)
    assert not np.isnan(o).any()
