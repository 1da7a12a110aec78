"""The two-level MoE dispatch (lesson10.spmd.moe_dispatch) on 4 gloo ranks pretending to be
2 nodes of 2: outputs and gradients equal the single-process reference, the bytes that cross
nodes are lesson10.sim.nodes.node_bytes exactly, and it sends fewer of them than the flat
all-to-all (fewer still with max_nodes=1)."""
import pytest

BASE = dict(h=8, E=8, d_ff=6, k=2, T=12, routing="random", node_size=2)
CASES = {
    "two_level": dict(BASE),
    "flat": dict(BASE, dispatch="flat"),
    "limited": dict(BASE, max_nodes=1),
    "limited_flat": dict(BASE, max_nodes=1, dispatch="flat"),
    "drops": dict(BASE, capacity_factor=1.0),
    "uneven": dict(BASE, T=[5, 0, 7, 3], capacity_factor=1.25),
    "uniform": dict(BASE, routing="uniform", T=8),
    "top1": dict(BASE, k=1, capacity_factor=1.5),
    "float32": dict(BASE, dtype="float32", capacity_factor=1.25),
    "one_node": dict(BASE, node_size=4, dispatch="two_level"),
    "k3_bias": dict(BASE, k=3, bias=[0.5, 0, 0, 0, 0, 0, 0, -0.5], rate=0.1),
}
BAD = {"dispatch": dict(BASE, dispatch="tree"),
       "ragged_nodes": dict(BASE, node_size=3)}

RANK_JOBS = {"dispatch": lambda n: ("check_moe", list(CASES.values()) + list(BAD.values()))
             if n == 4 else ("check_moe", []),
             "groups": lambda n: ("moe_interleaved_group", {}) if n == 4 else ("hello", {})}


@pytest.fixture(scope="module")
def outs(rank_results):
    return [dict(zip(list(CASES) + list(BAD), o)) for o in rank_results(4, "dispatch")]


@pytest.mark.parametrize("name", list(CASES))
def test_outputs_and_gradients_match_the_reference(outs, name):
    for rank in outs:
        res = rank[name]
        assert "error" not in res, res
        assert res["ok"], (name, res["err"])
        if res["case"]["dtype"] == "float64":
            assert res["max_err"] < 1e-12 and res["err"]["sim"] < 1e-12, (name, res["err"])


@pytest.mark.parametrize("name", list(CASES))
def test_bytes_per_link_are_those_the_routing_implies(outs, name):
    """Two-level: lesson10.sim.nodes.node_bytes; flat: one row per remote copy each way."""
    for rank in outs:
        res = rank[name]
        assert res["fwd_link"] == res["link_expected"], (name, res["rank"], res)
        assert res["bwd_link"] == res["fwd_link"], "the backward retraces the forward"
        assert res["fwd_link"]["intra"] + res["fwd_link"]["inter"] == res["fwd"]


def test_dispatch_that_ran(outs):
    assert {r["two_level"]["dispatch"] for r in outs} == {"two_level"}
    assert {r["flat"]["dispatch"] for r in outs} == {"flat"}
    assert outs[0]["two_level"]["nodes"] == 2 and outs[0]["one_node"]["nodes"] == 1


def _across(outs, name):
    return sum(r[name]["fwd_link"]["inter"] for r in outs)


def test_two_level_sends_fewer_bytes_across_nodes(outs):
    assert _across(outs, "two_level") < _across(outs, "flat")
    assert _across(outs, "limited") < _across(outs, "limited_flat")
    assert _across(outs, "limited") < _across(outs, "two_level"), "max_nodes=1: one node per token"
    # with max_nodes = 1 a token reaches at most one node, so at most one remote copy each way
    for r in outs:
        res = r["limited"]
        assert res["nodes_used"] == 1
        assert res["fwd_link"]["inter"] <= 2 * res["T_mine"] * res["row_bytes"]


def test_flat_inside_one_node_sends_nothing_across(outs):
    assert _across(outs, "one_node") == 0
    assert all(r["one_node"]["fwd_link"]["intra"] == r["one_node"]["fwd"] for r in outs)


def test_bad_settings_are_rejected_on_every_rank(outs):
    for r in outs:
        assert "dispatch must be 'auto', 'flat' or 'two_level'" in r["dispatch"]["error"]
        assert "do not fill nodes of 3" in r["ragged_nodes"]["error"]


def test_groups_that_do_not_fill_their_nodes_in_blocks(rank_results):
    outs = rank_results(4, "groups")
    assert all(res["pair"] == "two_level" for res in outs)   # (0, 2): a rank on each node
    for res in outs[:3]:
        assert "fills its nodes evenly" in res["triple"] and "dispatch='flat'" in res["triple"]
        assert res["triple_auto"] == "flat"                  # auto falls back, it does not refuse
