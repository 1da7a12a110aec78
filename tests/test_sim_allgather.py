"""All-gather context parallelism and document masks (attention, ring, all-gather, Ulysses)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lesson10 import cost
from lesson10.layouts import shard_positions
from lesson10.sim import SimGroup, allgather_attention, attention, ring_attention, ulysses_attention

LAYOUTS = ["contiguous", "zigzag", "striped"]


def _qkv(s, a, a_kv, d, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((s, a, d)), rng.standard_normal((s, a_kv, d)),
            rng.standard_normal((s, a_kv, d)))


def _docs(lengths):
    """doc_ids of a packed sequence: documents of the given lengths, in order."""
    return np.repeat(np.arange(len(lengths)), lengths)


def naive_doc_attention(q, k, v, doc_ids, causal):
    """Independent reference: a loop over queries and heads, the mask spelled out."""
    s, a, d = q.shape
    g = a // k.shape[1]
    out = np.zeros((s, a, v.shape[2]))
    for i in range(s):
        keys = [j for j in range(s) if doc_ids[j] == doc_ids[i] and (not causal or j <= i)]
        for hd in range(a):
            x = np.array([q[i, hd] @ k[j, hd // g] for j in keys]) / np.sqrt(d)
            p = np.exp(x - x.max())
            out[i, hd] = (p / p.sum()) @ v[keys, hd // g]
    return out


def _shard(x, pos):
    return [x[p] for p in pos]


# ------------------------------------------------------------------ the reference attention
@pytest.mark.parametrize("causal", [True, False])
def test_doc_mask_in_attention_matches_a_loop(causal):
    q, k, v = _qkv(12, 4, 2, 3)
    doc = _docs([1, 4, 1, 5, 1])                       # one-token documents at both ends
    out, lse = attention(q, k, v, causal=causal, doc_ids=doc)
    np.testing.assert_allclose(out, naive_doc_attention(q, k, v, doc, causal), rtol=0, atol=1e-12)
    assert np.isfinite(lse).all()
    # a one-token document under a causal mask sees only itself: its output is its own v
    g = 2
    for hd in range(4):
        np.testing.assert_allclose(out[0, hd], v[0, hd // g], atol=1e-14)


def test_doc_mask_changes_the_answer():
    q, k, v = _qkv(8, 2, 2, 2)
    masked = attention(q, k, v, causal=True, doc_ids=_docs([4, 4]))[0]
    plain = attention(q, k, v, causal=True)[0]
    np.testing.assert_allclose(masked[:4], plain[:4], atol=1e-14)  # document 0 is a causal prefix
    assert np.abs(masked[4:] - plain[4:]).max() > 1e-3


def test_block_with_no_shared_document_is_empty_and_nan_free():
    q, k, v = _qkv(8, 2, 1, 2)
    doc = _docs([4, 4])
    out, lse = attention(q[:4], k[4:], v[4:], causal=False, q_pos=np.arange(4),
                         k_pos=np.arange(4, 8), doc_ids=doc)
    assert np.all(out == 0) and np.all(lse == -np.inf)


def test_doc_ids_are_checked():
    q, k, v = _qkv(6, 1, 1, 2)
    with pytest.raises(ValueError, match="integer document ids"):
        attention(q, k, v, doc_ids=np.zeros(6))
    with pytest.raises(ValueError, match="outside 0..4"):
        attention(q, k, v, doc_ids=np.zeros(5, dtype=int))
    pos = shard_positions(6, 2, "contiguous")
    with pytest.raises(ValueError, match="s = 6"):
        allgather_attention(_shard(q, pos), _shard(k, pos), _shard(v, pos), pos,
                            doc_ids=np.zeros(5, dtype=int))
    with pytest.raises(ValueError, match="s = 6"):
        ring_attention(_shard(q, pos), _shard(k, pos), _shard(v, pos), pos,
                       doc_ids=np.zeros((2, 3), dtype=int))


# ------------------------------------------------------------------ all-gather attention
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("a,a_kv", [(4, 4), (4, 2), (4, 1)])
def test_allgather_equals_full_attention(layout, causal, n, a, a_kv):
    q, k, v = _qkv(16, a, a_kv, 3, seed=n + a_kv)
    ref, ref_lse = attention(q, k, v, causal=causal)
    pos = shard_positions(16, n, layout)
    out, stats = allgather_attention(_shard(q, pos), _shard(k, pos), _shard(v, pos), pos,
                                     causal=causal, return_stats=True)
    for r in range(n):
        assert out[r].shape == (16 // n, a, 3)
        np.testing.assert_allclose(out[r], ref[pos[r]], rtol=0, atol=1e-12)
        np.testing.assert_allclose(stats.lse[r], ref_lse[pos[r]], rtol=0, atol=1e-12)
    assert stats.work.sum() == (16 * 17 // 2 if causal else 16 * 16)


@pytest.mark.parametrize("g", [1, 2, 4])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_allgather_bytes_equal_the_formula_and_the_ring(g, n):
    s, a, d, e = 32, 4, 2, 2
    q, k, v = _qkv(s, a, a // g, d)
    pos = shard_positions(s, n, "zigzag")
    group, ring = SimGroup(n, e=e), SimGroup(n, e=e)
    allgather_attention(_shard(q, pos), _shard(k, pos), _shard(v, pos), pos, group=group)
    h = a * d
    np.testing.assert_allclose(group.bytes_sent, cost.comm_bytes("allgather", s, h, n, g=g, e=e),
                               rtol=1e-15)
    np.testing.assert_allclose(group.bytes_sent, (n - 1) / n * 2 * s * h * e / g, rtol=1e-15)
    assert [r.op for r in group.history] == ["all_gather", "all_gather"]
    # the same bytes as the ring, in one step instead of N_c - 1
    ring_attention(_shard(q, pos), _shard(k, pos), _shard(v, pos), pos, group=ring)
    np.testing.assert_allclose(group.bytes_sent, ring.bytes_sent, rtol=1e-15)
    assert len(ring.history) == 2 * (n - 1)


# ------------------------------------------------------------------ document masks in CP
DOC_CASES = [
    [16],                        # one document: the plain causal mask
    [5, 1, 7, 3],                # documents that cross rank boundaries, a one-token document
    [1] * 16,                    # every token its own document
    [4, 4, 4, 4],                # documents aligned with contiguous shards of 4 ranks
    [3, 9, 1, 1, 2],
]


@pytest.mark.parametrize("lengths", DOC_CASES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("causal", [True, False])
def test_doc_masks_in_ring_allgather_and_ulysses(lengths, layout, n, causal):
    q, k, v = _qkv(16, 8, 4, 2, seed=len(lengths))
    doc = _docs(lengths)
    ref = naive_doc_attention(q, k, v, doc, causal)
    pos = shard_positions(16, n, layout)
    args = (_shard(q, pos), _shard(k, pos), _shard(v, pos), pos)
    groups = {m: SimGroup(n) for m in ("ring", "allgather")}
    ring, stats = ring_attention(*args, causal=causal, doc_ids=doc, group=groups["ring"],
                                 return_stats=True)
    outs = {"ring": ring,
            "allgather": allgather_attention(*args, causal=causal, doc_ids=doc,
                                             group=groups["allgather"]),
            "ulysses": ulysses_attention(*args, causal=causal, doc_ids=doc)}
    for name, out in outs.items():
        for o, p in zip(out, pos):
            assert np.isfinite(o).all(), name
            np.testing.assert_allclose(o, ref[p], rtol=0, atol=1e-12, err_msg=name)
    # masks change the work, never the bytes
    h = 8 * 2
    np.testing.assert_allclose(groups["ring"].bytes_sent, cost.comm_bytes("ring", 16, h, n, g=2))
    np.testing.assert_allclose(groups["allgather"].bytes_sent,
                               cost.comm_bytes("allgather", 16, h, n, g=2))
    # work = visible pairs, counted by a loop; a block is skipped exactly when it has none
    for rnd in range(n):
        for r in range(n):
            src = stats.sources[rnd, r]
            pairs = sum(doc[i] == doc[j] and (not causal or j <= i)
                        for i in pos[r] for j in pos[src])
            assert stats.work[rnd, r] == pairs
            assert stats.skipped[rnd, r] == (pairs == 0)
    assert stats.n_skipped == int((stats.work == 0).sum())


def test_documents_on_their_own_ranks_skip_every_other_block():
    n = 4
    q, k, v = _qkv(16, 2, 2, 2)
    pos = shard_positions(16, n, "contiguous")
    _, stats = ring_attention(_shard(q, pos), _shard(k, pos), _shard(v, pos), pos, causal=False,
                              doc_ids=_docs([4, 4, 4, 4]), return_stats=True)
    assert stats.n_skipped == n * (n - 1)
    assert stats.work[0].tolist() == [16] * n and not stats.work[1:].any()


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.sampled_from(LAYOUTS), st.booleans(), st.integers(0, 2**16))
def test_random_documents_and_layouts(n, layout, causal, seed):
    rng = np.random.default_rng(seed)
    s = 2 * n * int(rng.integers(1, 4))
    doc = np.cumsum(rng.random(s) < 0.3)               # random document boundaries
    q, k, v = _qkv(s, 2, 1, 2, seed=seed)
    ref = naive_doc_attention(q, k, v, doc, causal)
    pos = shard_positions(s, n, layout)
    args = (_shard(q, pos), _shard(k, pos), _shard(v, pos), pos)
    for out in (ring_attention(*args, causal=causal, doc_ids=doc),
                allgather_attention(*args, causal=causal, doc_ids=doc)):
        for o, p in zip(out, pos):
            np.testing.assert_allclose(o, ref[p], rtol=0, atol=1e-12)
