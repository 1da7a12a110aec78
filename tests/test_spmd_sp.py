"""Megatron SP on gloo: SequenceParallelBlock as TP and as TP+SP matches the single-process
block in outputs and every gradient (LayerNorm included), and both modes send the same
activation bytes, equal to lesson10.cost; SP adds one re-gather of the fc1 input in the
backward ("ag_recompute")."""
import pytest

from lesson10 import cost

B, S, H, FFN = 2, 8, 8, 16
CASES = [dict(b=B, s=S, h=H, ffn=FFN, sequence_parallel=sp, p=p, dtype=dt, blocks=1)
         for sp in (False, True) for p in (0.0, 0.3) for dt in ("float64", "float32")]
ERRORS = [dict(b=1, s=S + 1, h=H, ffn=FFN, sequence_parallel=True),   # s not divisible by t
          dict(b=1, s=S, h=H, ffn=FFN + 1, sequence_parallel=False)]  # ffn not divisible by t

RANK_JOBS = {"sp": lambda n: ("check_sp", CASES + ERRORS)}


@pytest.fixture(scope="module", params=[2, 4])
def run(request, rank_results):
    n = request.param
    return n, rank_results(n, "sp")


def test_outputs_and_gradients_match_reference(run):
    n, outs = run
    for rank_out in outs:
        for res in rank_out[:len(CASES)]:
            assert res["ok"] and res["max_err"] <= res["tol"], res
            assert {"out", "dx", "grad 0.ln.weight", "grad 0.fc1.weight", "grad 0.fc2.bias"} <= set(res["err"])


def test_dropout_is_active_and_sharding_invariant(run):
    n, outs = run
    for rank_out in outs:
        for res in rank_out[:len(CASES)]:
            if res["case"]["p"]:
                assert 0.1 < res["dropped"] < 0.6      # about p = 0.3 of the elements dropped


def test_tp_and_sp_send_the_same_bytes_as_the_lesson(run):
    n, outs = run
    for rank_out in outs:
        by_case = {(r["case"]["sequence_parallel"], r["case"]["p"], r["case"]["dtype"]): r
                   for r in rank_out[:len(CASES)]}
        for (sp, p, dt), res in by_case.items():
            e = 8 if dt == "float64" else 4
            # one block (the MLP half of a layer): half of the per-layer value, times b
            want = cost.comm_bytes("sp", S, H, n, e=e) / 2 * B
            assert res["fwd"] == want == res["formula_fwd"]
            assert res["bwd"] == want
            tp = by_case[(False, p, dt)]
            assert res["fwd"] == tp["fwd"] and res["bwd"] == tp["bwd"]
            fwd, bwd = res["fwd_by_op"], res["bwd_by_op"]
            if sp:
                assert set(fwd) - {"metadata"} == {"all_gather", "reduce_scatter"}
                assert set(bwd) == {"all_gather", "reduce_scatter", "ag_recompute", "param_grad"}
                # LayerNorm weight+bias and the row-parallel bias: 3h gradients all-reduced
                assert bwd["param_grad"] == cost.all_reduce_bytes(3 * H * e, n)
                # the fc1 input, kept as its s/t shard, is all-gathered again in the
                # backward: (t-1)/t of the (b, s, h) LayerNorm output, per rank
                assert bwd["ag_recompute"] == (n - 1) * B * S * H * e / n
                assert "ag_recompute" not in fwd
            else:
                assert set(fwd) == {"all_reduce"} and set(bwd) == {"all_reduce"}


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
