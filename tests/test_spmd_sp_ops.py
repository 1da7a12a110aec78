"""Megatron's four SP/TP operators, each an autograd pair: the backward of each is the
collective paired with its forward (f: identity / all-reduce, g: all-reduce / identity,
SP gather: all-gather / reduce-scatter, SP scatter: reduce-scatter / all-gather).

Every rank r holds x_r = (r + 1) * base (a known function of the rank), pushes it through
the operator, and back-propagates dy_r = (r + 1) * ones, so the expected results are
written out by hand from the definitions of the collectives."""
import torch

from lesson10.spmd import launch
from lesson10.spmd.comm import count_bytes


def _ops_worker():
    import torch.distributed as dist
    from lesson10.spmd.sp import copy_to_tp, gather_from_sp, reduce_from_tp, reduce_scatter_to_sp

    r, n = dist.get_rank(), dist.get_world_size()
    b, s, h = 2, 4 * n, 3
    base = torch.arange(b * s * h, dtype=torch.float64).reshape(b, s, h)
    out = {}
    for name, fn, shape in (("copy_to_tp", copy_to_tp, (b, s, h)),
                            ("reduce_from_tp", reduce_from_tp, (b, s, h)),
                            ("gather_from_sp", gather_from_sp, (b, s // n, h)),
                            ("reduce_scatter_to_sp", reduce_scatter_to_sp, (b, s, h))):
        x = ((r + 1) * base[:, :shape[1]]).clone().requires_grad_(True)
        with count_bytes() as c:
            y = fn(x)
            fwd = c.sent
            y.backward(torch.full_like(y, float(r + 1)))
        out[name] = {"y": y.detach(), "dx": x.grad, "fwd": fwd, "bwd": c.sent - fwd}
    return out


def test_each_operator_is_a_forward_backward_pair():
    n = 2
    outs = launch(_ops_worker, n, quiet=True)
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
