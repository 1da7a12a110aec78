"""lesson10.layouts: token placement, causal work per ring round, ring time.

Expected values come from the lesson's worked example (c) and section 3, or from an
independent brute-force count over the (query, key) pairs.
"""
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lesson10 import layouts
from lesson10.layouts import causal_work, efficiency, ring_source, ring_time, shard_positions


# ---------------------------------------------------------------- the lesson's tables
def test_zigzag_positions_match_the_lesson():
    # "rank 0 has {0, 7}, rank 1 {1, 6}, rank 2 {2, 5}, rank 3 {3, 4}"
    pos = shard_positions(8, 4, "zigzag")
    assert [sorted(p.tolist()) for p in pos] == [[0, 7], [1, 6], [2, 5], [3, 4]]


def test_contiguous_and_striped_positions():
    assert [p.tolist() for p in shard_positions(8, 4, "contiguous")] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [p.tolist() for p in shard_positions(8, 4, "striped")] == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_zigzag_n4_s8_table():
    w = causal_work(4, "zigzag", s=8)
    assert w.shape == (4, 4)
    # the worked example's table, row = round, column = rank
    assert w.tolist() == [[3, 3, 3, 3], [2, 2, 2, 2], [2, 2, 2, 2], [2, 2, 2, 2]]
    assert w.sum(axis=0).tolist() == [9, 9, 9, 9]
    assert w.max(axis=1).tolist() == [3, 2, 2, 2]
    assert ring_time(w) == 9
    assert w.sum() == 8 * 9 // 2 == 36


def test_contiguous_n4_s8_table():
    w = causal_work(4, "contiguous", s=8)
    assert w.sum(axis=0).tolist() == [3, 7, 11, 15]
    assert w.max(axis=1).tolist() == [3, 4, 4, 4]
    assert ring_time(w) == 15
    assert ring_time(w) / ring_time(causal_work(4, "zigzag", s=8)) == pytest.approx(1.67, abs=0.005)


def test_ring_time_is_sum_of_round_maxima():
    w = np.array([[1, 5], [4, 2], [0, 0]])
    assert ring_time(w) == 5 + 4 + 0
    assert ring_time(w.astype(float)) == 9.0


@pytest.mark.parametrize("n", [2, 3, 4, 8, 16])
def test_long_blocks_contiguous_vs_zigzag(n):
    contiguous, zigzag = causal_work(n, "contiguous"), causal_work(n, "zigzag")
    # rank 0 does 1/2 block, rank N_c - 1 does N_c - 1/2 blocks
    assert contiguous.sum(axis=0)[0] == pytest.approx(0.5)
    assert contiguous.sum(axis=0)[-1] == pytest.approx(n - 0.5)
    assert ring_time(contiguous) == pytest.approx(n - 0.5)
    assert ring_time(zigzag) == pytest.approx(n / 2)
    assert ring_time(contiguous) / ring_time(zigzag) == pytest.approx((n - 0.5) / (n / 2))
    # zig-zag: every rank half a block in every round
    np.testing.assert_allclose(zigzag, np.full((n, n), 0.5))
    # average busy fraction of contiguous: (N_c / 2) / (N_c - 1/2)
    assert efficiency(contiguous) == pytest.approx((n / 2) / (n - 0.5))
    assert efficiency(zigzag) == pytest.approx(1.0)


def test_long_block_ratio_for_four_ranks_is_1_75():
    assert ring_time(causal_work(4, "contiguous")) / ring_time(causal_work(4, "zigzag")) == pytest.approx(1.75)


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
def test_long_blocks_are_the_limit_of_token_counts(layout):
    n = 3
    unit = 2 * n if layout == "zigzag" else n
    s = unit * 200
    c = s // n
    approx = causal_work(n, layout, s=s) / c**2
    np.testing.assert_allclose(approx, causal_work(n, layout), atol=2 / c)


def test_contiguous_round_structure():
    # round k: rank r holds block (r - k) mod n; it is visible only if that block is not later
    n = 5
    w = causal_work(n, "contiguous")
    for k, r in itertools.product(range(n), range(n)):
        src = ring_source(r, k, n)
        expected = 0.5 if src == r else (1.0 if src < r else 0.0)
        assert w[k, r] == expected


# ---------------------------------------------------------------- errors
def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="multiple of 8"):
        shard_positions(12, 4, "zigzag")
    with pytest.raises(ValueError, match="multiple of 4"):
        shard_positions(10, 4, "contiguous")
    with pytest.raises(ValueError, match="contiguous.*zigzag.*striped"):
        shard_positions(8, 4, "diagonal")
    with pytest.raises(ValueError, match="contiguous"):
        causal_work(4, "random")
    with pytest.raises(ValueError):
        shard_positions(8, 0, "contiguous")
    with pytest.raises(ValueError):
        shard_positions(8.0, 4, "contiguous")
    with pytest.raises(ValueError):
        causal_work(4, "zigzag", s=12)
    with pytest.raises(ValueError):
        ring_time(np.array([1.0, 2.0]))
    with pytest.raises(ValueError):
        ring_time(np.array([[1.0, np.nan]]))


def test_zigzag_alias():
    assert [p.tolist() for p in shard_positions(8, 4, "zig-zag")] == [[0, 7], [1, 6], [2, 5], [3, 4]]


# ---------------------------------------------------------------- properties
layout_st = st.sampled_from(layouts.LAYOUTS)


@st.composite
def cases(draw):
    layout = draw(layout_st)
    n = draw(st.integers(1, 8))
    unit = 2 * n if layout == "zigzag" else n
    s = unit * draw(st.integers(1, 6))
    return layout, n, s


@settings(max_examples=60, deadline=None)
@given(cases())
def test_every_token_on_exactly_one_rank(case):
    layout, n, s = case
    pos = shard_positions(s, n, layout)
    assert len(pos) == n
    assert all(len(p) == s // n for p in pos)
    assert sorted(np.concatenate(pos).tolist()) == list(range(s))


@settings(max_examples=60, deadline=None)
@given(cases())
def test_total_causal_work_and_brute_force(case):
    layout, n, s = case
    w = causal_work(n, layout, s=s)
    assert w.shape == (n, n)
    assert w.sum() == s * (s + 1) // 2
    pos = shard_positions(s, n, layout)
    owner = np.empty(s, dtype=int)
    for r, p in enumerate(pos):
        owner[p] = r
    # independent count: every visible pair (q, key) is done by q's rank in the round
    # where it holds key's rank's K/V: round k = (owner[q] - owner[key]) mod n
    brute = np.zeros((n, n), dtype=int)
    for q in range(s):
        for key in range(q + 1):
            brute[(owner[q] - owner[key]) % n, owner[q]] += 1
    np.testing.assert_array_equal(w, brute)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8), st.integers(1, 6))
def test_zigzag_balanced_in_every_round(n, m):
    s = 2 * n * m
    w = causal_work(n, "zigzag", s=s)
    # every round: all ranks do the same work, so no rank waits
    assert (w == w[:, :1]).all()
    assert ring_time(w) == w.sum() // n
    # and the ring time is never better than the perfect share s(s+1)/2 / n
    assert ring_time(w) * n == s * (s + 1) // 2


@settings(max_examples=40, deadline=None)
@given(cases())
def test_ring_time_at_least_mean_load(case):
    layout, n, s = case
    w = causal_work(n, layout, s=s)
    assert ring_time(w) * n >= w.sum()
    assert ring_time(w) <= w.sum()


def test_quick_check_contiguous_last_rank_sets_the_time():
    # contiguous, causal, N_c = 4: rank 3 holds an earlier block in rounds 1, 2, 3 and is the
    # busiest rank in every round; for long blocks the ranks are busy (N_c/2)/(N_c - 1/2) = 4/7
    for w in (causal_work(4, "contiguous", s=8), causal_work(4, "contiguous", s=64), causal_work(4, "contiguous")):
        assert (w[:, 3] == w.max(axis=1)).all()
    assert efficiency(causal_work(4, "contiguous")) == pytest.approx(4 / 7)
    assert efficiency(causal_work(64, "contiguous")) == pytest.approx(0.5, abs=0.01)


@pytest.mark.parametrize("seed", range(40))
def test_block_plan_covers_exactly_the_visible_pairs(seed):
    """Any positions (runs, permutations, interleavings): the plan's blocks are disjoint, hold
    every visible pair, their unmasked and causal blocks hold no masked pair, and their
    pair counts add up to the visible pairs."""
    from lesson10.layouts import block_plan, plan_pairs, visible
    rng = np.random.default_rng(seed)
    s = int(rng.integers(2, 40))
    n = int(rng.choice([d for d in range(1, s + 1) if s % d == 0]))
    layout = ["contiguous", "zigzag", "striped", "perm"][seed % 4]
    if layout == "perm" or (layout == "zigzag" and s % (2 * n)):
        pos = np.split(rng.permutation(s), n)
    else:
        pos = shard_positions(s, n, layout)
    doc = rng.integers(0, 3, s) if seed % 5 == 0 else None
    for causal in (True, False):
        for qp in pos:
            for kp in pos:
                want = visible(qp, kp, causal, doc)
                got = np.zeros(want.shape, dtype=int)
                plan = block_plan(qp, kp, causal, doc)
                for blk in plan:
                    got[blk.q, blk.k] += 1
                    sub = want[blk.q, blk.k]
                    if blk.mask == "none":
                        assert sub.all()
                    elif blk.mask == "causal":
                        assert np.array_equal(sub, np.tril(np.ones(sub.shape, dtype=bool)))
                    assert blk.pairs == sub.sum()
                assert got.max(initial=0) <= 1
                assert (got[want] == 1).all()
                assert plan_pairs(plan) == want.sum()


# --------------------------------------------------------------------------- bad input
# (each case was found misbehaving before its validation was added)

def test_ring_time_rejects_complex_and_ragged_work():
    with pytest.raises(ValueError, match="real numbers"):
        layouts.ring_time([[1 + 5j, 2], [3, 4]])       # used to drop the imaginary part
    with pytest.raises(ValueError, match="rows of different lengths"):
        layouts.ring_time([[1, 2], [3]])
    with pytest.raises(ValueError, match="n \\(number of ranks\\) must be an integer >= 1"):
        layouts.ring_source(0, 0, 0)                  # used to be a ZeroDivisionError
