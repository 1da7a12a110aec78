"""Expert-parallel MoE on gloo: outputs and gradients (input, router, experts) equal a
single-process dense MoE with the same weights, drops included; the same numbers as
lesson10.sim.moe; uniform routing sends exactly lesson10.cost.moe_a2a_bytes."""
import math

import numpy as np
import pytest
import torch
from rank_workers import bad_input_test

from lesson10 import cost, sim
from lesson10.spmd import moe as dmoe

H, E, DFF, K = 8, 8, 6, 2
BASE = dict(h=H, E=E, d_ff=DFF, k=K)


def cases(n):
    last = list(range(E - E // n, E))                    # the experts of the last rank
    good = {
        "dropless": dict(BASE, T=6),
        "drops": dict(BASE, T=6, capacity_factor=1.0),
        "uneven": dict(BASE, T=[5, 3, 4, 2][:n], capacity_factor=0.75),
        "no_tokens": dict(BASE, T=[6, 0, 3, 0][:n], capacity_factor=1.0),
        "top1": dict(BASE, T=6, k=1, capacity_factor=1.5),
        "unused_expert": dict(BASE, T=6, bias=[-1e9] + [0.0] * (E - 1), rate=0.1),
        "idle_rank": dict(BASE, T=6, bias=[-1e9 if i in last else 0.0 for i in range(E)]),
        "uniform": dict(BASE, T=4, routing="uniform"),
        "float32": dict(BASE, T=6, capacity_factor=1.25, dtype="float32"),
    }
    bad = {"E": dict(BASE, T=4, E=n + 1), "cf": dict(BASE, T=4, capacity_factor=-1.0),
           "k": dict(BASE, T=4, k=E + 1)}
    return good, bad


NODE_MOE = dict(T=8, h=8, E=8, k=4, d_ff=6, dtype="float64", alpha=0.5)
NODE_CASES = [dict(NODE_MOE, nodes=2, max_nodes=1), dict(NODE_MOE, nodes=4, max_nodes=2),   # node-limited
              dict(NODE_MOE, nodes=4, max_nodes=3, capacity_factor=1.0),
              dict(NODE_MOE, nodes=2, max_nodes=1, capacity_factor=0.8, seed=1),
              dict(NODE_MOE, nodes=4, max_nodes=4)]

RANK_JOBS = {"bad_input": lambda n: ("bad_input_cases", {"prefix": "moe"}),
             "moe": lambda n: ("check_moe", [*cases(n)[0].values(), *cases(n)[1].values()]),
             "moe_nodes": lambda n: ("check_moe", NODE_CASES),
             # group=: 4 ranks as two independent groups of 2, each with its own tokens
             "groups": lambda n: ("split_groups", {"part": "moe"}) if n == 4 else ("whoami", {})}


@pytest.fixture(scope="module", params=[2, 4])
def run(request, rank_results):
    n = request.param
    good, bad = cases(n)
    outs = rank_results(n, "moe")
    return n, good, bad, [dict(zip(list(good) + list(bad), o)) for o in outs]


def test_matches_dense_reference_and_sim(run):
    n, good, _, outs = run
    for rank_out in outs:
        for name in good:
            res = rank_out[name]
            assert res["ok"], (name, res["err"])
            for key in ("y", "dx", "router_grad", "w1_grad", "w2_grad", "aux"):
                assert res["err"][key] <= res["tol"], (name, key, res)
            assert ("sim" in res["err"]) == (res["case"]["dtype"] == "float64")
            if "sim" in res["err"]:
                assert res["err"]["sim"] < 1e-12 and res["err"]["sim_aux"] < 1e-12, (name, res)


def test_capacity_drops_first_come_first_served(run):
    n, good, _, outs = run
    for name in ("drops", "uneven", "no_tokens", "top1", "float32"):
        res = outs[0][name]
        c = res["case"]
        N = sum(c["T"]) if isinstance(c["T"], list) else c["T"] * n
        C = math.ceil(c["capacity_factor"] * c["k"] * N / E)
        assert res["capacity"] == C and res["ref_dropped"] == res["dropped"]
        assert res["load"] == [min(x, C) for x in res["counts"]]
        assert res["dropped"] == sum(max(0, x - C) for x in res["counts"])
        assert all(o[name]["load"] == res["load"] for o in outs)   # every rank agrees
    assert outs[0]["drops"]["dropped"] > 0 and outs[0]["uneven"]["dropped"] > 0


def test_experts_without_tokens(run):
    n, _, _, outs = run
    assert outs[0]["unused_expert"]["load"][0] == 0
    assert outs[0]["unused_expert"]["w_grad_zero"][0]           # expert 0 lives on rank 0
    idle = outs[-1]["idle_rank"]
    assert all(x == 0 for x in idle["load"][E - E // n:]) and all(idle["w_grad_zero"])
    assert idle["fwd_by_op"]["all_to_all"] > 0                          # it still sends its tokens away


def test_expert_bias_update_matches_sim(run):
    _, _, _, outs = run
    for rank_out in outs:
        assert rank_out["unused_expert"]["err"]["bias"] == 0.0
        assert rank_out["unused_expert"]["bias_changed"]


def test_uniform_routing_bytes_and_aux_loss(run):
    n, good, _, outs = run
    for rank_out in outs:
        res = rank_out["uniform"]
        assert res["load"] == [K * 4 * n // E] * E                 # exactly uniform
        want = cost.moe_a2a_bytes(K, 4, H, n, e=8)
        assert res["fwd"] == res["fwd_by_op"]["all_to_all"] == want == res["formula_fwd"]
        assert res["bwd_by_op"]["all_to_all"] == want
        assert res["fwd"] == (res["remote_sent"] + res["remote_received"]) * res["row_bytes"]
        assert res["aux_value"] == pytest.approx(0.5, abs=1e-12)    # = alpha for uniform routing


def test_bad_input_errors(run):
    n, _, bad, outs = run
    for rank_out in outs:
        assert f"N_e = {n}" in rank_out["E"]["error"]
        assert "capacity_factor" in rank_out["cf"]["error"]
        assert "k = " in rank_out["k"]["error"]



@pytest.mark.parametrize("n", [2, 4])
def test_node_limited_moe_matches_the_reference_and_the_simulator(rank_results, n):
    out = rank_results(n, "moe_nodes")
    for rows in out:
        for row, case in zip(rows, NODE_CASES):
            assert "error" not in row, row
            assert row["ok"] and row["err"]["sim"] < 1e-12, row
            assert row["nodes_used"] <= case["max_nodes"]
            # bytes: exactly the kept copies that leave this rank, both ways
            assert row["fwd"] == (row["remote_sent"] + row["remote_received"]) * row["row_bytes"]
    # the limit binds: with one node allowed of two, every token stays on one node
    assert all(rows[0]["nodes_used"] == 1 for rows in out)

@pytest.mark.parametrize("seed", range(6))
def test_the_torch_arrival_order_is_the_sims_rule(seed):
    """spmd.moe.arrival_order (and so moe_reference's drops) against lesson10.sim's
    arrival_order on random routings, ties in the logits included (ties to the lower id)."""
    rng = np.random.default_rng(seed)
    N, E_, k = 40, [4, 8, 16][seed % 3], 1 + seed % 3
    logits = rng.integers(0, 3, size=(N, E_)).astype(float)          # many ties
    experts, _ = sim.route_topk(logits, k)
    t_experts, _ = dmoe.route_topk(torch.from_numpy(logits), k)
    assert np.array_equal(t_experts.numpy(), experts)                 # the same tie rule
    assert np.array_equal(dmoe.arrival_order(t_experts, E_).numpy(), sim.arrival_order(experts, E_))
    # and the drops of the dense reference: x = identity makes x @ router_w the logits above,
    # identity experts return the token, so y[t] = (sum of the kept gates of t) e_t
    x, cf = torch.eye(N, dtype=torch.float64), 0.75
    w = torch.eye(N, dtype=torch.float64).repeat(E_, 1, 1)
    y = dmoe.moe_reference(x, torch.from_numpy(logits), w, w.clone(), k, cf)
    ys = sim.moe_reference(x.numpy(), logits, [(np.eye(N), np.eye(N))] * E_, k, cf)
    assert np.abs(y.numpy() - ys).max() < 1e-12
    assert (y.sum(1) < 1 - 1e-9).any()                                # some copies were dropped


# --------------------------------------------------------------------------- bad input
# (each case was found misbehaving before its validation was added)
def _bad_t(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(len(shape)), dtype=dtype)


def test_dist_moe_single_process_rejects_bad_args():
    L = _bad_t(6, 4)
    with pytest.raises(ValueError, match="k \\(experts per token\\) must be an integer >= 1"):
        dmoe.route_topk(L, 2.0)
    with pytest.raises(ValueError, match="k \\(experts per token\\) must be an integer >= 1"):
        dmoe.route_topk(L, None)
    with pytest.raises(ValueError, match="floating-point tensor \\(T, E\\)"):
        dmoe.route_topk(L[0], 1)
    with pytest.raises(ValueError, match="one entry per expert"):
        dmoe.route_topk(L, 2, bias=torch.zeros(3))
    rw, w1, w2 = dmoe.init_moe_weights(4, 4, 8)
    x = _bad_t(8, 4)
    with pytest.raises(ValueError, match="cast x"):
        dmoe.moe_reference(x.double(), rw, w1, w2, 2)
    with pytest.raises(ValueError, match="h = 3"):
        dmoe.moe_reference(x[:, :3], rw, w1, w2, 2)
    with pytest.raises(ValueError, match="E \\(experts\\) must be an integer >= 1, got 0"):
        dmoe.moe_reference(x, rw[:, :0], w1[:0], w2[:0], 1)
    # numpy scalars are numbers, as in lesson10.sim
    y = dmoe.moe_reference(x, rw, w1, w2, 2, np.float32(1.0))
    y64 = dmoe.moe_reference(x, rw, w1, w2, 2, 1.0)
    assert torch.equal(y, y64)


# multi-process bad input (rank_workers.bad_input_cases) -> what its error says
test_multi_process_bad_input_says_what_to_do = bad_input_test({
    "moe k float": "k (experts per token) must be an integer >= 1",
    "moe E % Ne": "E a multiple of N_e",
    "moe cf nan": "capacity_factor must be a number > 0",
    "moe x float64": "pass x.to(torch.float32)",
    "moe alpha nan": "alpha must be a finite number",
    "moe dtype str": "floating torch.dtype",
    "moe numpy weights": "floating-point torch.Tensor",
    "moe update_bias nan": "rate must be a finite number",
})


def test_a_rank_without_tokens_gets_an_empty_output_and_no_nan(rank_results):
    for res in rank_results(2, "bad_input"):
        kind, (shape, aux) = res["moe no tokens"]          # aux loss used to be NaN
        assert kind == "ok" and shape == (0, 4) and aux == 0.0


def test_expert_parallel_moe_inside_a_group(rank_results):
    """ExpertParallelMoE inside a group of 2 of 4 ranks matches moe_reference on its tokens."""
    results, TOL = rank_results(4, "groups"), 1e-9
    for rank, out in enumerate(results):
        err = out["moe"]
        for key in ("y", "dx", "router", "w1", "w2", "aux"):
            assert err[key] < TOL, (rank, key, err)
    assert any(out["moe"]["dropped"] > 0 for out in results)     # capacity 1.0 drops some copies


@pytest.mark.parametrize("sizes", [[5, 0, 2, 1], [0, 0, 3], [0, 0], [1]])
def test_grouped_expert_mlp_equals_a_loop_over_experts(sizes):
    """The grouped matmul (one padded bmm per weight over the local experts) against a loop of
    per-expert matmuls: outputs and gradients, uneven loads, experts with 0 tokens, rows of
    the experts interleaved, and no rows at all."""
    El, h, dff = len(sizes), 4, 3
    g = torch.Generator().manual_seed(sum(sizes) + El)
    eid = torch.repeat_interleave(torch.arange(El), torch.tensor(sizes))
    eid = eid[torch.randperm(eid.numel(), generator=g)]                  # interleaved rows
    x = torch.randn(eid.numel(), h, generator=g, dtype=torch.float64, requires_grad=True)
    w1 = torch.randn(El, h, dff, generator=g, dtype=torch.float64, requires_grad=True)
    w2 = torch.randn(El, dff, h, generator=g, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(eid.numel(), h, generator=g, dtype=torch.float64)
    y = dmoe.grouped_expert_mlp(x, eid, w1, w2)
    grads = torch.autograd.grad((y * dy).sum(), (x, w1, w2), allow_unused=False)
    ref = torch.zeros_like(x)
    for e in range(El):
        rows = torch.nonzero(eid == e).reshape(-1)
        ref = ref.index_add(0, rows, torch.relu(x[rows] @ w1[e]) @ w2[e])
    ref_grads = torch.autograd.grad((ref * dy).sum(), (x, w1, w2), allow_unused=True)
    assert y.shape == x.shape and torch.allclose(y, ref, atol=1e-12)
    for got, want in zip(grads, ref_grads):
        want = torch.zeros_like(got) if want is None else want
        assert torch.allclose(got, want, atol=1e-12)
    idle = torch.tensor(sizes) == 0                                      # no rows: zero gradient
    assert torch.all(grads[1][idle] == 0) and torch.all(grads[2][idle] == 0)
    if sum(sizes):
        assert grads[2][~idle].abs().sum() > 0                           # and the others learn
