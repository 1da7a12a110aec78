"""Megatron SP on gloo: SequenceParallelBlock as TP and as TP+SP matches the single-process
block in outputs and every gradient (LayerNorm included), and both modes send the same
activation bytes, equal to lesson10.cost; SP adds one re-gather of the fc1 input in the
backward ("ag_recompute")."""
import pytest

from lesson10 import cost
from lesson10.spmd import _workers as w

B, S, H, FFN = 2, 8, 8, 16
CASES = [dict(b=B, s=S, h=H, ffn=FFN, sp=sp, p=p, dtype=dt)
         for sp in (False, True) for p in (0.0, 0.3) for dt in ("float64", "float32")]
ERRORS = [dict(b=1, s=S + 1, h=H, ffn=FFN, sp=True),        # s not divisible by t
          dict(b=1, s=S, h=H, ffn=FFN + 1, sp=False)]       # ffn not divisible by t
TOL = {"float64": 1e-9, "float32": 1e-4}


w.register("sp", "sp_cases", lambda n: (CASES + ERRORS,))


@pytest.fixture(scope="module", params=[2, 4])
def run(request):
    n = request.param
    return n, w.registered_results(n, "sp")


def test_outputs_and_gradients_match_reference(run):
    n, outs = run
    for rank_out in outs:
        for res in rank_out[:len(CASES)]:
            tol = TOL[res["case"]["dtype"]]
            assert res["out_err"] < tol, res
            assert res["dx_err"] < tol, res
            for name, err in res["grad_err"].items():
                assert err < tol, (name, res)


def test_dropout_is_active_and_sharding_invariant(run):
    n, outs = run
    for rank_out in outs:
        for res in rank_out[:len(CASES)]:
            if res["case"]["p"]:
                assert 0.1 < res["dropped"] < 0.6      # about p = 0.3 of the elements dropped


SIDE = ("param_grad", "metadata", "ag_recompute")


def _activation_bytes(by_op):
    """Bytes of the TP/SP activation collectives (the lesson's count), without the side ops."""
    return sum(v for k, v in by_op.items() if k not in SIDE)


def test_tp_and_sp_send_the_same_bytes_as_the_lesson(run):
    n, outs = run
    for rank_out in outs:
        by_case = {(r["case"]["sp"], r["case"]["p"], r["case"]["dtype"]): r for r in rank_out[:len(CASES)]}
        for (sp, p, dt), res in by_case.items():
            e = 8 if dt == "float64" else 4
            # one block (the MLP half of a layer): half of the per-layer value, times b
            want = cost.comm_bytes("sp", S, H, n, e=e) / 2 * B
            assert _activation_bytes(res["fwd"]) == want
            assert _activation_bytes(res["bwd"]) == want
            tp = by_case[(False, p, dt)]
            assert _activation_bytes(res["fwd"]) == _activation_bytes(tp["fwd"])
            assert _activation_bytes(res["bwd"]) == _activation_bytes(tp["bwd"])
            if sp:
                assert set(res["fwd"]) - {"metadata"} == {"all_gather", "reduce_scatter"}
                assert set(res["bwd"]) == {"all_gather", "reduce_scatter", "ag_recompute", "param_grad"}
                # LayerNorm weight+bias and the row-parallel bias: 3h gradients all-reduced
                assert res["bwd"]["param_grad"] == cost.all_reduce_bytes(3 * H * e, n)
                # the fc1 input, kept as its s/t shard, is all-gathered again in the
                # backward: (t-1)/t of the (b, s, h) LayerNorm output, per rank
                assert res["bwd"]["ag_recompute"] == (n - 1) * B * S * H * e / n
                assert "ag_recompute" not in res["fwd"]
            else:
                assert set(res["fwd"]) == {"all_reduce"} and set(res["bwd"]) == {"all_reduce"}


def test_dropout_saves_only_a_one_byte_mask():
    import torch

    from lesson10.spmd.sp import token_dropout
    b, s, h, p = 2, 6, 4, 0.5
    x = torch.randn(b, s, h, dtype=torch.float64, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = token_dropout(x * 1.0, p, seed=7, positions=torch.arange(s), seq_len=s)
    assert [(t.dtype, t.element_size(), tuple(t.shape)) for t in saved] == [(torch.bool, 1, (b, s, h))]
    keep = saved[0]
    assert torch.equal(y, x * keep / (1 - p))
    dy = torch.randn(b, s, h, dtype=torch.float64)
    y.backward(dy)
    assert torch.equal(x.grad, dy * keep / (1 - p))
    assert 0 < keep.sum() < keep.numel()


def test_bad_input_errors(run):
    n, outs = run
    for rank_out in outs:
        e_seq, e_ffn = (r["error"] for r in rank_out[len(CASES):])
        assert "multiple" in e_seq and "s = 9" in e_seq
        assert "ffn" in e_ffn and "multiple" in e_ffn
