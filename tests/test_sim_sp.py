"""Megatron SP vs plain TP on a token-wise op: same numbers, same bytes."""
import numpy as np
import pytest

from lesson10 import cost, sim
from lesson10.sim import SimGroup, sp_forward, tp_forward


def layer_norm(x):
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5)


def test_worked_example_a():
    """Lesson, worked example (a): t = 2, 4 tokens, h = 1."""
    partials = [np.array([1.0, 2, 3, 4]), np.array([10.0, 20, 30, 40])]
    identity = lambda x: x
    g_tp = SimGroup(2, e=1)                         # e = 1: bytes count elements
    tp = tp_forward(partials, identity, g_tp)
    assert all(np.array_equal(t, [11, 22, 33, 44]) for t in tp)
    assert g_tp.bytes_sent.tolist() == [4, 4]       # 2 * 1/2 * 4 elements per GPU

    g_sp = SimGroup(2, e=1)
    local = sp_forward(partials, identity, g_sp, gather=False)
    assert np.array_equal(local[0], [11, 22]) and np.array_equal(local[1], [33, 44])
    assert g_sp.bytes_sent.tolist() == [2, 2]       # reduce-scatter: 2 elements each
    sp = sp_forward(partials, identity, SimGroup(2, e=1))
    assert all(np.array_equal(s, [11, 22, 33, 44]) for s in sp)
    g_sp.all_gather(local)
    assert g_sp.bytes_sent.tolist() == [4, 4]       # + 2 for the all-gather: 4, as TP


def test_lesson_code_a_layer_norm_identical_and_384_bytes():
    """Lesson section 5 (a): t=4, s=8, h=16 in bf16: max difference 0.0, 384 bytes each way."""
    t, s, h = 4, 8, 16
    rng = np.random.default_rng(0)
    partials = list(rng.standard_normal((t, s, h)))
    g_tp, g_sp = SimGroup(t, e=2), SimGroup(t, e=2)
    tp = tp_forward(partials, layer_norm, g_tp)
    sp = sp_forward(partials, layer_norm, g_sp)
    for a, b in zip(tp, sp):
        assert np.abs(a - b).max() == 0.0
    assert g_tp.bytes_sent.tolist() == [384.0] * t
    assert g_sp.bytes_sent.tolist() == [384.0] * t
    # a layer has two such regions: the lesson's 4 (t-1)/t s h e
    assert 2 * g_sp.bytes_sent[0] == cost.comm_bytes("sp", s, h, t, e=2)


@pytest.mark.parametrize("t", [1, 2, 3, 8])
def test_sp_equals_tp_for_token_wise_ops(t):
    rng = np.random.default_rng(t)
    partials = [rng.standard_normal((4 * t, 3, 5)) for _ in range(t)]
    ops = [layer_norm, lambda x: np.maximum(x, 0) * 0.9 + 1.0, np.tanh]
    for op in ops:
        g_tp, g_sp = SimGroup(t), SimGroup(t)
        tp, sp = tp_forward(partials, op, g_tp), sp_forward(partials, op, g_sp)
        assert max(np.abs(a - b).max() for a, b in zip(tp, sp)) == 0.0
        assert np.array_equal(g_tp.bytes_sent, g_sp.bytes_sent)


def test_sp_is_wrong_for_an_op_that_mixes_tokens():
    """Only token-wise ops may run on s/t tokens: a mean over tokens breaks."""
    rng = np.random.default_rng(1)
    partials = [rng.standard_normal((8, 4)) for _ in range(2)]
    mix = lambda x: x - x.mean(axis=0)
    tp, sp = tp_forward(partials, mix), sp_forward(partials, mix)
    assert np.abs(tp[0] - sp[0]).max() > 1e-3


def test_sp_rejects_tokens_not_divisible_by_t():
    with pytest.raises(ValueError, match="multiple of 4"):
        sp_forward([np.ones((6, 2))] * 4, layer_norm)
    with pytest.raises(ValueError, match="rank 1"):
        sp_forward([np.ones((8, 2)), np.ones((8, 3))], layer_norm)


# --------------------------------------------------------------------------- bad input
# (each case was found misbehaving before its validation was added)

def test_sp_forward_needs_a_token_wise_op():
    parts = [np.random.default_rng(0).standard_normal((4, 3)) for _ in range(2)]
    with pytest.raises(ValueError, match="token-wise"):
        sim.sp_forward(parts, lambda x: x.sum(0))      # used to gather a wrong (6,) result
    with pytest.raises(ValueError, match="token-wise"):
        sim.tp_forward(parts, lambda x: x[:1])
    with pytest.raises(ValueError, match="op must be a function"):
        sim.tp_forward(parts, None)
