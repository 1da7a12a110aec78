"""lesson10.sim.capacity: the arrival order of copies at an expert and the capacity drops,
first come first served in global token order, against a plain loop over the copies."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sim_strategies import FAST

from lesson10 import sim
from lesson10.sim import arrival_order, keep_within_capacity, route_topk


def _arrival_by_loop(experts, E):
    seen, place = [0] * E, np.zeros(experts.shape, dtype=np.int64)
    for t in range(experts.shape[0]):
        for j in range(experts.shape[1]):
            place[t, j] = seen[experts[t, j]]
            seen[experts[t, j]] += 1
    return place


def _keep_by_loop(experts, E, C):
    used, keep = [0] * E, np.zeros(experts.shape, dtype=bool)
    for t in range(experts.shape[0]):
        for j in range(experts.shape[1]):
            if used[experts[t, j]] < C:
                used[experts[t, j]] += 1
                keep[t, j] = True
    return keep


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("E,k", [(1, 1), (6, 2), (8, 3), (40000, 2)])
def test_arrival_order_is_the_place_in_the_expert_queue(seed, E, k):
    rng = np.random.default_rng(seed)
    experts = np.stack([rng.choice(E, size=k, replace=False) for _ in range(50)])
    assert np.array_equal(arrival_order(experts, E), _arrival_by_loop(experts, E))


@pytest.mark.parametrize("C", [0, 1, 3, 10, 1000])
def test_capacity_is_first_come_first_served(C):
    rng = np.random.default_rng(C)
    experts = np.argsort(rng.random((60, 6)), axis=1)[:, :2]
    assert np.array_equal(keep_within_capacity(experts, 6, C), _keep_by_loop(experts, 6, C))
    assert np.array_equal(keep_within_capacity(experts, 6, C), arrival_order(experts, 6) < C)


def test_no_capacity_keeps_everything_and_empty_routing_is_empty():
    experts = np.array([[0, 1], [1, 0], [1, 2]])
    assert keep_within_capacity(experts, 3, None).all()
    assert arrival_order(np.zeros((0, 2), dtype=int), 3).shape == (0, 2)
    assert arrival_order(experts, 3).tolist() == [[0, 0], [1, 1], [2, 0]]


# --------------------------------------------------------------------------- bad input
# (each case was found misbehaving before its validation was added)

def test_capacity_helpers_reject_bad_sizes_and_ids():
    with pytest.raises(ValueError, match="E \\(experts\\) must be an integer >= 1"):
        sim.expert_capacity(8, 0, 2, 1.0)              # used to be ZeroDivisionError
    with pytest.raises(ValueError, match="N \\(tokens\\)"):
        sim.expert_capacity(-8, 4, 2, 1.0)             # used to return -4
    with pytest.raises(ValueError, match="expert ids in 0..1"):
        sim.keep_within_capacity(np.array([[0, 5]]), 2, 1)     # used to be an IndexError
    with pytest.raises(ValueError, match="expert ids in 0..1"):
        sim.keep_within_capacity(np.array([[0, -1]]), 2, 1)    # used to keep it silently
    with pytest.raises(ValueError, match="integer expert ids"):
        sim.keep_within_capacity(np.array([[0.5, 1.0]]), 2, 1)
    with pytest.raises(ValueError, match="capacity must be an integer"):
        sim.keep_within_capacity(np.array([[0, 1]]), 2, -1)


# --------------------------------------------------------------------------- properties (hypothesis)

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
