"""The checks are exact at every edge that a held-out round found open (issue 30), as fixed
cases, not random draws, so they hold in the check cell and in the grader alike:

* masked keys far above the visible ones (block_attention);
* equal finite lse on both sides (merge);
* routing logits thousands apart (route_topk);
* capacity factors whose float product (any order, Fraction of the float) lands a hair above
  an integer, where only the exact C passes, and those that float32 rounds across an
  integer, found by a search of the check's ranges (capacity);
* an input handed back at t = 1 (reduce_scatter, all_gather), also across the grader's wire.

The wrong answers themselves are in the answer suites (tests/answers_*.py), judged for 20
seeds by tests/test_checks_answers.py and through the grader by tests/test_grade_answers.py.
"""
import math
from fractions import Fraction

import answers_01_03 as a1
import answers_04_05 as a4
import numpy as np
import pytest

from lesson10 import checks
from lesson10.checks import EXERCISES, CheckFailed
from lesson10.checks import capacity_edges as edges
from lesson10.course.grade import wire


def _fails(exercise, fn, seed=None) -> str:
    with pytest.raises(CheckFailed) as info, np.errstate(all="ignore"):
        getattr(checks, f"check_{exercise}")(fn, seed=seed)
    return str(info.value)


# --------------------------------------------------------------------------- float32 capacity
def test_the_search_finds_the_lessons_example_and_only_real_traps():
    traps = edges.float32_traps()
    assert (0.3, 50, 1, 1, 15) in traps
    assert len(traps) > 4000 and len(set(traps)) == len(traps)   # 4990 in the ranges
    for cf, N, E, k, C in traps[::97]:
        assert Fraction(repr(cf)) * k * N / E == C                # an exact integer product
        assert math.ceil(np.float32(cf) * k * N / E) == C + 1 <= N
        assert C + 1 not in edges.float_capacities(N, E, k, cf)   # no float64 mistake gives it
        assert E == 1 or edges.E_RANGE[0] <= E <= edges.E_RANGE[1]
        assert edges.CF_RANGE[0] <= cf <= edges.CF_RANGE[1] and k <= min(E, edges.K_MAX)


def test_the_search_misses_none_in_a_brute_force_corner():
    """Every size of a small corner of the ranges, tried one by one."""
    traps = {t[:4] for t in edges.float32_traps()}
    for c in range(25, 61):
        cf = c / 100
        for E in (1, 2, 3, 5, 6):
            for k in range(1, min(E, 4) + 1):
                for N in range(1, 121):
                    C = math.ceil(Fraction(c, 100) * k * N / E)
                    got = math.ceil(np.float32(cf) * k * N / E)
                    trap = got != C and got not in edges.float_capacities(N, E, k, cf) and got <= N
                    assert trap == ((cf, N, E, k) in traps), (cf, N, E, k)


def test_the_fixed_traps_fail_every_float32_order():
    fixed = edges.fixed_float32_traps()
    assert fixed[0] == (0.3, 50, 1, 1, 15) and len(fixed) >= 4
    for cf, N, E, k, C in fixed[1:]:
        assert edges.float32_capacities(N, E, k, cf) == {C + 1}


def test_a_float32_capacity_fails_for_every_seed_and_the_right_ones_pass():
    for seed in (None, 0, 1, 2):
        msg = _fails("capacity", a4.cap_float32, seed)
        assert "computed from float32(0.3) = 0.300000012" in msg
    for fn in (a4.cap_fraction_loops, a4.cap_integer_percent, a4.cap_rounded_counter):
        checks.check_capacity(fn, seed=4)
        assert checks.OUTCOMES[-1]["passed"], checks.OUTCOMES[-1]["message"]


def test_the_fixed_cases_fail_every_float_order_and_the_binary_fraction():
    """The first four fixed cases are exact integer products: every order of the float64
    product, and Fraction(cf) of the float, gives C + 1 on one of them at least, and the
    case shows it (some expert gets more than C + 1 copies)."""
    from lesson10.checks.nb05_moe_dispatch import _capacity_cases
    cases = _capacity_cases(np.random.default_rng(0))[:4]
    orders = set(edges.float_products(1.1, 2, 3, 5))
    assert len(orders) == 36
    failed, binary = set(), False
    for _, N, E, k, cf, experts in cases:
        C = edges.exact_capacity(N, E, k, cf)
        assert Fraction(repr(cf)) * k * N / E == C and np.bincount(experts.ravel()).max() > C + 1
        mistakes = edges.float_mistakes(N, E, k, cf)
        assert set(mistakes) == {C + 1} and 0 < mistakes[C + 1] < 1e-12
        for i, value in enumerate(edges.float_products(cf, k, N, E).values()):
            if math.ceil(value) == C + 1:
                failed.add(i)
        binary |= math.ceil(Fraction(cf) * k * N / E) == C + 1
    assert failed == set(range(36)) and binary


@pytest.mark.parametrize("fn", [a4.make_capacity(rounding=math.ceil), a4.cap_float_any_order,
                                a4.cap_binary_fraction])
def test_a_float_capacity_fails_on_the_fixed_cases_for_every_generator(fn):
    """The float mistakes fail on the fixed cases, so the grader (any generator) and the
    check cell agree, and the hint names the float rounding, not float32."""
    for seed in (3, 99):
        with pytest.raises(CheckFailed) as info:
            EXERCISES["capacity"].body(fn, np.random.default_rng(seed))
        assert "= 66 exactly" in str(info.value) or "= 55 exactly" in str(info.value)
        assert "but computed from the float 1.1 it comes out" in str(info.value)
        assert "float32" not in str(info.value).split("hint:")[1]


def test_the_grader_draws_other_traps_than_the_check_cell():
    def labels(rng):
        from lesson10.checks.nb05_moe_dispatch import _capacity_cases
        return [c[0] for c in _capacity_cases(rng) if c[0].startswith("random, CF")]
    a, b = labels(np.random.default_rng(1)), labels(np.random.default_rng(2))
    assert len(a) == len(b) == 2 and a != b


# --------------------------------------------------------------------------- fixed edge cases
@pytest.mark.parametrize("exercise,fn,text", [
    ("block_attention", a1.attn_max_all_keys, "your row maximum includes the masked keys"),
    ("merge", a1.merge_tie_keeps_first, "where lse1 == lse2 your merge keeps side 1"),
    ("route_topk", a4.route_mean_shift, "shifted by the mean of the chosen logits"),
])
def test_each_edge_is_a_fixed_case(exercise, fn, text):
    """The grader's body with any generator fails the answer on the same fixed case."""
    for seed in (3, 99):
        with pytest.raises(CheckFailed) as info, np.errstate(all="ignore"):
            EXERCISES[exercise].body(fn, np.random.default_rng(seed))
        assert text in str(info.value)
    assert text in _fails(exercise, fn)


# --------------------------------------------------------------------------- aliasing at t = 1
@pytest.mark.parametrize("exercise,fn", [("reduce_scatter", a1.rs_reduce_alias),
                                         ("all_gather", a1.ag_one_rank_shortcut)])
def test_an_input_handed_back_at_t_1_fails_naming_aliasing(exercise, fn):
    msg = _fails(exercise, fn)
    assert "(t=1," in msg and "itself (it shares its memory)" in msg
    assert "hint: aliasing" in msg and "build new arrays for your results" in msg


def test_a_wrong_value_is_reported_before_aliasing():
    """rs_no_sum hands back views of the inputs (aliasing at t = 1) and is wrong elsewhere:
    the value is the lead."""
    assert "rank i holds only its own partial sum" in _fails("reduce_scatter", a1.rs_no_sum)


def test_the_wire_keeps_an_input_handed_back_one_object():
    """The sandbox names the result arrays that share memory with an argument; the judge
    links them to its own arguments, so the check sees what the check cell sees."""
    xs = [np.arange(6.0).reshape(3, 2)]
    result = (list(np.split(xs[0], 1)), np.zeros(2))            # a view of all of xs[0]
    links = wire.shared(result, xs)
    assert links == [[[0, 0], [0]]]
    tree, blobs = wire.encode([result, [xs, {}]], [])
    decoded, _ = wire.decode(tree, blobs)
    judge_xs = [xs[0].copy()]
    linked = wire.relink(decoded, links, judge_xs)
    assert linked[0][0] is judge_xs[0] and isinstance(linked, list | tuple)
    assert not np.shares_memory(linked[1], judge_xs[0])
    # a new array, a part of an input, malformed links: nothing linked, nothing raised
    assert wire.shared([xs[0] + 0, xs[0][:1]], xs) == []
    assert wire.relink(decoded, [[[7], [0]], "x", [[0, 0], [3, 3]]], judge_xs) is decoded
