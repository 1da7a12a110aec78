"""lesson10.rules: the size rules, once. Each rule refuses what it should with a message that
says what to do; the capacity is ceil(CF k N / E) exactly, CF read as the decimal written;
and sim, spmd, runs, cost and the figures refuse a bad MoE configuration with one verdict."""
import dataclasses
import math
import re
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest

from lesson10 import cost
from lesson10.rules import MoEConfig, count, number
from lesson10.runs import validate
from lesson10.sim import moe as sim_moe


# --------------------------------------------------------------------------- count, number
def re_repr(value) -> str:
    return re.escape(repr(value))


@pytest.mark.parametrize("bad", [True, False, 2.0, "3", None, 0, -1, np.float64(2.0)])
def test_count_refuses_what_is_not_an_integer_at_least_lo(bad):
    with pytest.raises(ValueError, match=f"^n must be an integer >= 1, got {re_repr(bad)}$"):
        count("n", bad)


def test_count_takes_integers_of_any_kind_and_returns_an_int():
    assert count("n", 3) == 3 and type(count("n", np.int64(3))) is int
    assert count("N", 0, lo=0) == 0
    with pytest.raises(ValueError, match="N must be an integer >= 0, got -1"):
        count("N", -1, lo=0)


@pytest.mark.parametrize("bad", [True, "1", None, float("nan"), float("inf"), -float("inf"),
                                 0, 0.0, -1.5, 10 ** 400, 1j])
def test_number_refuses_what_is_not_a_finite_number_above_lo(bad):
    with pytest.raises(ValueError, match="^x must be a finite number > 0, got "):
        number("x", bad)


def test_number_strict_or_not_and_keeps_exact_sizes_exact():
    assert number("x", 2) == 2 and type(number("x", 2)) is int
    assert type(number("x", np.int64(3))) is int
    assert number("x", Fraction(1, 3)) == Fraction(1, 3) and type(number("x", Fraction(1, 3))) is Fraction
    assert type(number("x", 0.5)) is float and type(number("x", np.float32(0.5))) is float
    assert number("x", np.float32(0.5)) == 0.5
    assert number("x", 0, strict=False) == 0.0
    with pytest.raises(ValueError, match="x must be a finite number >= 0, got -1"):
        number("x", -1, strict=False)
    with pytest.raises(ValueError, match="x must be a finite number > 2, got 2"):
        number("x", 2, lo=2)


# --------------------------------------------------------------------------- MoEConfig rules
#: (E, k, capacity_factor, N_e) -> words the refusal says (the limit and what to do)
BAD = {
    (0, 1, None, 1): "E (experts) must be an integer >= 1, got 0",
    (True, 1, None, 1): "E (experts) must be an integer >= 1, got True",
    (4, 0, None, 1): "k (experts per token) must be an integer >= 1, got 0",
    (4, 2.0, None, 1): "k (experts per token) must be an integer >= 1, got 2.0",
    (4, True, None, 1): "k (experts per token) must be an integer >= 1, got True",
    (4, 5, None, 1): "(a token picks k distinct experts); use k <= E",
    (4, 2, 0, 1): "capacity_factor must be a number > 0",
    (4, 2, -1.0, 1): "or None for no limit (dropless); got -1.0",
    (4, 2, float("nan"), 1): "capacity_factor must be a number > 0",
    (4, 2, float("inf"), 1): "capacity_factor must be a number > 0",
    (4, 2, True, 1): "capacity_factor must be a number > 0",
    (4, 2, "1.25", 1): "capacity_factor must be a number > 0",
    (4, 2, None, 0): "N_e (expert-parallel ranks) must be an integer >= 1, got 0",
    (6, 2, None, 4): "(each rank holds E/N_e whole experts); use E a multiple of N_e",
    (2, 1, None, 4): "use E a multiple of N_e",
}


@pytest.mark.parametrize("args", list(BAD), ids=[repr(a) for a in BAD])
def test_every_moe_rule_refuses_and_says_what_to_do(args):
    with pytest.raises(ValueError) as got:
        MoEConfig(*args)
    assert BAD[args] in str(got.value)


def test_the_k_message_names_both_sizes():
    with pytest.raises(ValueError, match="k = 9 experts per token is more than the E = 8 experts"):
        MoEConfig(8, 9)


def test_capacity_and_tokens_per_rank_refuse_bad_token_counts():
    config = MoEConfig(8, 2, 1.25, N_e=4)
    for bad in (-1, 1.5, True, None):
        with pytest.raises(ValueError, match="N \\(tokens\\) must be an integer >= 0"):
            config.capacity(bad)
        with pytest.raises(ValueError, match="N \\(tokens\\) must be an integer >= 0"):
            config.tokens_per_rank(bad)
    with pytest.raises(ValueError, match="N = 66 tokens do not split over N_e = 4 ranks .*use N a "
                                         "multiple of N_e"):
        config.tokens_per_rank(66)


def test_the_config_is_frozen_normalised_and_says_its_shares():
    c = MoEConfig(np.int64(8), np.int32(2), np.float32(1.25), N_e=np.int64(4))
    assert (c.E, c.k, c.capacity_factor, c.N_e) == (8, 2, 1.25, 4)
    assert [type(v) for v in (c.E, c.k, c.capacity_factor, c.N_e)] == [int, int, float, int]
    assert c == MoEConfig(8, 2, 1.25, 4) and hash(c) == hash(MoEConfig(8, 2, 1.25, 4))
    assert c.experts_per_rank == 2 and c.tokens_per_rank(64) == 16 and c.tokens_per_rank(0) == 0
    for field in ("E", "k", "capacity_factor", "N_e"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(c, field, 1)
    assert MoEConfig(8, 8).capacity_factor is None and MoEConfig(1, 1).N_e == 1


# --------------------------------------------------------------------------- capacity
def test_the_worked_example_of_the_docstring():
    assert MoEConfig(E=8, k=2, capacity_factor=1.25, N_e=4).capacity(64) == 20


def test_the_capacity_reads_the_factor_as_the_decimal_written():
    assert MoEConfig(1, 1, 1.1).capacity(60) == 66
    assert MoEConfig(1, 1, 0.3).capacity(50) == 15
    # where the float product is one more: 1.1 * 50 = 55.00000000000001, 1.1 * 100 / 10 = 11.000000000000002
    assert math.ceil(1.1 * 1 * 50 / 1) == 56 and MoEConfig(1, 1, 1.1).capacity(50) == 55
    assert math.ceil(1.1 * 1 * 100 / 10) == 12 and MoEConfig(10, 1, 1.1).capacity(100) == 11


@pytest.mark.parametrize("cf", [0.3, 0.5, 1.0, 1.1, 1.25, 1.3, 2.0, 3.7])
def test_the_capacity_is_ceil_cf_k_n_over_e(cf):
    for E in (1, 2, 3, 8, 64):
        for k in sorted({1, min(E, 2), min(E, 6), E}):
            for N in (0, 1, 7, 50, 60, 64, 90, 100, 1000, 4097):
                want = math.ceil(Fraction(str(cf)) * k * N / E)
                assert MoEConfig(E, k, cf).capacity(N) == want, (E, k, N, cf)
                assert cost.expert_capacity(N, E, k, cf) == want


def test_no_factor_means_no_limit():
    assert MoEConfig(8, 2).capacity(64) is None
    assert cost.expert_capacity(64, 8, 2) is None


# --------------------------------------------------------------------------- one verdict
#: bad configurations (E, k, capacity_factor, N_e) every surface below must refuse, and the
#: words of the command line's refusal (its flags)
CLI_SAYS = {(4, 5, None, 2): "--topk 5 is more than the --experts 4",
            (4, 0, None, 2): "--topk must be an integer >= 1, got 0",
            (4, 2, 0.0, 2): "--capacity-factor: capacity_factor must be a number > 0",
            (4, 2, float("nan"), 2): "--capacity-factor: capacity_factor must be a number > 0",
            (6, 2, None, 4): "--experts 6 do not split over N_e = 4 ranks",
            (4, 2.0, None, 2): "--topk must be an integer >= 1, got 2.0"}
ONE_VERDICT = list(CLI_SAYS)


def _rule(E, k, cf, n) -> str:
    with pytest.raises(ValueError) as got:
        MoEConfig(E, k, cf, N_e=n)
    return str(got.value)


@pytest.mark.parametrize("bad", ONE_VERDICT, ids=[repr(b) for b in ONE_VERDICT])
def test_sim_figures_and_cost_refuse_a_bad_config_in_the_rules_words(bad):
    E, k, cf, n = bad
    says = _rule(*bad)
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((2, 4)) for _ in range(n)]
    with pytest.raises(ValueError) as got:
        sim_moe.moe_layer(xs, rng.standard_normal((4, E)), sim_moe.init_experts(E, 4, 8), k, cf)
    assert str(got.value) == says
    with pytest.raises(ValueError) as got:
        sim_moe.simulate_moe(8 * n, E, k, n, cf)
    assert str(got.value) == says
    from lesson10.figures.data import moe_routing
    with pytest.raises(ValueError) as got:
        moe_routing(E=E, Ne=n, k=k, T=4, capacity_factor=cf)
    assert str(got.value) == says
    if E % n == 0:                                # cost knows no N_e
        with pytest.raises(ValueError) as got:
            cost.expert_capacity(64, E, k, cf if cf is not None else 1.0)
        assert str(got.value) == _rule(E, k, cf if cf is not None else 1.0, 1)


@pytest.mark.parametrize("bad", ONE_VERDICT, ids=[repr(b) for b in ONE_VERDICT])
def test_spmd_refuses_a_bad_config_in_the_rules_words(bad, monkeypatch):
    pytest.importorskip("torch")
    from lesson10.spmd import comm
    from lesson10.spmd.moe import ExpertParallelMoE
    E, k, cf, n = bad
    monkeypatch.setattr(comm, "group_size", lambda group=None: n)    # a group of n, no ranks
    monkeypatch.setattr(comm, "group_rank", lambda group=None: 0)
    with pytest.raises(ValueError) as got:
        ExpertParallelMoE(4, E, 8, k, cf)
    assert str(got.value) == _rule(*bad)


@pytest.mark.parametrize("bad", ONE_VERDICT, ids=[repr(b) for b in ONE_VERDICT])
def test_the_command_line_refuses_a_bad_config_with_its_flags(bad):
    E, k, cf, n = bad
    with pytest.raises(validate.Refused) as got:
        validate.check_moe(SimpleNamespace(max_nodes=None), n, E, k, cf, where="bench moe")
    assert CLI_SAYS[bad] in str(got.value)


def test_the_command_line_suggests_sizes_that_work():
    args = SimpleNamespace(max_nodes=None)
    with pytest.raises(validate.Refused, match="use --topk <= 4"):
        validate.check_moe(args, 2, 4, 5, None, where="moe")
    with pytest.raises(validate.Refused, match="use --experts 8 or fewer ranks"):
        validate.check_moe(args, 4, 6, 2, None, where="moe")
    with pytest.raises(validate.Refused, match="--capacity-factor: capacity_factor must be a number > 0"):
        validate.check_moe(args, 2, 4, 2, -1.0, where="moe")
    validate.check_moe(args, 2, 4, 2, 1.25, where="moe")                   # a good one passes
