"""`group=` on real torch.distributed: 4 gloo ranks split into two independent groups of 2
(ranks {0, 1} and {2, 3}), each with its own data. SequenceParallelBlock (TP and TP + SP)
and ExpertParallelMoE inside a group must match a single-process reference over that
group's data only, in outputs and gradients. (Ring attention and Ulysses with group= are
in test_spmd_ring.py.) One launch for everything: starting ranks costs seconds. The worker
is a function of this module, which each rank imports by name.
"""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from lesson10.spmd import ExpertParallelMoE, SequenceParallelBlock, launch
from lesson10.spmd.moe import init_moe_weights, moe_reference
from lesson10.spmd.sp import ReferenceBlock, sp_shard

N, GROUP = 4, 2
B, S, H, FFN = 2, 8, 8, 16
MOE = dict(h=8, E=4, d_ff=6, k=2, T=6, cf=1.0, alpha=0.5)
TOL = 1e-9                                    # float64


def _maxerr(a, b):
    return float((a.detach() - b.detach()).abs().max())


def _plain_block(ref, x):
    """The block written out with torch.nn.functional (p = 0): x + W2 gelu(W1 LN(x) + b1) + b2."""
    z = F.layer_norm(x, (x.shape[-1],), ref.ln.weight, ref.ln.bias, ref.ln.eps)
    return x + F.linear(F.gelu(F.linear(z, ref.fc1.weight, ref.fc1.bias)), ref.fc2.weight, ref.fc2.bias)


def _sp_errors(group, r, t, seed, sp, p):
    ref = ReferenceBlock(H, FFN, p, seed=seed, dtype=torch.float64)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(B, S, H, generator=g, dtype=torch.float64)
    dy = torch.randn(B, S, H, generator=g, dtype=torch.float64)
    xr = x.clone().requires_grad_()
    yr = ref(xr)
    yr.backward(dy)
    plain = _maxerr(_plain_block(ref, x), yr) if p == 0 else 0.0
    blk = SequenceParallelBlock(H, FFN, sequence_parallel=sp, p=p, group=group, reference=ref)
    if sp:
        xl, dyl, tok = sp_shard(x, group), sp_shard(dy, group), slice(r * S // t, (r + 1) * S // t)
    else:
        xl, dyl, tok = x.clone(), dy, slice(None)
    xl.requires_grad_()
    y = blk(xl)
    y.backward(dyl)
    rows = slice(r * FFN // t, (r + 1) * FFN // t)
    rg = {n: q.grad for n, q in ref.named_parameters()}
    want = {"ln.weight": rg["ln.weight"], "ln.bias": rg["ln.bias"],
            "fc1.weight": rg["fc1.weight"][rows], "fc1.bias": rg["fc1.bias"][rows],
            "fc2.weight": rg["fc2.weight"][:, rows], "fc2.bias": rg["fc2.bias"]}
    got = {n: q.grad for n, q in blk.named_parameters()}
    assert set(got) == set(want)
    return {"out": _maxerr(y, yr[:, tok]), "dx": _maxerr(xl.grad, xr.grad[:, tok]),
            "grads": max(_maxerr(got[n], want[n]) for n in want), "plain": plain}


def _moe_errors(group, r, t, seed):
    h, E, d_ff, k, T, cf, alpha = (MOE[key] for key in ("h", "E", "d_ff", "k", "T", "cf", "alpha"))
    router_w, w1, w2 = init_moe_weights(h, E, d_ff, seed, torch.float64)
    g = torch.Generator().manual_seed(seed + 7)
    x = torch.randn(t * T, h, generator=g, dtype=torch.float64)      # the group's tokens
    dy = torch.randn(t * T, h, generator=g, dtype=torch.float64)
    layer = ExpertParallelMoE(h, E, d_ff, k, capacity_factor=cf, group=group, router_w=router_w,
                              w1=w1, w2=w2, alpha=alpha)
    xl = x[r * T:(r + 1) * T].clone().requires_grad_()
    y = layer(xl)
    ((y * dy[r * T:(r + 1) * T]).sum() + layer.aux_loss).backward()
    aux = layer.aux_loss.detach().clone()
    dist.all_reduce(aux, group=group)
    xr, rw, rw1, rw2 = (q.clone().requires_grad_() for q in (x, router_w, w1, w2))
    yr, auxr = moe_reference(xr, rw, rw1, rw2, k, cf, return_aux=True, alpha=alpha)
    ((yr * dy).sum() + auxr).backward()
    El = E // t
    mine = slice(r * El, (r + 1) * El)
    return {"y": _maxerr(y, yr[r * T:(r + 1) * T]), "dx": _maxerr(xl.grad, xr.grad[r * T:(r + 1) * T]),
            "router": _maxerr(layer.router_w.grad, rw.grad), "w1": _maxerr(layer.w1.grad, rw1.grad[mine]),
            "w2": _maxerr(layer.w2.grad, rw2.grad[mine]), "aux": abs(float(aux) - float(auxr)),
            "dropped": layer.dropped}


def group_worker():
    """In each of the 4 ranks: build both groups (every rank must), work inside its own."""
    rank = dist.get_rank()
    groups = [dist.new_group(list(range(i, i + GROUP))) for i in range(0, N, GROUP)]
    group, r = groups[rank // GROUP], rank % GROUP
    seed = 100 * (rank // GROUP)                # different data in the two groups
    return {"group_rank": dist.get_rank(group), "group_size": dist.get_world_size(group),
            "sp": {(sp, p): _sp_errors(group, r, GROUP, seed, sp, p)
                   for sp in (False, True) for p in (0.0, 0.3)},
            "moe": _moe_errors(group, r, GROUP, seed)}


@pytest.fixture(scope="module")
def results():
    return launch(group_worker, N, backend="gloo", timeout=120, quiet=True)


def test_groups_are_the_expected_ranks(results):
    assert [(o["group_rank"], o["group_size"]) for o in results] == [(0, 2), (1, 2), (0, 2), (1, 2)]


def test_sequence_parallel_block_inside_a_group(results):
    for rank, out in enumerate(results):
        for (sp, p), err in out["sp"].items():
            assert err["plain"] < 1e-12, (rank, sp, p)           # the reference is the formula
            for key in ("out", "dx", "grads"):
                assert err[key] < TOL, (rank, sp, p, key, err)


def test_expert_parallel_moe_inside_a_group(results):
    for rank, out in enumerate(results):
        err = out["moe"]
        for key in ("y", "dx", "router", "w1", "w2", "aux"):
            assert err[key] < TOL, (rank, key, err)
    assert any(out["moe"]["dropped"] > 0 for out in results)     # capacity 1.0 drops some copies
