"""Tests of lesson10.spmd.attention: reference, merge, fast local kernel (one process), and the
one signature of the family: every attention method of the registry, on real ranks, exact for
a random permutation passed as ``layout=`` (the shared launch, ``RANK_JOBS``)."""
import math

import pytest
import torch

from lesson10.runs import registry
from lesson10.spmd import attention as dattn
from lesson10.spmd.attention import attention, local_attention, local_attention_backward, merge

PERMUTED = [dict(causal=True), dict(causal=False), dict(causal=True, docs=[5, 11, 8])]
RANK_JOBS = {"unseen_layout": lambda n: ("unseen_layout", PERMUTED)}


def _naive(q, k, v, causal, q_pos=None, k_pos=None):
    """Independent reference: loops over heads, torch.softmax, K/V heads by index h // g."""
    b, sq, a, d = q.shape
    g = a // k.shape[2]
    q_pos = torch.arange(sq) if q_pos is None else torch.as_tensor(q_pos)
    k_pos = torch.arange(k.shape[1]) if k_pos is None else torch.as_tensor(k_pos)
    outs, lses = [], []
    for h in range(a):
        x = q[:, :, h] @ k[:, :, h // g].transpose(1, 2) / math.sqrt(d)
        if causal:
            x = x.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
        outs.append(torch.softmax(x, -1) @ v[:, :, h // g])
        lses.append(torch.logsumexp(x, -1))
    return torch.stack(outs, 2), torch.stack(lses, 2)


def _qkv(b=2, s=9, a=4, a_kv=2, d=8, sk=None, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    sk = s if sk is None else sk
    return (torch.randn(b, s, a, d, generator=g, dtype=dtype),
            torch.randn(b, sk, a_kv, d, generator=g, dtype=dtype),
            torch.randn(b, sk, a_kv, d, generator=g, dtype=dtype))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("a_kv", [4, 2, 1])
def test_reference_matches_naive(causal, a_kv):
    q, k, v = _qkv(a_kv=a_kv)
    out, lse = attention(q, k, v, causal=causal)
    o2, l2 = _naive(q, k, v, causal)
    assert out.shape == q.shape and lse.shape == q.shape[:3]
    assert torch.allclose(out, o2, atol=1e-12) and torch.allclose(lse, l2, atol=1e-12)


def test_positions_and_empty_rows_are_nan_free():
    q, k, v = _qkv(s=4, a=2, a_kv=2)
    q_pos, k_pos = [0, 1, 5, 6], [2, 3, 4, 5]         # queries 0 and 1 see no key
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    out, lse = attention(qr, kr, vr, causal=True, q_pos=q_pos, k_pos=k_pos)
    assert torch.isinf(lse[:, :2]).all() and (lse[:, :2] < 0).all()
    assert (out[:, :2] == 0).all()
    o2, _ = _naive(q[:, 2:], k, v, True, q_pos[2:], k_pos)
    assert torch.allclose(out[:, 2:], o2, atol=1e-12)
    (out.sum() + lse[:, 2:].sum()).backward()
    assert all(torch.isfinite(t.grad).all() for t in (qr, kr, vr))


def test_merge_of_disjoint_key_sets_is_exact_and_commutative():
    q, k, v = _qkv(s=10, sk=10)
    pos = torch.arange(10)
    full_o, full_l = attention(q, k, v, causal=True)
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(3))
    a_idx, b_idx = perm[:4].sort().values, perm[4:].sort().values
    oa, la = attention(q, k[:, a_idx], v[:, a_idx], True, pos, pos[a_idx])
    ob, lb = attention(q, k[:, b_idx], v[:, b_idx], True, pos, pos[b_idx])
    assert torch.isinf(la).any() or torch.isinf(lb).any()   # some queries see nothing in a set
    for o, l in (merge(oa, la, ob, lb), merge(ob, lb, oa, la)):
        assert o.dtype == torch.float64
        assert torch.allclose(o, full_o, atol=1e-12) and torch.allclose(l, full_l, atol=1e-12)


def test_merge_edge_cases():
    o1, o2 = torch.randn(3, 2, 4), torch.randn(3, 2, 4)
    ninf = torch.full((3, 2), float("-inf"))
    big = torch.full((3, 2), 1e4)
    o, l = merge(o1, big, o2, ninf)                       # empty side has weight 0
    assert o.dtype == torch.float32 and torch.equal(o, o1) and torch.equal(l, big)
    o, l = merge(o1, ninf, o2, ninf)                      # nothing seen at all
    assert (o == 0).all() and torch.isinf(l).all() and not torch.isnan(o).any()
    o, l = merge(o1, big, o2, big)                        # equal weights, no overflow
    assert torch.allclose(o, (o1 + o2) / 2) and torch.allclose(l, big + math.log(2))


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
@pytest.mark.parametrize("impl", ["kernel", "einsum"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("a_kv", [4, 2])
def test_local_attention_and_backward_match_autograd(dtype, tol, impl, causal, a_kv):
    q, k, v = _qkv(a_kv=a_kv, dtype=dtype)
    dout = torch.randn(q.shape, dtype=dtype, generator=torch.Generator().manual_seed(1))
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    ref, ref_lse = _naive(qr, kr, vr, causal)
    ref.backward(dout)
    out, lse = local_attention(q, k, v, causal=causal, impl=impl)
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1])         # (b, a, s)
    assert torch.allclose(out, ref, atol=tol) and torch.allclose(lse.transpose(1, 2), ref_lse, atol=tol)
    dq, dk, dv = local_attention_backward(dout, q, k, v, out, lse, causal=causal, impl=impl)
    for got, want in ((dq, qr.grad), (dk, kr.grad), (dv, vr.grad)):
        assert got.shape == want.shape and torch.allclose(got, want, atol=10 * tol)


@pytest.mark.parametrize("impl", ["kernel", "einsum"])
def test_block_backward_with_final_lse_sums_to_full_gradient(impl):
    """Ring attention's backward: each key block's share, from the final (out, lse)."""
    q, k, v = _qkv(s=8, a_kv=2)
    dout = torch.randn(q.shape, dtype=q.dtype)
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    ref, _ = _naive(qr, kr, vr, False)
    ref.backward(dout)
    out, lse = local_attention(q, k, v)
    dq = torch.zeros_like(q)
    dks, dvs = [], []
    for blk in (slice(0, 3), slice(3, 8)):
        g = local_attention_backward(dout, q, k[:, blk], v[:, blk], out, lse, impl=impl)
        dq += g[0]
        dks.append(g[1])
        dvs.append(g[2])
    assert torch.allclose(dq, qr.grad, atol=1e-12)
    assert torch.allclose(torch.cat(dks, 1), kr.grad, atol=1e-12)
    assert torch.allclose(torch.cat(dvs, 1), vr.grad, atol=1e-12)


def test_auto_uses_einsum_for_masks_the_kernel_cannot_express():
    q, k, v = _qkv(s=4)
    q_pos, k_pos = [0, 1, 6, 7], [2, 3, 4, 5]
    out, lse = local_attention(q, k, v, causal=True, q_pos=q_pos, k_pos=k_pos)
    o2, l2 = attention(q, k, v, causal=True, q_pos=q_pos, k_pos=k_pos)
    assert torch.allclose(out, o2) and torch.equal(torch.isinf(lse), torch.isinf(l2.transpose(1, 2)))
    with pytest.raises(ValueError, match="cannot express"):
        local_attention(q, k, v, causal=True, q_pos=q_pos, k_pos=k_pos, impl="kernel")


def test_bad_shapes_raise_clear_errors():
    q, k, v = _qkv(a=4, a_kv=4)
    with pytest.raises(ValueError, match="multiple"):
        attention(q, k[:, :, :3], v[:, :, :3])
    with pytest.raises(ValueError, match="same shape"):
        attention(q, k, v[:, :5])
    with pytest.raises(ValueError, match="4-D"):
        local_attention(q[0], k[0], v[0])


@pytest.mark.parametrize("causal,docs", [(True, False), (False, True), (True, True), (False, False)])
def test_visible_is_the_torch_form_of_layouts_visible(causal, docs):
    import numpy as np

    from lesson10 import layouts
    from lesson10.spmd.attention import visible
    rng = np.random.default_rng(int(causal) + 2 * int(docs))
    q_pos, k_pos = rng.permutation(16)[:6], rng.permutation(16)[:9]
    doc_ids = np.repeat([0, 1, 2, 3], 4) if docs else None
    mask = visible(q_pos, k_pos, causal, doc_ids)
    want = layouts.visible(q_pos, k_pos, causal, doc_ids)
    if mask is None:                                   # no mask: every key visible
        assert want.all()
    else:
        assert np.array_equal(mask.numpy(), want) and not want.all()


# --------------------------------------------------------------------------- bad input
# (each case was found misbehaving before its validation was added)
def _bad_t(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(len(shape)), dtype=dtype)


def test_dist_local_attention_on_empty_blocks_does_not_crash():
    """The CPU flash kernel kills the process (SIGFPE) on a zero-length sequence."""
    q, k, v = _bad_t(1, 4, 2, 3), _bad_t(1, 4, 2, 3), _bad_t(1, 4, 2, 3)
    out, lse = dattn.local_attention(q, k[:, :0], v[:, :0])
    assert out.shape == q.shape and torch.all(out == 0) and torch.all(lse == -math.inf)
    out, lse = dattn.local_attention(q[:, :0], k, v, impl="kernel")
    assert out.shape == (1, 0, 2, 3) and lse.shape == (1, 2, 0)
    dq, dk, dv = dattn.local_attention_backward(q, q, k[:, :0], v[:, :0], out=torch.zeros_like(q),
                                                lse=torch.full((1, 2, 4), -math.inf))
    assert dk.shape == (1, 0, 2, 3) and torch.all(dq == 0)


def test_dist_attention_rejects_bad_dtypes_and_args():
    q, k, v = _bad_t(1, 4, 2, 3), _bad_t(1, 4, 2, 3), _bad_t(1, 4, 2, 3)
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


@pytest.mark.parametrize("n", [2, 4])
def test_every_attention_method_is_exact_for_a_random_permutation(rank_results, n):
    """Each attention method of ``registry.METHODS`` (ring, ulysses, allgather, usp) with a
    random permutation of the tokens as ``layout=`` positions, and the striped layout by name:
    output and gradients match one process, causal or not, with a document mask too; and
    ``shard_sequence`` / ``gather_sequence`` take the same positions."""
    out = rank_results(n, "unseen_layout")
    assert len(out) == n
    held = sorted(p for rank_rows in out for p in rank_rows[0]["positions"])
    assert held == list(range(24)) and out[0][0]["positions"] != sorted(out[0][0]["positions"])
    methods = registry.attention_names()
    assert {"ring", "ulysses", "allgather", "usp"} <= set(methods)
    for rank_rows in out:
        assert len(rank_rows) == len(PERMUTED)
        for row in rank_rows:
            assert row["methods"] == list(methods)
            assert set(row["errors"]) == {f"{m}/{lay}" for m in (*methods, "shard", "gather")
                                          for lay in ("permutation", "striped")}
            assert max(row["errors"].values()) < 1e-9, row


def test_every_attention_method_has_the_family_signature():
    """``X_attention(q, k, v, causal=True, layout=..., group=None, *, doc_ids=None, ...)``."""
    import inspect
    for name in registry.attention_names():
        params = inspect.signature(registry.get(name).spmd_function()).parameters
        assert list(params)[:6] == ["q", "k", "v", "causal", "layout", "group"], name
        assert params["causal"].default is True and params["group"].default is None, name
        assert params["doc_ids"].kind is inspect.Parameter.KEYWORD_ONLY, name
        assert params["doc_ids"].default is None, name
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in list(params.values())[6:]), name
