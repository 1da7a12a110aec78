"""Ulysses with one q/k/v all-to-all, pipelined by head groups (lesson10.spmd.ulysses_pipeline):
outputs and gradients equal the unfused Ulysses (bitwise in float64 here: the same kernel on the
same numbers) and full attention on one process, the bytes are the unfused ones, and a head
group count that does not divide a rank's heads is refused with the counts that work."""
import pytest
import torch

S, D = 16, 4


def cases(n):
    """(name, kwargs): layouts, causal or not, GQA compact and replicated, 1/2/all head groups."""
    out = []
    for layout in ("contiguous", "zigzag", "striped"):
        for causal in (True, False):
            out.append(dict(b=2, a=2 * n, a_kv=2 * n, causal=causal, layout=layout, groups=2))
    out += [dict(b=1, a=4 * n, a_kv=2 * n, causal=True, layout="zigzag", groups=2),     # GQA
            dict(b=1, a=4 * n, a_kv=2 * n, causal=True, layout="contiguous", groups=1),
            dict(b=1, a=4 * n, a_kv=4 * n, causal=True, layout="contiguous", groups=4),
            dict(b=1, a=2 * n, a_kv=1, causal=True, layout="zigzag", groups=1, replicate_kv=True),
            dict(b=2, a=2 * n, a_kv=2 * n, causal=True, layout="zigzag", groups=2,
                 dtype=torch.float32)]
    return out


def compare_worker(case_list):
    """In each rank: per case, max |fused - unfused| and max |fused - full attention| of the
    output and the three gradients, the forward and backward bytes of both, and the errors of
    head group counts that do not divide."""
    from lesson10.spmd.attention import attention
    from lesson10.spmd.comm import count_bytes
    from lesson10.spmd.shard import local_positions, shard_sequence
    from lesson10.spmd.ulysses import ulysses_attention
    rows = []
    for c in case_list:
        dt = c.get("dtype", torch.float64)
        g = torch.Generator().manual_seed(7)
        q, dout = (torch.randn(c["b"], S, c["a"], D, generator=g, dtype=torch.float64).to(dt)
                   for _ in range(2))
        k, v = (torch.randn(c["b"], S, c["a_kv"], D, generator=g, dtype=torch.float64).to(dt)
                for _ in range(2))
        ref = [t.double().detach().requires_grad_() for t in (q, k, v)]
        o_ref, _ = attention(*ref, causal=c["causal"])
        o_ref.backward(dout.double())
        pos = local_positions(S, c["layout"])
        got = {}
        for fused in (False, True):
            loc = [shard_sequence(t, c["layout"]).detach().requires_grad_() for t in (q, k, v)]
            with count_bytes() as fwd:
                o = ulysses_attention(*loc, causal=c["causal"], layout=c["layout"], fused=fused,
                                      head_groups=c["groups"] if fused else 1,
                                      replicate_kv=c.get("replicate_kv", False))
            with count_bytes() as bwd:
                o.backward(shard_sequence(dout, c["layout"]))
            got[fused] = ([o.detach()] + [t.grad for t in loc], fwd.by_op, bwd.by_op)
        full = [o_ref.detach()[:, pos]] + [t.grad[:, pos] for t in ref]
        rows.append({"vs_unfused": max(float((a - b).abs().max()) for a, b in zip(got[True][0], got[False][0])),
                     "vs_full": max(float((a.double() - b).abs().max()) for a, b in zip(got[True][0], full)),
                     "bytes": (got[True][1], got[True][2], got[False][1], got[False][2])})
    return rows, _refusals()


def _refusals():
    """The errors of head group counts that are refused (4 query heads, 2 K/V heads a rank)."""
    import torch.distributed as dist

    from lesson10.spmd.ulysses import ulysses_attention
    n = dist.get_world_size()
    q = torch.randn(1, 4, 4 * n, D, dtype=torch.float64)
    kv = torch.randn(1, 4, 2 * n, D, dtype=torch.float64)
    errs = {}
    for groups in (3, 4, 0, 1.5):
        try:
            ulysses_attention(q, kv, kv, head_groups=groups)
        except ValueError as e:
            errs[groups] = str(e)
    return errs


@pytest.fixture(scope="module", params=[2, 4])
def run(request):
    from lesson10.spmd.launch import launch
    n = request.param
    return n, launch(compare_worker, n, cases(n), timeout=900, quiet=True)


def test_fused_equals_unfused_and_full_attention(run):
    n, outs = run
    for rows, _ in outs:
        assert len(rows) == len(cases(n))
        for case, row in zip(cases(n), rows):
            tol = 1e-5 if case.get("dtype") == torch.float32 else 1e-12
            assert row["vs_unfused"] <= tol, (case, row)
            assert row["vs_full"] <= tol, (case, row)


def test_fused_sends_the_unfused_bytes(run):
    n, outs = run
    for rows, _ in outs:
        for case, row in zip(cases(n), rows):
            f_fwd, f_bwd, u_fwd, u_bwd = row["bytes"]
            assert f_fwd == u_fwd and f_bwd == u_bwd and f_fwd["all_to_all"] > 0, (case, row)


def test_head_groups_that_do_not_divide_are_refused(run):
    n, outs = run
    for _, errs in outs:
        assert set(errs) == {3, 4, 0, 1.5}                 # 4 divides 4 query heads, not 2 K/V
        assert "must divide the 4 query heads and the 2 K/V heads" in errs[3]
        assert "use one of [1, 2]" in errs[4]
        assert "positive int" in errs[0] and "positive int" in errs[1.5]
