"""MoE: routing, capacity, the expert-parallel layer, the simulator and load balancing."""
import math
from itertools import permutations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sim_strategies import FAST

from lesson10 import cost, sim
from lesson10.sim import (
    SimGroup,
    expert_capacity,
    init_experts,
    keep_within_capacity,
    moe_layer,
    moe_reference,
    route_topk,
    router_probs,
    simulate_moe,
    switch_aux_loss,
    update_expert_bias,
)
from lesson10.sim.moe import sample_topk


# ------------------------------------------------------------------ routing and capacity
def test_route_topk_picks_the_largest_scores_best_first():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((50, 8))
    experts, gates = route_topk(logits, 3)
    for t in range(50):
        assert experts[t].tolist() == sorted(range(8), key=lambda i: -logits[t, i])[:3]
        chosen = logits[t, experts[t]]
        np.testing.assert_allclose(gates[t], np.exp(chosen) / np.exp(chosen).sum())


def test_route_topk_ties_go_to_the_lower_expert():
    experts, gates = route_topk(np.zeros((2, 5)), 2)
    assert experts.tolist() == [[0, 1], [0, 1]]
    np.testing.assert_allclose(gates, 0.5)


def test_bias_changes_the_choice_but_not_the_gates():
    logits = np.array([[2.0, 1.0, 0.0, -1.0]])
    experts, gates = route_topk(logits, 2, bias=np.array([-5.0, 0.0, 0.0, 0.0]))
    assert experts.tolist() == [[1, 2]]
    np.testing.assert_allclose(gates[0], np.exp([1.0, 0.0]) / np.exp([1.0, 0.0]).sum())


def test_k_must_be_between_1_and_E():
    with pytest.raises(ValueError, match="k = 5"):
        route_topk(np.zeros((3, 4)), 5)
    with pytest.raises(ValueError):
        route_topk(np.zeros((3, 4)), 0)
    with pytest.raises(ValueError, match="k = 9"):
        simulate_moe(64, 8, 9, 2)


def test_expert_capacity_is_the_lesson_formula():
    # C = ceil(CF * k * N / E)
    assert expert_capacity(1000, 8, 2, 1.25) == math.ceil(1.25 * 2 * 1000 / 8) == 313
    assert expert_capacity(4096, 64, 2, 1.0) == 128
    assert expert_capacity(100, 10, 1, 1.1) == 11        # not 12 from 1.1 * 100 / 10 = 11.000000000000002
    assert expert_capacity(100, 10, 1, None) is None
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="capacity_factor"):
            expert_capacity(100, 10, 1, bad)


# ------------------------------------------------------------------ the layer
def _problem(n=4, T=12, h=6, E=8, d_ff=5, seed=0, router_scale=1.0):
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((T, h)) for _ in range(n)]
    router_w = rng.standard_normal((h, E)) * router_scale
    return xs, router_w, init_experts(E, h, d_ff, seed=seed + 1)


def _reference_by_loop(x, router_w, experts, k, cf):
    """Token by token, copy by copy, with its own capacity counters."""
    E = router_w.shape[1]
    C = math.inf if cf is None else expert_capacity(len(x), E, k, cf)
    used = [0] * E
    y = np.zeros_like(x)
    for t, row in enumerate(x):
        logits = row @ router_w
        top = sorted(range(E), key=lambda i: -logits[i])[:k]
        gates = np.exp(logits[top] - logits[top].max())
        gates /= gates.sum()
        for gate, i in zip(gates, top):
            if used[i] < C:
                used[i] += 1
                W1, W2 = experts[i]
                y[t] += gate * (np.maximum(row @ W1, 0) @ W2)
    return y


@pytest.mark.parametrize("k,cf", [(1, None), (2, None), (2, 1.0), (2, 0.5), (3, 1.25)])
def test_moe_reference_matches_a_token_loop(k, cf):
    xs, router_w, experts = _problem(seed=k)
    x = np.concatenate(xs)
    np.testing.assert_allclose(moe_reference(x, router_w, experts, k, cf),
                               _reference_by_loop(x, router_w, experts, k, cf), atol=1e-12)


@pytest.mark.parametrize("n", [1, 2, 4, 8])
@pytest.mark.parametrize("k,cf", [(1, None), (2, None), (2, 1.0), (2, 0.5), (4, 1.5)])
def test_moe_layer_equals_the_reference(n, k, cf):
    xs, router_w, experts = _problem(n=n, seed=n + k)
    group = SimGroup(n)
    ys = moe_layer(xs, router_w, experts, k, capacity_factor=cf, group=group)
    ref = moe_reference(np.concatenate(xs), router_w, experts, k, cf)
    np.testing.assert_allclose(np.concatenate(ys), ref, rtol=0, atol=1e-12)


def test_moe_layer_bytes_count_each_remote_copy_twice():
    n, T, h, E, k, e = 4, 16, 6, 8, 2, 2
    xs, router_w, experts = _problem(n=n, T=T, h=h, E=E)
    group = SimGroup(n, e=e)
    moe_layer(xs, router_w, experts, k, group=group)
    expected = np.zeros(n)
    for i, x in enumerate(xs):
        chosen, _ = route_topk(x @ router_w, k)
        for dst_gpu in (chosen // (E // n)).ravel():
            if dst_gpu != i:
                expected[i] += h * e                 # dispatch, sent by the token's GPU
                expected[dst_gpu] += h * e           # combine, sent back by the expert's GPU
    np.testing.assert_allclose(group.bytes_sent, expected)
    assert [r.op for r in group.history] == ["all_to_all", "all_to_all"]


def test_dropped_copies_contribute_nothing():
    xs, router_w, experts = _problem(n=2, T=16, E=4, seed=3)
    ys, stats = moe_layer(xs, router_w, experts, 1, capacity_factor=0.25, group=SimGroup(2),
                          return_stats=True)
    C = expert_capacity(32, 4, 1, 0.25)
    assert stats.capacity == C == 2 and stats.as_dict()["capacity"] == 2
    assert stats.load_per_expert.max() <= C and stats.dropped == 32 - stats.load_per_expert.sum()
    y = np.concatenate(ys)
    chosen, _ = route_topk(np.concatenate(xs) @ router_w, 1)
    keep = keep_within_capacity(chosen, 4, C)          # tested by loop in test_sim_capacity.py
    assert np.all(y[~keep[:, 0]] == 0)               # the token passes only through the residual
    assert np.all(np.abs(y[keep[:, 0]]).sum(axis=1) > 0)


def test_experts_without_tokens_and_callable_experts():
    n, T, h, E = 2, 8, 4, 4
    rng = np.random.default_rng(5)
    xs = [np.hstack([rng.standard_normal((T, h)), np.ones((T, 1))]) for _ in range(n)]
    # the last feature is a constant 1: its router row makes expert 0 win for every token
    router_w = np.vstack([np.zeros((h, E)), [10.0, -10.0, -10.0, -10.0]])
    scales = [1.0, 2.0, 3.0, 4.0]
    experts = [lambda z, s=s: s * np.tanh(z) for s in scales]
    group = SimGroup(n)
    ys = moe_layer(xs, router_w, experts, 1, group=group)
    ref = moe_reference(np.concatenate(xs), router_w, experts, 1)
    np.testing.assert_allclose(np.concatenate(ys), ref, atol=1e-12)
    np.testing.assert_allclose(np.concatenate(ys), np.tanh(np.concatenate(xs)), atol=1e-12)


def test_moe_layer_rejects_bad_input():
    xs, router_w, experts = _problem(n=2)
    with pytest.raises(ValueError, match="rank 1"):
        moe_layer([xs[0], xs[1][:5]], router_w, experts, 2)
    with pytest.raises(ValueError, match="multiple of N_e"):
        moe_layer(xs * 3, router_w, experts, 2)      # 6 ranks, 8 experts
    with pytest.raises(ValueError, match="capacity_factor"):
        moe_layer(xs, router_w, experts, 2, capacity_factor=0)
    with pytest.raises(ValueError, match="k = 9"):
        moe_layer(xs, router_w, experts, 9)


# ------------------------------------------------------------------ the simulator
def test_uniform_bytes_match_the_lesson_formula():
    """Lesson section 5 (d): Ne=8, E=64, k=2, T=4096 per GPU, h=1024: within 1%."""
    Ne, E, k, T, h = 8, 64, 2, 4096, 1024
    st = simulate_moe(T * Ne, E, k, Ne, h=h, e=2)
    formula = cost.moe_a2a_bytes(k, T, h, Ne, e=2)
    assert st.bytes_formula == formula
    assert abs(st.bytes_mean / formula - 1) < 0.01
    assert st.drop_rate == 0.0 and st.dropped == 0
    assert st.load_per_gpu.sum() == k * T * Ne and st.mean_load == k * T


def test_check_yourself_6_bytes():
    """EP over 4 GPUs, T=1024 per GPU, top-1, h=2048, bf16: about 6,291,456 bytes."""
    st = simulate_moe(4 * 1024, 4, 1, 4, h=2048, seed=1)
    assert st.bytes_formula == 6_291_456
    assert abs(st.bytes_mean / 6_291_456 - 1) < 0.02


def test_loads_traffic_and_drops_are_consistent():
    st = simulate_moe(4096, 16, 2, 4, capacity_factor=1.0, skew=1.5, seed=2)
    assert st.capacity == expert_capacity(4096, 16, 2, 1.0) == 512
    assert st.load_per_expert.max() <= st.capacity
    assert st.dropped == 2 * 4096 - st.load_per_expert.sum()
    assert st.drop_rate == st.dropped / (2 * 4096)
    assert st.traffic.sum() == st.load_per_gpu.sum() == st.load_per_expert.sum()
    assert np.array_equal(st.traffic.sum(axis=0), st.load_per_gpu)
    assert st.max_load == st.load_per_gpu.max() and st.mean_load == st.load_per_gpu.mean()
    off = st.traffic - np.diag(np.diag(st.traffic))
    np.testing.assert_allclose(st.bytes_per_gpu, (off.sum(1) + off.sum(0)) * st.h * st.e)


def test_skew_raises_imbalance_and_drops():
    skews = [0.0, 0.5, 1.0, 2.0, 4.0]
    free = [simulate_moe(8192, 32, 2, 8, skew=s, seed=3) for s in skews]
    capped = [simulate_moe(8192, 32, 2, 8, capacity_factor=1.0, skew=s, seed=3) for s in skews]
    imbalance = [st.imbalance for st in free]
    drops = [st.drop_rate for st in capped]
    assert all(a < b for a, b in zip(imbalance, imbalance[1:]))
    assert all(a < b for a, b in zip(drops, drops[1:]))
    assert imbalance[0] < 1.05 and drops[0] < 0.05
    assert all(st.drop_rate == 0 for st in free)


def _plackett_luce(p, k):
    """Exact probability of each ordered choice of k distinct experts."""
    probs = {}
    for seq in permutations(range(len(p)), k):
        pr, left = 1.0, 1.0
        for i in seq:
            pr *= p[i] / left
            left -= p[i]
        probs[seq] = pr
    return probs


@pytest.mark.parametrize("max_rounds", [0, 3])
def test_sampler_draws_the_top_k_of_logits_plus_gumbel_noise(max_rounds):
    logw = np.log(np.array([0.55, 0.25, 0.15, 0.05]))
    T = 100_000
    choices = sample_topk(logw, T, 2, np.random.default_rng(7), max_rounds=max_rounds)
    assert np.all(choices[:, 0] != choices[:, 1])
    exact = _plackett_luce(np.exp(logw), 2)
    for (i, j), pr in exact.items():
        freq = np.mean((choices[:, 0] == i) & (choices[:, 1] == j))
        assert abs(freq - pr) < 5 * np.sqrt(pr * (1 - pr) / T) + 1e-4, (i, j, freq, pr)


def test_sampler_handles_underflowing_weights():
    choices = sample_topk(np.array([0.0, -800.0, -900.0, -1000.0]), 64, 3, np.random.default_rng(0))
    assert np.all(np.sort(choices, axis=1) == [0, 1, 2])
    assert np.all(choices[:, :3] == [0, 1, 2])      # the order of the weights


def test_simulate_moe_rejects_bad_input():
    with pytest.raises(ValueError, match="capacity_factor"):
        simulate_moe(64, 8, 2, 2, capacity_factor=-1)
    with pytest.raises(ValueError, match="multiple of N_e"):
        simulate_moe(64, 6, 2, 4)
    with pytest.raises(ValueError, match="multiple of N_e"):
        simulate_moe(66, 8, 2, 4)


# ------------------------------------------------------------------ balancing
def test_switch_aux_loss_is_alpha_for_uniform_routing_and_grows_with_concentration():
    T, E, k = 64, 8, 2
    uniform_probs = np.full((T, E), 1 / E)
    uniform_experts = (np.arange(T * k) % E).reshape(T, k)
    assert switch_aux_loss(uniform_probs, uniform_experts, alpha=1e-2) == pytest.approx(1e-2, rel=1e-12)
    hot_probs = np.zeros((T, E))
    hot_probs[:, 0] = 1.0
    hot_experts = np.zeros((T, 1), dtype=int)
    assert switch_aux_loss(hot_probs, hot_experts, alpha=1e-2) == pytest.approx(1e-2 * E)
    logits = np.random.default_rng(0).standard_normal((T, E))
    e_, _ = route_topk(logits, k)
    assert switch_aux_loss(router_probs(logits), e_) > 0


def test_update_expert_bias_is_a_sign_update():
    bias = np.array([0.0, 0.5, -0.5, 0.0])
    load = np.array([10, 2, 4, 4])                    # mean 5
    np.testing.assert_array_equal(update_expert_bias(bias, load, 0.1), [-0.1, 0.6, -0.4, 0.1])
    np.testing.assert_array_equal(update_expert_bias(bias, np.full(4, 3), 0.1), bias)


def test_bias_updates_lower_the_max_over_mean_load():
    """DeepSeek-V3 style: the bias enters routing only; the load evens out over iterations."""
    rng = np.random.default_rng(0)
    T, E, k = 4096, 16, 2
    popularity = np.linspace(2.0, -2.0, E)            # some experts much more popular
    logits = rng.standard_normal((T, E)) + popularity
    bias = np.zeros(E)
    ratios = []
    for _ in range(60):
        experts, gates = route_topk(logits, k, bias=bias)
        load = np.bincount(experts.ravel(), minlength=E)
        ratios.append(load.max() / load.mean())
        chosen = np.take_along_axis(logits, experts, axis=1)    # gates: softmax of the logits
        np.testing.assert_allclose(gates, np.exp(chosen) / np.exp(chosen).sum(1, keepdims=True))
        bias = update_expert_bias(bias, load, rate=0.05)
    assert ratios[0] > 2.0
    assert np.mean(ratios[-10:]) < 1.2 < ratios[0]
    # the same loop on the simulator, per GPU
    bias = np.zeros(E)
    sims = []
    for _ in range(40):
        st = simulate_moe(T, E, k, 4, skew=1.0, seed=1, bias=bias, popularity=popularity)
        sims.append(st.imbalance)
        bias = update_expert_bias(bias, st.load_per_expert, rate=0.05)
    assert np.mean(sims[-5:]) < 1.1 < sims[0]


def test_simulation_is_reproducible_and_the_popular_experts_stay_fixed():
    a = simulate_moe(4096, 16, 2, 4, skew=2.0, seed=5)
    b = simulate_moe(4096, 16, 2, 4, skew=2.0, seed=5)
    assert np.array_equal(a.load_per_expert, b.load_per_expert)
    c = simulate_moe(4096, 16, 2, 4, skew=4.0, seed=5)
    assert np.array_equal(a.popularity, c.popularity)
    hot = np.argmax(a.popularity)
    assert a.load_per_expert.argmax() == hot == c.load_per_expert.argmax()


# ------------------------------------------------------------------ node-limited routing
def _node_limited_by_loop(scores, k, nodes, max_nodes):
    """Independent reference: DeepSeek-V3's rule, one token at a time."""
    T, E = scores.shape
    per = E // nodes
    m = -(-k // max_nodes)
    out = []
    for t in range(T):
        node_score = [sum(sorted(scores[t, j * per:(j + 1) * per])[-m:]) for j in range(nodes)]
        best = sorted(range(nodes), key=lambda j: (-node_score[j], j))[:max_nodes]
        allowed = [i for i in range(E) if i // per in best]
        out.append(sorted(allowed, key=lambda i: (-scores[t, i], i))[:k])
    return np.array(out)


@pytest.mark.parametrize("E,nodes,k,M", [(16, 4, 4, 2), (16, 4, 4, 1), (32, 8, 8, 4),
                                         (12, 3, 3, 2), (8, 8, 2, 2), (16, 4, 3, 4)])
def test_node_limited_routing_matches_a_token_loop(E, nodes, k, M):
    rng = np.random.default_rng(E + k + M)
    logits = rng.standard_normal((200, E))
    bias = 0.3 * rng.standard_normal(E)
    experts, gates = route_topk(logits, k, bias, nodes=nodes, max_nodes=M)
    assert experts.tolist() == _node_limited_by_loop(logits + bias, k, nodes, M).tolist()
    assert max(len(set((row // (E // nodes)).tolist())) for row in experts) <= M
    chosen = np.take_along_axis(logits, experts, axis=1)        # gates: softmax of the logits
    np.testing.assert_allclose(gates, np.exp(chosen) / np.exp(chosen).sum(1, keepdims=True))
    if min(nodes, k) > M:    # the limit binds for some tokens: plain top-k differs
        assert not np.array_equal(experts, route_topk(logits, k, bias)[0])


def test_node_limited_routing_hand_example():
    """Node score = sum of the top ceil(k/M) scores: one big expert does not win a node."""
    logits = np.array([[3.0, -10.0, 2.5, 2.4]])          # node 0: experts 0, 1; node 1: 2, 3
    assert route_topk(logits, 2)[0].tolist() == [[0, 2]]
    # k = 2, M = 1: node 0 scores 3 - 10 = -7, node 1 scores 4.9
    assert route_topk(logits, 2, nodes=2, max_nodes=1)[0].tolist() == [[2, 3]]
    # k = 1, M = 1: node 0 scores 3 (its best expert)
    assert route_topk(logits, 1, nodes=2, max_nodes=1)[0].tolist() == [[0]]
    # no limit (max_nodes = nodes, or nodes alone) is plain top-k
    assert route_topk(logits, 2, nodes=2, max_nodes=2)[0].tolist() == [[0, 2]]
    assert route_topk(logits, 2, nodes=2)[0].tolist() == [[0, 2]]


def test_node_limited_routing_rejects_bad_input():
    logits = np.zeros((3, 8))
    with pytest.raises(ValueError, match="do not split evenly over nodes = 3"):
        route_topk(logits, 2, nodes=3, max_nodes=1)
    with pytest.raises(ValueError, match="max_nodes = 5 is more than the nodes = 4"):
        route_topk(logits, 2, nodes=4, max_nodes=5)
    with pytest.raises(ValueError, match="max_nodes needs nodes"):
        route_topk(logits, 2, max_nodes=1)
    with pytest.raises(ValueError, match="raise max_nodes to at least 2"):
        route_topk(logits, 3, nodes=4, max_nodes=1)          # 1 node = 2 experts < k = 3
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="nodes"):
            route_topk(logits, 2, nodes=bad)


@pytest.mark.parametrize("n,nodes,M", [(2, 2, 1), (4, 4, 2), (4, 2, 1), (8, 4, 2)])
@pytest.mark.parametrize("cf", [None, 1.0])
def test_moe_layer_with_node_limited_routing_equals_the_reference(n, nodes, M, cf):
    xs, router_w, experts = _problem(n=n, seed=n + M)
    k = 4
    ys = moe_layer(xs, router_w, experts, k, capacity_factor=cf, group=SimGroup(n),
                   nodes=nodes, max_nodes=M)
    x = np.concatenate(xs)
    ref = moe_reference(x, router_w, experts, k, cf, nodes=nodes, max_nodes=M)
    np.testing.assert_allclose(np.concatenate(ys), ref, rtol=0, atol=1e-12)
    assert np.abs(ref - moe_reference(x, router_w, experts, k, cf)).max() > 1e-6


def _node_bytes_by_loop(choices, keep, T, E, Ne, nodes, h, e):
    """Inter/intra-node bytes per GPU, one (token, copy) at a time."""
    per_t, per_e, gpn = T // Ne, E // Ne, Ne // nodes
    inter, intra = np.zeros(Ne), np.zeros(Ne)
    for t in range(T):
        src = t // per_t
        my_node, local = src // gpn, src % gpn
        remote = set()
        for j, ex in enumerate(choices[t]):
            if keep is not None and not keep[t, j]:
                continue
            gpu, node = ex // per_e, ex // per_e // gpn
            holder = src if node == my_node else node * gpn + local
            if node != my_node:
                remote.add(node)
            if gpu != holder:
                intra[holder] += h * e                     # forwarded inside the node
                intra[gpu] += h * e                        # its output comes back
        for node in remote:
            inter[src] += h * e                            # crosses once to the node
            inter[node * gpn + local] += h * e             # the node's summed output returns
    return inter, intra


@pytest.mark.parametrize("Ne,nodes,M,cf", [(8, 4, None, None), (8, 4, 2, None), (8, 4, 1, 1.0),
                                           (8, 2, 1, None), (4, 4, 2, 0.8)])
def test_internode_bytes_count_one_copy_per_token_and_remote_node(Ne, nodes, M, cf):
    T, E, k, h, e = 64, 16, 4, 3, 2
    st = simulate_moe(T, E, k, Ne, capacity_factor=cf, skew=0.5, h=h, e=e, nodes=nodes,
                      max_nodes=M, seed=3)
    # rebuild the routing the simulator used and count its bytes by hand
    pop_seq, route_seq = np.random.SeedSequence(3).spawn(2)
    logw = 0.5 * st.popularity
    if M is not None and nodes > M:
        rng = np.random.default_rng(route_seq)
        choices = route_topk(logw + rng.gumbel(size=(T, E)), k, nodes=nodes, max_nodes=M)[0]
    else:
        choices = sample_topk(logw, T, k, np.random.default_rng(route_seq))
    keep = keep_within_capacity(choices, E, st.capacity) if cf is not None else None
    inter, intra = _node_bytes_by_loop(choices, keep, T, E, Ne, nodes, h, e)
    np.testing.assert_allclose(st.internode_bytes_per_gpu, inter)
    np.testing.assert_allclose(st.intranode_bytes_per_gpu, intra)
    assert st.load_per_expert.sum() == (T * k if keep is None else keep.sum())
    if M is not None:
        assert st.remote_nodes_per_token <= M


def test_node_bytes_at_the_extremes():
    T, E, k, Ne, h, e = 4096, 16, 4, 8, 2, 2
    one = simulate_moe(T, E, k, Ne, h=h, e=e, nodes=1)               # one node: all NVLink
    assert not one.internode_bytes_per_gpu.any()
    np.testing.assert_allclose(one.intranode_bytes_per_gpu, one.bytes_per_gpu)
    each = simulate_moe(T, E, k, Ne, h=h, e=e, nodes=Ne)             # one GPU per node
    assert not each.intranode_bytes_per_gpu.any()
    # a token with two experts on the same remote GPU crosses once: fewer bytes than the flat count
    assert (each.internode_bytes_per_gpu <= each.bytes_per_gpu).all()
    assert each.internode_bytes_per_gpu.sum() < each.bytes_per_gpu.sum()


def test_internode_bytes_fall_with_max_nodes():
    """Uniform routing, 64 experts on 8 nodes, top-8: the limit cuts the inter-node traffic."""
    T, E, k, Ne, nodes, h, e = 8192, 64, 8, 64, 8, 1, 1
    per_token = {}
    for M in (1, 2, 4, 8):
        st = simulate_moe(T, E, k, Ne, h=h, e=e, nodes=nodes, max_nodes=M)
        per_token[M] = st.remote_nodes_per_token
        # bytes per GPU = 2 (dispatch + combine) x (T/Ne tokens) x remote nodes per token
        assert st.internode_bytes_per_gpu.mean() == pytest.approx(2 * T / Ne * per_token[M])
        assert st.remote_nodes_per_token <= M
    # M = 1: the chosen node is remote with probability 7/8
    assert per_token[1] == pytest.approx(7 / 8, abs=0.03)
    # no limit: 7 remote nodes, each used unless all 8 experts miss it
    p_used = 1 - math.comb(56, 8) / math.comb(64, 8)
    assert per_token[8] == pytest.approx(7 * p_used, rel=0.02)
    assert per_token[1] < per_token[2] < per_token[4] < per_token[8]


def test_simulate_moe_rejects_bad_nodes():
    with pytest.raises(ValueError, match="Ne = 8 GPUs do not split evenly over nodes = 3"):
        simulate_moe(64, 24, 2, 8, nodes=3)
    with pytest.raises(ValueError, match="max_nodes needs nodes"):
        simulate_moe(64, 16, 2, 8, max_nodes=2)
    with pytest.raises(ValueError, match="raise max_nodes"):
        simulate_moe(64, 16, 4, 8, nodes=8, max_nodes=1)


# --------------------------------------------------------------------------- bad input
# (each case was found misbehaving before its validation was added)

def test_routing_rejects_non_finite_or_complex_logits():
    L = np.random.default_rng(0).standard_normal((6, 4))
    for bad in (np.where(L > 1, np.nan, L), np.where(L > 1, np.inf, L), L + 1j):
        with pytest.raises(ValueError, match="logits"):
            sim.route_topk(bad, 2)
    with pytest.raises(ValueError, match="bias contains NaN"):
        sim.route_topk(L, 2, bias=np.array([np.nan, 0, 0, 0]))
    with pytest.raises(ValueError, match="logits contains NaN"):
        sim.router_probs(np.array([[np.nan, 1.0]]))


def test_moe_reference_and_layer_reject_garbage():
    h, E = 4, 4
    W = np.random.default_rng(0).standard_normal((h, E))
    ex = sim.init_experts(E, h, 8)
    x = np.random.default_rng(0).standard_normal((8, h))
    with pytest.raises(ValueError, match="x contains NaN"):
        sim.moe_reference(x * np.nan, W, ex, 2)
    with pytest.raises(ValueError, match="x must hold real numbers"):
        sim.moe_reference(x + 1j, W, ex, 2)
    with pytest.raises(ValueError, match="router_w contains NaN"):
        sim.moe_reference(x, W * np.nan, ex, 2)
    with pytest.raises(ValueError, match="experts must be a list"):
        sim.moe_reference(x, W, None, 2)
    with pytest.raises(ValueError, match="W1 \\(h, d_ff\\) and W2 \\(d_ff, h\\)"):
        sim.moe_reference(x, W, [(np.ones((3, 2)), np.ones((2, 3)))] * 4, 2)
    with pytest.raises(ValueError, match="finite real numbers"):
        sim.moe_reference(x, W, [lambda z: z * np.nan] * 4, 2)
    with pytest.raises(ValueError, match="must be an array of real numbers"):
        sim.moe_layer([x[:4] + 1j, x[4:] + 1j], W, ex, 2)
    for cf in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="capacity_factor must be a number > 0"):
            sim.moe_layer([x[:4], x[4:]], W, ex, 2, cf)


def test_simulate_moe_and_balancing_reject_garbage():
    for kw, msg in (({"skew": "a"}, "skew"), ({"skew": None}, "skew"), ({"seed": 1.5}, "seed"),
                    ({"capacity_factor": float("nan")}, "capacity_factor"), ({"k": 9}, "k = 9"),
                    ({"skew": 1e308, "popularity": np.full(8, 2.0)}, "lower skew")):
        args = dict(T=64, E=8, k=2, Ne=4)
        args.update(kw)
        with pytest.raises(ValueError, match=msg):
            sim.simulate_moe(**args)
    probs = np.full((4, 2), 0.5)
    with pytest.raises(ValueError, match="probs contains NaN"):
        sim.switch_aux_loss(probs * np.nan, np.array([[0], [1], [0], [1]]))
    with pytest.raises(ValueError, match="expert ids"):
        sim.switch_aux_loss(probs, np.array([[0.5], [1], [0], [1]]))
    with pytest.raises(ValueError, match="at least one token"):
        sim.switch_aux_loss(np.zeros((0, 2)), np.zeros((0, 1), int))
    with pytest.raises(ValueError, match="alpha"):
        sim.switch_aux_loss(probs, np.array([[0], [1], [0], [1]]), alpha=float("nan"))
    with pytest.raises(ValueError, match="rate"):
        sim.update_expert_bias(np.zeros(2), np.ones(2), "a")
    with pytest.raises(ValueError, match="load contains NaN"):
        sim.update_expert_bias(np.zeros(2), np.array([np.nan, 1.0]), 0.1)


# --------------------------------------------------------------------------- properties (hypothesis)

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
