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

RANK_JOBS = {"sp": lambda n: ("check_sp", CASES + ERRORS),
             "operators": lambda n: ("sp_operator_pairs", {}),
             # group=: 4 ranks as two independent groups of 2, each with its own data
             "groups": lambda n: ("split_groups", {"part": "sp"}) if n == 4 else ("whoami", {})}


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


def test_each_operator_is_a_forward_backward_pair(rank_results):
    """The backward of each operator is the collective paired with its forward (f: identity /
    all-reduce, g: all-reduce / identity, SP gather: all-gather / reduce-scatter, SP scatter:
    reduce-scatter / all-gather); every rank r holds x_r = (r + 1) * base and back-propagates
    dy_r = (r + 1) * ones, so the results are written out from the definitions."""
    import torch
    n = 2
    outs = rank_results(n, "operators")
    b, s, h, e = 2, 4 * n, 3, 8
    c = s // n
    base = torch.arange(b * s * h, dtype=torch.float64).reshape(b, s, h)
    tri = n * (n + 1) / 2                                   # sum over ranks of (r + 1)
    full = b * s * h * e
    for r, res in enumerate(outs):
        k = r + 1
        # f: identity forward, all-reduce backward
        assert torch.equal(res["copy_to_tp"]["y"], k * base)
        assert torch.equal(res["copy_to_tp"]["dx"], torch.full((b, s, h), tri, dtype=torch.float64))
        assert (res["copy_to_tp"]["fwd"], res["copy_to_tp"]["bwd"]) == (0, 2 * (n - 1) / n * full)
        # g: all-reduce forward, identity backward
        assert torch.equal(res["reduce_from_tp"]["y"], tri * base)
        assert torch.equal(res["reduce_from_tp"]["dx"], torch.full((b, s, h), k, dtype=torch.float64))
        assert (res["reduce_from_tp"]["fwd"], res["reduce_from_tp"]["bwd"]) == (2 * (n - 1) / n * full, 0)
        # SP gather: all-gather along s forward, reduce-scatter backward
        want = torch.cat([(j + 1) * base[:, :c] for j in range(n)], dim=1)
        assert torch.equal(res["gather_from_sp"]["y"], want)
        assert torch.equal(res["gather_from_sp"]["dx"], torch.full((b, c, h), tri, dtype=torch.float64))
        assert res["gather_from_sp"]["fwd"] == res["gather_from_sp"]["bwd"] == (n - 1) / n * full
        # SP scatter: reduce-scatter along s forward, all-gather backward
        assert torch.equal(res["reduce_scatter_to_sp"]["y"], tri * base[:, r * c:(r + 1) * c])
        want = torch.cat([torch.full((b, c, h), float(j + 1), dtype=torch.float64) for j in range(n)], 1)
        assert torch.equal(res["reduce_scatter_to_sp"]["dx"], want)
        assert res["reduce_scatter_to_sp"]["fwd"] == res["reduce_scatter_to_sp"]["bwd"] == (n - 1) / n * full


def test_groups_are_the_expected_ranks(rank_results):
    results = rank_results(4, "groups")
    assert [(o["group_rank"], o["group_size"]) for o in results] == [(0, 2), (1, 2), (0, 2), (1, 2)]


def test_sequence_parallel_block_inside_a_group(rank_results):
    """TP and TP + SP inside a group of 2 of 4 ranks match the reference on that group's data."""
    results, TOL = rank_results(4, "groups"), 1e-9
    for rank, out in enumerate(results):
        for (sp, p), err in out["sp"].items():
            assert err["plain"] < 1e-12, (rank, sp, p)           # the reference is the formula
            for key in ("out", "dx", "grads"):
                assert err[key] < TOL, (rank, sp, p, key, err)
