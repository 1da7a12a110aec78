"""Bytes per link on 4 gloo ranks pretending to be 2 nodes of 2 (lesson10.spmd.bytecount with
lesson10.topology): every method's bytes split into inside / across nodes as
lesson10.cost.link_split says, and USP's default Ulysses size keeps its all-to-alls inside
a node."""
import pytest

from lesson10 import cost
from lesson10.spmd.bytecount import SIDE_OPS

ATT = dict(s=32, a=4, a_kv=4, d=4, node_size=2)
CASES = {
    "ring": ("check_attention", dict(ATT, method="ring")),
    "allgather": ("check_attention", dict(ATT, method="allgather")),
    "ulysses": ("check_attention", dict(ATT, method="ulysses")),
    "usp_default": ("check_attention", dict(ATT, method="usp")),
    "usp_u4": ("check_attention", dict(ATT, method="usp", ulysses_size=4)),
    "sp": ("check_sp", dict(node_size=2)),
    "tp": ("check_sp", dict(node_size=2, sequence_parallel=False)),
}
PATTERN = {"ring": "ring", "allgather": "ring", "ulysses": "all_to_all", "sp": "ring", "tp": "ring"}


def _all(n):
    return ("run_checks", {"todo": list(CASES.values()) if n == 4 else []})


RANK_JOBS = {"links": _all}


@pytest.fixture(scope="module")
def outs(rank_results):
    return [dict(zip(CASES, o)) for o in rank_results(4, "links")]


@pytest.mark.parametrize("name", list(CASES))
def test_every_byte_has_a_link_and_the_run_is_exact(outs, name):
    for rank in outs:
        res = rank[name]
        assert res["ok"] and res["nodes"] == 2, res
        assert res["fwd_link"]["intra"] + res["fwd_link"]["inter"] == res["fwd"]
        assert not any("unknown" in v for v in res["fwd_by_link"].values()), res["fwd_by_link"]


@pytest.mark.parametrize("name", list(PATTERN))
def test_split_is_cost_link_split(outs, name):
    for r, rank in enumerate(outs):
        res = rank[name]
        want = cost.link_split(res["fwd"], PATTERN[name], r, 4, 2)
        assert (res["fwd_link"]["intra"], res["fwd_link"]["inter"]) == pytest.approx(want), (name, r)


def test_ring_sends_across_only_from_the_last_rank_of_a_node(outs):
    assert [o["ring"]["fwd_link"]["inter"] > 0 for o in outs] == [False, True, False, True]


def test_usp_default_is_the_node_size_and_its_all_to_alls_stay_inside(outs):
    for rank in outs:
        res = rank["usp_default"]
        assert res["ulysses_size"] == 2 and res["warnings"] == []
        a2a = res["fwd_by_link"]["all_to_all"]
        assert a2a.get("inter", 0) == 0 and a2a["intra"] > 0
        ring = sum(v.get("inter", 0) for op, v in res["fwd_by_link"].items()
                   if op not in ("all_to_all", *SIDE_OPS))
        assert ring == res["fwd_link"]["inter"] > 0, "the ring of ranks (0, 2), (1, 3) crosses"


def test_usp_across_nodes_warns_and_its_all_to_all_crosses(outs):
    for rank in outs:
        res = rank["usp_u4"]
        assert res["ulysses_size"] == 4
        assert len(res["warnings"]) == 1 and "across nodes" in res["warnings"][0]
        assert "ulysses_size = 2" in res["warnings"][0]
        assert res["fwd_by_link"]["all_to_all"]["inter"] > 0


def test_every_result_carries_every_rank_s_links(outs):
    for name in CASES:
        by = outs[0][name]["link_by_rank"]
        assert by == outs[3][name]["link_by_rank"]
        assert [o[name]["fwd_link"]["inter"] for o in outs] == by["fwd_inter"]
        assert [o[name]["bwd_link"]["intra"] for o in outs] == by["bwd_intra"]
