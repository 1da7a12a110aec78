"""lesson10.spmd.bytecount in one process: bytes by op and by link (no ranks needed)."""
import pytest

from lesson10 import topology
from lesson10.spmd.bytecount import ByteCounter, count_bytes, record


def test_bytes_are_split_by_the_destination_node(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")          # rank 0 of 4, nodes of 2: 1 inside, 2 3 across
    with topology.assume(2), count_bytes() as c:
        record("all_to_all", 30, to={1: 10, 2: 10, 3: 10})
        record("p2p", 5, to=1)
        record("metadata", 7, to=2)
    assert c.sent == 42 and c.by_op == {"all_to_all": 30, "p2p": 5, "metadata": 7}
    assert (c.intra, c.inter) == (15, 20)           # metadata is side traffic
    assert c.by_link["metadata"] == {"intra": 0, "inter": 7}
    assert c.activation == c.intra + c.inter


def test_a_record_without_a_destination_is_unknown_not_guessed():
    with count_bytes() as c:
        record("p2p", 8)
    assert c.by_link == {"p2p": {"unknown": 8}} and c.intra == c.inter == 0
    assert c.link("unknown") == 8


def test_destinations_must_add_up(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    with count_bytes(), pytest.raises(ValueError, match="do not add up"):
        record("all_to_all", 30, to={1: 10, 2: 10})


def test_counter_from_by_op_alone_still_reports_activation():
    assert ByteCounter(by_op={"p2p": 3, "metadata": 4}).activation == 3


def test_the_wire_counts_what_gloo_sends_and_keeps_the_lessons_model(monkeypatch):
    """gloo's reduce-scatter is an all-reduce of the whole tensor (measured on the two hosts'
    veth): twice the model's bytes on the wire, the lesson's count unchanged; side traffic is
    on the wire too; under NCCL the wire figure is the model and says so."""
    from lesson10.spmd import bytecount
    monkeypatch.setenv("WORLD_SIZE", "4")          # rank 0 of 4, nodes of 2: rank 2 is across
    monkeypatch.setattr(bytecount, "_backend", lambda: "gloo")
    with topology.assume(2), count_bytes() as c:
        record("reduce_scatter", 30, to=2)                      # named after its kind
        record("dk", 30, to=2, kind="reduce_scatter")           # relabelled: kind says it
        record("all_gather", 30, to=2)
        record("ring_shift", 10, to=1)
        record("metadata", 4, to=2)
    assert c.sent == 104 and c.inter == 90 and c.intra == 10    # the lesson's model
    assert c.wire_inter == 60 + 60 + 30 + 4 and c.wire_intra == 10 and not c.wire_model
    monkeypatch.setattr(bytecount, "_backend", lambda: "nccl")
    with topology.assume(2), count_bytes() as c:
        record("reduce_scatter", 30, to=2)
    assert c.wire_inter == c.inter == 30 and c.wire_model
    assert bytecount.wire_factor("reduce_scatter", "gloo") == (2.0, False)
    assert bytecount.wire_factor("all_reduce", "gloo") == (1.0, False)
    assert bytecount.wire_factor("all_gather", "nccl") == (1.0, True)
