"""lesson10.topology: which ranks share a node (from torchrun's environment or assumed), and
the USP / node-limit rules built on it; lesson10.cost.link_split."""
import numpy as np
import pytest

from lesson10 import cost, layouts, topology
from lesson10.topology import Topology


def test_ranks_fill_nodes_in_order():
    t = Topology(8, 4)
    assert t.nodes == 2
    assert [t.node_of(r) for r in range(8)] == [0] * 4 + [1] * 4
    assert [t.local_index(r) for r in range(8)] == [0, 1, 2, 3] * 2
    assert t.same_node(1, 3) and not t.same_node(3, 4)
    assert t.nodes_of([0, 4]) == 2 and t.nodes_of([5, 6, 7]) == 1


def test_aligned_groups_fill_their_nodes_in_blocks():
    t = Topology(8, 4)
    assert t.aligned(range(8)) and t.aligned([0, 1, 4, 5]) and t.aligned([2, 3])
    assert not t.aligned([0, 4, 1, 5])          # interleaved: group rank 1 on the other node
    assert not t.aligned([0, 1, 2, 4])          # 3 ranks on one node, 1 on the other


def test_uneven_nodes_are_refused_with_a_hint():
    with pytest.raises(ValueError, match="nproc-per-node"):
        Topology(6, 4)


def test_current_reads_torchrun_then_the_override(monkeypatch):
    monkeypatch.delenv("LESSON10_NODE_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert topology.current(8) == Topology(8, 8)            # nothing said: one node
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert topology.current(8) == Topology(8, 2)
    monkeypatch.setenv("LESSON10_NODE_SIZE", "4")
    assert topology.current(8) == Topology(8, 4)
    with topology.assume(1):
        assert topology.current(8).nodes == 8
    assert topology.current(8).nodes == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")            # more than the world: one node
    monkeypatch.delenv("LESSON10_NODE_SIZE")
    assert topology.current(8) == Topology(8, 8)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE"):
        topology.current(8)


def test_usp_default_is_the_ranks_per_node_within_the_head_limit():
    t = Topology(8, 4)
    assert topology.default_ulysses_size(range(8), 8, t) == 4
    assert topology.default_ulysses_size(range(8), 2, t) == 2    # 2 K/V heads: u | 2
    assert topology.default_ulysses_size(range(8), 3, t) == 1    # no split of 3 heads: ring only
    assert topology.default_ulysses_size([0, 1, 4, 5], 8, t) == 2
    assert topology.ulysses_spans_nodes(range(8), 4, t) == []
    assert topology.ulysses_spans_nodes(range(8), 8, t) == [list(range(8))]
    assert topology.ulysses_spans_nodes(range(8), 2, Topology(8, 1)) == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_usp_group_ranks():
    assert topology.usp_group_ranks(4, 2) == ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    with pytest.raises(ValueError, match="divides N"):
        topology.usp_group_ranks(6, 4)


@pytest.mark.parametrize("nodes,max_nodes,match", [
    (None, 1, "max_nodes needs nodes"), (3, None, "divides E"), (2, 3, "more than the nodes"),
    (4, 1, "fewer than k")])
def test_node_limits_are_checked(nodes, max_nodes, match):
    with pytest.raises(ValueError, match=match):
        topology.check_nodes(8, 4, nodes, max_nodes)


def test_link_split_ring_and_all_to_all():
    # 2 nodes of 2: in a ring 0 -> 1 -> 2 -> 3 -> 0 ranks 1 and 3 send across
    assert [cost.link_split(10, "ring", r, 4, 2) for r in range(4)] == \
        [(10, 0), (0, 10), (10, 0), (0, 10)]
    assert cost.link_split(10, "ring", 3, 4, 4) == (10, 0)
    inside, across = cost.link_split(7.0, "all_to_all", 0, 8, 4)
    assert (inside, across) == pytest.approx((3.0, 4.0))
    with pytest.raises(ValueError, match="fill nodes"):
        cost.link_split(1, "ring", 0, 6, 4)
    with pytest.raises(ValueError, match="pattern"):
        cost.link_split(1, "tree", 0, 4, 2)


def test_usp_ulysses_size_is_the_one_default():
    """``None`` takes the ranks per node (cut to a divisor of a_kv); a given size is checked."""
    t = topology.Topology(8, 4)
    assert topology.usp_ulysses_size(None, range(8), 8, t) == 4
    assert topology.usp_ulysses_size(None, range(8), 2, t) == 2
    assert topology.usp_ulysses_size(2, range(8), 8, t) == 2
    with topology.assume(2):
        assert topology.usp_ulysses_size(None, range(4)) == 2      # the byte formula's call
    assert topology.usp_ulysses_size(None, range(4), None, topology.Topology(4, 4)) == 4
    with pytest.raises(ValueError, match="divides N"):
        topology.usp_ulysses_size(3, range(4), 4, t)


@pytest.mark.parametrize("layout", ["zigzag", "contiguous", "striped"])
def test_usp_ring_positions(layout):
    """The tokens of each Ulysses group, sorted: for zig-zag and contiguous the layout's own
    shards over the ring; for any layout, all tokens once."""
    pos = layouts.shard_positions(16, 4, layout)
    ring = topology.usp_ring_positions(pos, 2)
    assert len(ring) == 2 and sorted(np.concatenate(ring).tolist()) == list(range(16))
    assert all(np.array_equal(r, np.sort(np.concatenate(pos[2 * i:2 * i + 2])))
               for i, r in enumerate(ring))
    if layout != "striped":
        assert all(np.array_equal(a, b) for a, b in zip(ring, layouts.shard_positions(16, 2, layout)))
