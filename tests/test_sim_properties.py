"""Property tests (hypothesis): random ranks, lengths, heads, layouts, block orders, routings."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lesson10 import cost
from lesson10.layouts import causal_work, shard_positions
from lesson10.sim import (SimGroup, attention, keep_within_capacity, merge, moe_layer, moe_reference,
                          ring_attention, route_topk, seq_to_heads, heads_to_seq,
                          simulate_moe, ulysses_attention, init_experts)

FAST = settings(max_examples=50, deadline=None)
LAYOUTS = st.sampled_from(["contiguous", "zigzag", "striped"])


@st.composite
def attention_case(draw, need_kv_split=False):
    n = draw(st.integers(1, 5))
    layout = draw(LAYOUTS)
    unit = 2 * n if layout == "zigzag" else n
    s = unit * draw(st.integers(1, 3))
    a_kv = draw(st.sampled_from([n, 2 * n]) if need_kv_split else st.integers(1, 3))
    g = draw(st.integers(1, 3))
    d = draw(st.integers(1, 4))
    causal = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((s, a_kv * g, d))
    k = rng.standard_normal((s, a_kv, d))
    v = rng.standard_normal((s, a_kv, d))
    return n, layout, causal, q, k, v


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


@FAST
@given(st.integers(1, 40), st.integers(1, 8), st.data())
def test_routing_and_capacity(T, E, data):
    k = data.draw(st.integers(1, E))
    C = data.draw(st.integers(0, T * k))
    logits = np.random.default_rng(data.draw(st.integers(0, 999))).standard_normal((T, E))
    experts, gates = route_topk(logits, k)
    # distinct, best first, gates a distribution
    assert all(len(set(row)) == k for row in experts.tolist())
    chosen = np.take_along_axis(logits, experts, axis=1)
    assert np.all(np.diff(chosen, axis=1) <= 0)
    np.testing.assert_allclose(gates.sum(axis=1), 1.0)
    keep = keep_within_capacity(experts, E, C)
    used = [0] * E
    for t in range(T):
        for j in range(k):
            want = used[experts[t, j]] < C
            used[experts[t, j]] += want
            assert keep[t, j] == want


@FAST
@given(st.sampled_from([1, 2, 4]), st.integers(1, 6), st.integers(1, 3),
       st.sampled_from([None, 0.5, 1.0, 2.0]), st.integers(0, 999))
def test_moe_layer_equals_reference(n, T, k, cf, seed):
    E, h = 4, 3
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((T, h)) for _ in range(n)]
    router_w = rng.standard_normal((h, E)) * 2
    experts = init_experts(E, h, 5, seed=seed)
    ys = moe_layer(xs, router_w, experts, k, capacity_factor=cf)
    ref = moe_reference(np.concatenate(xs), router_w, experts, k, capacity_factor=cf)
    np.testing.assert_allclose(np.concatenate(ys), ref, rtol=0, atol=1e-12)


@FAST
@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 200), st.data())
def test_simulate_moe_bookkeeping(Ne, experts_per_gpu, tokens_per_gpu, data):
    E = Ne * experts_per_gpu
    k = data.draw(st.integers(1, E))
    cf = data.draw(st.sampled_from([None, 0.25, 1.0, 1.5]))
    skew = data.draw(st.sampled_from([0.0, 0.5, 3.0]))
    T = Ne * tokens_per_gpu
    stats = simulate_moe(T, E, k, Ne, capacity_factor=cf, skew=skew, seed=data.draw(st.integers(0, 99)), h=8)
    kept = stats.load_per_expert.sum()
    assert kept + stats.dropped == k * T and 0 <= stats.drop_rate <= 1
    if cf is None:
        assert stats.dropped == 0
    else:
        assert stats.load_per_expert.max() <= stats.capacity
        if stats.dropped:                           # copies are dropped only by a full expert
            assert stats.load_per_expert.max() == stats.capacity
    assert stats.traffic.sum(axis=1).max() <= k * tokens_per_gpu
    assert np.array_equal(stats.traffic.sum(axis=0), stats.load_per_gpu)
    assert stats.max_load == stats.load_per_gpu.max()
    assert abs(stats.mean_load - kept / Ne) < 1e-9
