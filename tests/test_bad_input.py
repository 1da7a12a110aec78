"""Bad input gets a clear ValueError (or CheckFailed) that says what to do: never a silent
wrong answer, a NaN, a crash of the interpreter or an obscure error from deep in NumPy/torch.

Every case here was found misbehaving (wrong answer, NaN, TypeError/IndexError/RuntimeError,
or a SIGFPE) before its validation was added. The multi-process cases share one launch.
"""
import contextlib
import io
import math

import numpy as np
import pytest
import torch

from lesson10 import checks, layouts, sim
from lesson10.checks import CheckFailed
from lesson10.spmd import attention as dattn
from lesson10.spmd import moe as dmoe

RNG = np.random.default_rng(0)


def _qkv(s=4, a=2, d=3):
    return (RNG.standard_normal((s, a, d)), RNG.standard_normal((s, a, d)),
            RNG.standard_normal((s, a, d)))


# --------------------------------------------------------------------------- layouts
def test_ring_time_rejects_complex_and_ragged_work():
    with pytest.raises(ValueError, match="real numbers"):
        layouts.ring_time([[1 + 5j, 2], [3, 4]])       # used to drop the imaginary part
    with pytest.raises(ValueError, match="rows of different lengths"):
        layouts.ring_time([[1, 2], [3]])
    with pytest.raises(ValueError, match="n \\(number of ranks\\) must be >= 1"):
        layouts.ring_source(0, 0, 0)                  # used to be a ZeroDivisionError


# --------------------------------------------------------------------------- sim attention
def test_sim_attention_rejects_complex_nan_and_empty_head_dim():
    q, k, v = _qkv()
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
    q, k, v = _qkv()
    pos = np.array([0.0, 1.0, np.nan, 3.0])            # NaN made every key visible
    with pytest.raises(ValueError, match="integer token ids"):
        sim.attention(q, k, v, causal=True, q_pos=pos)
    with pytest.raises(ValueError, match="integer token ids"):
        sim.attention(q, k, v, causal=True, q_pos=["a", "b", "c", "d"])


def test_sim_merge_rejects_nan_and_plus_inf_lse():
    q, k, v = _qkv()
    o, lse = sim.attention(q, k, v)
    for bad in (np.nan, np.inf):
        with pytest.raises(ValueError, match="NaN and \\+inf are not a logsumexp"):
            sim.merge(o, np.full_like(lse, bad), o, lse)
    with pytest.raises(ValueError, match="same shapes"):
        sim.merge(1.0, 2.0, 1.0, 2.0)                  # scalars used to "merge"
    o2, lse2 = sim.merge(o, np.full_like(lse, -np.inf), o, lse)   # -inf stays neutral
    np.testing.assert_allclose(o2, o, atol=1e-15)


# --------------------------------------------------------------------------- sim comm / sp
def test_simgroup_and_shards_reject_garbage():
    with pytest.raises(ValueError, match="bytes per element"):
        sim.SimGroup(2, e="2")
    g = sim.SimGroup(2)
    with pytest.raises(ValueError, match="real numbers"):
        g.all_reduce([None, None])
    with pytest.raises(ValueError, match="ragged"):
        g.all_reduce([[1, [2]], [1, [2]]])
    with pytest.raises(ValueError, match="axis must be an integer"):
        g.reduce_scatter([np.ones((4, 2))] * 2, axis=1.0)
    with pytest.raises(ValueError, match="axis must be an integer"):
        g.all_gather([np.ones((4, 2))] * 2, axis=None)
    with pytest.raises(ValueError, match="real numbers"):
        g.all_to_all([[None, None], [None, None]])    # used to ship object arrays
    with pytest.raises(ValueError, match="list of shards"):
        sim.gather_sequence(None, None)


def test_group_must_be_a_simgroup():
    q, k, v = _qkv(s=8, a=2)
    qs, pos = sim.shard_sequence(q, "contiguous", 2)
    for call in (lambda: sim.ring_attention(qs, qs, qs, pos, group=2),
                 lambda: sim.ulysses_attention(qs, qs, qs, pos, group=2),
                 lambda: sim.seq_to_heads(qs, 2),
                 lambda: sim.sp_forward([np.ones((4, 2))] * 2, np.tanh, 2),
                 lambda: sim.moe_layer([np.ones((2, 3))] * 2, np.ones((3, 2)),
                                       [lambda z: z] * 2, 1, group=2)):
        with pytest.raises(ValueError, match="group must be a SimGroup"):
            call()


def test_sp_forward_needs_a_token_wise_op():
    parts = [RNG.standard_normal((4, 3)) for _ in range(2)]
    with pytest.raises(ValueError, match="token-wise"):
        sim.sp_forward(parts, lambda x: x.sum(0))      # used to gather a wrong (6,) result
    with pytest.raises(ValueError, match="token-wise"):
        sim.tp_forward(parts, lambda x: x[:1])
    with pytest.raises(ValueError, match="op must be a function"):
        sim.tp_forward(parts, None)


def test_ulysses_helpers_reject_bad_heads():
    with pytest.raises(ValueError, match="a_kv must be an integer >= 1"):
        sim.kv_replication(4, 0, 2)
    with pytest.raises(ValueError, match="not a multiple"):
        sim.kv_replication(6, 4, 2)                     # used to answer 1
    with pytest.raises(ValueError, match="tokens, heads"):
        sim.heads_to_seq([np.float64(1.0)] * 2)
    # the guide's example: more ranks than K/V heads names the limit and ring attention
    q, k, _ = _qkv(s=8, a=4)
    kv = k[:, :2]
    with pytest.raises(ValueError, match="N_c <= n_kv.*ring attention"):
        sim.ulysses_attention(*(sim.shard_sequence(t, "contiguous", 4)[0] for t in (q, kv, kv)), "contiguous")


# --------------------------------------------------------------------------- sim MoE
def test_routing_rejects_non_finite_or_complex_logits():
    L = RNG.standard_normal((6, 4))
    for bad in (np.where(L > 1, np.nan, L), np.where(L > 1, np.inf, L), L + 1j):
        with pytest.raises(ValueError, match="logits"):
            sim.route_topk(bad, 2)
    with pytest.raises(ValueError, match="bias contains NaN"):
        sim.route_topk(L, 2, bias=np.array([np.nan, 0, 0, 0]))
    with pytest.raises(ValueError, match="logits contains NaN"):
        sim.router_probs(np.array([[np.nan, 1.0]]))


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


def test_moe_reference_and_layer_reject_garbage():
    h, E = 4, 4
    W = RNG.standard_normal((h, E))
    ex = sim.init_experts(E, h, 8)
    x = RNG.standard_normal((8, h))
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


# --------------------------------------------------------------------------- checks
def _right_then(transform, right):
    def student(*args, **kwargs):
        return transform(right(*args, **kwargs))
    return student


def _run_check(name, fn):
    with contextlib.redirect_stdout(io.StringIO()):
        getattr(checks, "check_" + name)(fn, seed=1)


@pytest.mark.parametrize("name,ref", [
    ("reduce_scatter", lambda xs: sim.SimGroup(len(xs)).reduce_scatter(xs)),
    ("merge", lambda *a: sim.merge(*a)),
    ("zigzag_positions", lambda s, n: layouts.shard_positions(s, n, "zigzag")),
])
def test_checks_reject_complex_and_text_arrays(name, ref):
    """A complex answer used to pass (its imaginary part was dropped), text was parsed."""
    def to(kind):
        def conv(r):
            if isinstance(r, (list, tuple)):
                return type(r)(conv(x) for x in r)
            return np.asarray(r) + 1j if kind == "complex" else np.asarray(r).astype(str)
        return conv
    _run_check(name, ref)                                   # the right answer passes
    for kind, msg in (("complex", "complex numbers"), ("text", "text")):
        with pytest.raises(CheckFailed, match=msg):
            _run_check(name, _right_then(to(kind), ref))


def test_checks_reject_complex_and_text_numbers():
    from lesson10 import cost
    right = lambda s, h, n, g=1, e=2: cost.comm_bytes("ulysses", s, h, n, g=g, e=e)  # noqa: E731
    _run_check("ulysses_bytes", right)
    for wrong, msg in ((lambda *a: right(*a) + 1j, "complex"),
                       (lambda *a: np.complex128(right(*a)), "complex"),
                       (lambda *a: np.asarray(right(*a)).astype(str), "text"),
                       (lambda *a: repr(right(*a)), "text")):
        with pytest.raises(CheckFailed, match=msg):
            _run_check("ulysses_bytes", wrong)


# --------------------------------------------------------------------------- dist, one process
def _t(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(len(shape)), dtype=dtype)


def test_dist_local_attention_on_empty_blocks_does_not_crash():
    """The CPU flash kernel kills the process (SIGFPE) on a zero-length sequence."""
    q, k, v = _t(1, 4, 2, 3), _t(1, 4, 2, 3), _t(1, 4, 2, 3)
    out, lse = dattn.local_attention(q, k[:, :0], v[:, :0])
    assert out.shape == q.shape and torch.all(out == 0) and torch.all(lse == -math.inf)
    out, lse = dattn.local_attention(q[:, :0], k, v, impl="kernel")
    assert out.shape == (1, 0, 2, 3) and lse.shape == (1, 2, 0)
    dq, dk, dv = dattn.local_attention_backward(q, q, k[:, :0], v[:, :0], out=torch.zeros_like(q),
                                                lse=torch.full((1, 2, 4), -math.inf))
    assert dk.shape == (1, 0, 2, 3) and torch.all(dq == 0)


def test_dist_attention_rejects_bad_dtypes_and_args():
    q, k, v = _t(1, 4, 2, 3), _t(1, 4, 2, 3), _t(1, 4, 2, 3)
    for fn in (dattn.attention, dattn.local_attention):
        with pytest.raises(ValueError, match="floating-point"):
            fn(q.long(), k.long(), v.long())
        with pytest.raises(ValueError, match="floating-point"):
            fn(q.cfloat(), k.cfloat(), v.cfloat())          # used to return complex output
        with pytest.raises(ValueError, match="mixed dtypes"):
            fn(q, k.double(), v)
        with pytest.raises(ValueError, match="torch.Tensor"):
            fn(q.numpy(), k.numpy(), v.numpy())
        with pytest.raises(ValueError, match="head dim d"):
            fn(q[..., :0], k[..., :0], v[..., :0])
        with pytest.raises(ValueError, match="integer token ids"):
            fn(q, k, v, causal=True, q_pos=torch.tensor([0.0, 1, float("nan"), 3]),
               k_pos=torch.arange(4))
    with pytest.raises(ValueError, match="impl must be one of"):
        dattn.local_attention(q, k, v, impl="fast")         # used to fall back silently
    out, lse = dattn.local_attention(q, k, v)
    with pytest.raises(ValueError, match="lse must be \\(b, a, s_q\\)"):
        dattn.local_attention_backward(q, q, k, v, out, lse.transpose(1, 2))
    with pytest.raises(ValueError, match="shape of q"):
        dattn.local_attention_backward(q[:, :2], q, k, v, out, lse)
    o, l = dattn.attention(q, k, v)
    with pytest.raises(ValueError, match="transpose it"):
        dattn.merge(o, l.transpose(1, 2), o, l.transpose(1, 2))


def test_dist_moe_single_process_rejects_bad_args():
    L = _t(6, 4)
    with pytest.raises(ValueError, match="must be an integer between 1"):
        dmoe.route_topk(L, 2.0)
    with pytest.raises(ValueError, match="must be an integer between 1"):
        dmoe.route_topk(L, None)
    with pytest.raises(ValueError, match="floating-point tensor \\(T, E\\)"):
        dmoe.route_topk(L[0], 1)
    with pytest.raises(ValueError, match="one entry per expert"):
        dmoe.route_topk(L, 2, bias=torch.zeros(3))
    rw, w1, w2 = dmoe.init_moe_weights(4, 4, 8)
    x = _t(8, 4)
    with pytest.raises(ValueError, match="cast x"):
        dmoe.moe_reference(x.double(), rw, w1, w2, 2)
    with pytest.raises(ValueError, match="h = 3"):
        dmoe.moe_reference(x[:, :3], rw, w1, w2, 2)
    with pytest.raises(ValueError, match="E = 0"):
        dmoe.moe_reference(x, rw[:, :0], w1[:0], w2[:0], 1)
    # numpy scalars are numbers, as in lesson10.sim
    y = dmoe.moe_reference(x, rw, w1, w2, 2, np.float32(1.0))
    y64 = dmoe.moe_reference(x, rw, w1, w2, 2, 1.0)
    assert torch.equal(y, y64)


# --------------------------------------------------------------------------- dist, real ranks
def bad_input_worker():
    """Run every multi-process bad-input case in this rank; return {case: (outcome, text)}.

    Each case either raises the same error on every rank (before or inside a shape check
    that all ranks join) or runs to the end on every rank, so no case leaves a rank
    waiting in a collective."""
    from lesson10.spmd import (ExpertParallelMoE, gather_sequence, ring_attention,
                               shard_sequence, ulysses_attention)
    rank = torch.distributed.get_rank()
    res = {}

    def case(name, fn):
        try:
            res[name] = ("ok", fn())
        except Exception as e:  # noqa: BLE001 - the outcome is what we test
            res[name] = (type(e).__name__, str(e))

    q = _t(1, 4, 2, 3)
    case("ring int", lambda: ring_attention(q.long(), q.long(), q.long()))
    case("ring shards differ", lambda: ring_attention(*[_t(1, 4 + 2 * rank, 2, 3)] * 3))
    case("ring empty", lambda: tuple(ring_attention(*[_t(1, 0, 2, 3)] * 3).shape))
    case("ulysses misspelled layout", lambda: ulysses_attention(q, q, q, causal=False,
                                                                layout="zigzog"))
    case("ulysses more ranks than kv heads", lambda: ulysses_attention(q, q[:, :, :1], q[:, :, :1]))
    x = _t(1, 8, 2, 3)
    case("shard dim out of range", lambda: shard_sequence(x, "zigzag", dim=7))   # was dim 3
    case("shard numpy", lambda: shard_sequence(x.numpy(), "zigzag"))
    case("gather shards differ",                    # gloo used to abort the process
         lambda: gather_sequence(_t(1, 4 + 2 * rank, 2, 3), "contiguous"))
    case("moe k float", lambda: ExpertParallelMoE(4, 4, 8, 2.0))
    case("moe E % Ne", lambda: ExpertParallelMoE(4, 3, 8, 1))
    case("moe cf nan", lambda: ExpertParallelMoE(4, 4, 8, 2, capacity_factor=float("nan")))
    case("moe alpha nan", lambda: ExpertParallelMoE(4, 4, 8, 2, alpha=float("nan")))
    case("moe dtype str", lambda: ExpertParallelMoE(4, 4, 8, 2, dtype="float32"))
    rw, w1, w2 = dmoe.init_moe_weights(4, 4, 8)
    case("moe numpy weights", lambda: ExpertParallelMoE(4, 4, 8, 2, router_w=rw.numpy(),
                                                        w1=w1.numpy(), w2=w2.numpy()))

    def wrong_dtype():
        return ExpertParallelMoE(4, 4, 8, 2)(_t(5, 4, dtype=torch.float64))
    case("moe x float64", wrong_dtype)

    def no_tokens():
        layer = ExpertParallelMoE(4, 4, 8, 2, capacity_factor=1.0)
        y = layer(_t(0, 4))
        case("moe update_bias nan", lambda: layer.update_bias(float("nan")))
        return tuple(y.shape), float(layer.aux_loss)
    case("moe no tokens", no_tokens)
    return res


def test_multi_process_bad_inputs():
    from lesson10.spmd.launch import launch
    outs = launch(bad_input_worker, 2, timeout=120, quiet=True)
    for r, res in enumerate(outs):
        def err(name, msg):
            kind, text = res[name]
            assert kind == "ValueError" and msg in text, (r, name, kind, text)
        err("ring int", "floating-point")
        err("ring shards differ", "different shapes or dtypes on the ranks")
        assert res["ring empty"] == ("ok", (1, 0, 2, 3)), res["ring empty"]
        err("ulysses misspelled layout", "unknown layout 'zigzog'")
        err("ulysses more ranks than kv heads", "Use ring attention")
        err("shard dim out of range", "pass the sequence dim")
        err("shard numpy", "torch.as_tensor")
        err("gather shards differ", "every rank must pass its s/n tokens")
        err("moe k float", "must be an integer between 1")
        err("moe E % Ne", "E a multiple of N_e")
        err("moe cf nan", "capacity_factor must be a number > 0")
        err("moe x float64", "pass x.to(torch.float32)")
        err("moe alpha nan", "alpha must be a finite number")
        err("moe dtype str", "floating torch.dtype")
        err("moe numpy weights", "floating-point torch.Tensor")
        err("moe update_bias nan", "rate must be a finite number")
        kind, (shape, aux) = res["moe no tokens"]          # aux loss used to be NaN
        assert kind == "ok" and shape == (0, 4) and aux == 0.0


def test_launch_rejects_bad_timeout_and_threads():
    """These used to fail deep inside TCPStore / timedelta, or in every rank after spawning."""
    from lesson10.spmd.launch import launch
    for timeout in (float("nan"), -1, 0, "10", float("inf")):
        with pytest.raises(ValueError, match="timeout must be a finite number of seconds"):
            launch(bad_input_worker, 2, timeout=timeout, quiet=True)
    with pytest.raises(ValueError, match="threads must be None"):
        launch(bad_input_worker, 2, threads=0, quiet=True)
