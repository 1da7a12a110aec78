"""lesson10.cost: every number the lesson states, at the lesson's rounding.

``stated(x, "18.3", 1e9)`` checks that ``x / 1e9`` rounds to 18.3 with as many
decimals as the lesson prints, so a wrong formula cannot pass by a tolerance.
"""
import math

import pytest

from lesson10 import cost
from lesson10.cost import (
    HARDWARE,
    activation_bytes,
    comm_bytes,
    min_block_size,
    moe_a2a_bytes,
    moe_comm_ratio,
    moe_expert_flops,
    ring_round_bytes,
    ring_round_flops,
    ring_round_times,
)

GB, MB, MS = 1e9, 1e6, 1e-3
H100 = HARDWARE["H100"]["flops"]
NVLINK = HARDWARE["NVLink"]["bandwidth"]
IB = HARDWARE["InfiniBand"]["bandwidth"]


def stated(value, text, unit=1.0):
    """True if value/unit, rounded as the lesson rounds ``text``, equals ``text``."""
    text = text.replace(",", "")
    decimals = len(text.split(".")[1]) if "." in text else 0
    got = round(value / unit, decimals)
    assert got == pytest.approx(float(text), abs=1e-9), f"{value / unit} does not round to {text}"
    return True


# ---------------------------------------------------------------- presets
def test_hardware_presets():
    assert H100 == 989e12
    assert HARDWARE["H200"]["flops"] == H100          # same compute
    assert HARDWARE["H200"]["memory"] > HARDWARE["H100"]["memory"] == 80e9
    assert NVLINK == 450e9 and IB == 50e9
    assert cost.peak_flops("h100") == H100 and cost.link_bandwidth("InfiniBand") == IB
    assert cost.link_bandwidth(123e9) == 123e9
    with pytest.raises(ValueError, match="NVLink"):
        cost.link_bandwidth("Ethernet")
    with pytest.raises(ValueError, match="H100"):
        cost.peak_flops("A100")


# ---------------------------------------------------------------- motivation
def test_motivation_18_3_584_73_GB():
    s, h, a, layers = 131_072, 4096, 32, 32
    one = activation_bytes(s, 1, h, a)                 # 34 sbh, FlashAttention
    assert one == 34 * s * h
    assert stated(one, "18.3", GB)
    assert stated(layers * one, "584", GB)
    # TP + SP over 8 GPUs divides everything by 8: 584 / 8 = 73 GB, nearly all of 80 GB
    per_gpu = layers * activation_bytes(s, 1, h, a, t=8, sp=True)
    assert stated(per_gpu, "73", GB)
    assert 0.9 * HARDWARE["H100"]["memory"] < per_gpu < HARDWARE["H100"]["memory"]


def test_weather_grid_tokens():
    points = 721 * 1440
    assert stated(points, "1.04", 1e6)
    assert round(points / 16, -3) == 65_000


# ---------------------------------------------------------------- worked example (a) and SP bytes
def test_sp_toy_elements():
    # t = 2, 4 tokens, h = 1, counted in elements (e = 1): 4 elements either way
    assert cost.all_reduce_bytes(4, 2) == 4
    assert cost.reduce_scatter_bytes(4, 2) + cost.all_gather_bytes(4, 2) == 4
    assert comm_bytes("sp", 4, 1, 2, e=1) / 2 == 4     # per layer: two such all-reduces


def test_in_code_all_reduce_equals_rs_plus_ag():
    t, s, h = 4, 8, 16
    n = s * h * 2
    assert cost.all_reduce_bytes(n, t) == 384.0
    assert cost.reduce_scatter_bytes(n, t) + cost.all_gather_bytes(n, t) == 384.0


def test_sp_quick_check_same_bytes_as_tp():
    # plain TP: 2 all-reduces of the s x h activation per layer forward = X; TP + SP sends X too
    s, h, t = 4096, 1024, 8
    X = 2 * cost.all_reduce_bytes(s * h * 2, t)
    assert comm_bytes("sp", s, h, t) == X
    assert comm_bytes("sp", s, h, t) == pytest.approx(4 * (t - 1) / t * 2 * s * h)


# ---------------------------------------------------------------- worked example (b)
def test_worked_example_b_sp_memory():
    s, b, h, a, t = 8192, 1, 4096, 32, 8
    sbh = s * b * h
    assert sbh == 33_554_432
    assert stated(activation_bytes(s, b, h, a), "1.14", GB)
    tp = activation_bytes(s, b, h, a, t=t)
    assert tp == pytest.approx(13 * sbh)
    assert stated(tp, "436", MB)
    assert stated(32 * tp, "14.0", GB)
    sp = activation_bytes(s, b, h, a, t=t, sp=True)
    assert sp == pytest.approx(4.25 * sbh)
    assert stated(sp, "143", MB)
    assert stated(32 * sp, "4.6", GB)
    assert stated(tp / sp, "3.1")
    assert stated(100 * 10 / 13, "77")                 # replicated share of TP memory
    replicated = activation_bytes(s, b, h, a, t=10**9)   # the part that does not shrink with t
    assert replicated / tp == pytest.approx(10 / 13, rel=1e-6)


def test_activation_without_flash_adds_score_term():
    s, b, h, a, t = 2048, 2, 1024, 16, 4
    sbh = s * b * h
    assert activation_bytes(s, b, h, a, t=t, flash=False) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert activation_bytes(s, b, h, a, t=t, sp=True, flash=False) == pytest.approx(sbh / t * (34 + 5 * a * s / h))
    # t = 1: TP and TP + SP coincide
    tp, sp = (activation_bytes(s, b, h, a, sp=x, flash=False) for x in (False, True))
    assert tp == pytest.approx(sp)


def test_check_yourself_2_memory():
    s, b, h, a, t = 4096, 1, 5120, 40, 4
    assert s * b * h == 20_971_520
    assert stated(activation_bytes(s, b, h, a, t=t), "336", MB)
    assert stated(activation_bytes(s, b, h, a, t=t, sp=True), "178", MB)


# ---------------------------------------------------------------- minimum block size
def test_min_block_size_quick_checks():
    assert stated(min_block_size(H100, NVLINK), "2,198")
    assert stated(min_block_size(H100, IB), "19,780")
    assert stated(min_block_size("H100", "InfiniBand", g=4), "4.9", 1e3)   # "about 4,900"
    # causal, zig-zag, GQA g = 4, InfiniBand, F = 500 TFLOP/s achieved
    assert min_block_size(500e12, IB, causal=True, g=4) == pytest.approx(5000)
    # check yourself 3: a causal mask (balanced layout) doubles the minimum block size
    assert min_block_size(H100, IB, causal=True) == pytest.approx(2 * min_block_size(H100, IB))
    # other formats: multiply by e/2
    assert min_block_size(H100, IB, e=4) == pytest.approx(2 * min_block_size(H100, IB))


@pytest.mark.parametrize("causal,g", [(False, 1), (True, 1), (False, 4), (True, 8)])
def test_min_block_size_is_where_compute_meets_transfer(causal, g):
    c_star = min_block_size(H100, IB, causal=causal, g=g)
    for h in (1024, 4096, 8192):                       # c* does not depend on h
        compute, transfer = ring_round_times(c_star, h, H100, IB, causal=causal, g=g)
        assert compute == pytest.approx(transfer, rel=1e-12)
        compute, transfer = ring_round_times(1.1 * c_star, h, H100, IB, causal=causal, g=g)
        assert compute > transfer                      # right of c*: hidden
        compute, transfer = ring_round_times(0.9 * c_star, h, H100, IB, causal=causal, g=g)
        assert compute < transfer                      # left of c*: exposed


# ---------------------------------------------------------------- worked example (d)
def test_worked_example_d_ring_at_128k():
    s, n, h = 131_072, 8, 4096
    c = s // n
    assert c == 16_384
    flops = ring_round_flops(c, h)
    assert flops == 4 * c * c * h
    assert stated(flops, "4.40", 1e12)
    compute, nvlink = ring_round_times(c, h, "H100", "NVLink")
    assert stated(compute, "4.45", MS)
    assert stated(ring_round_bytes(c, h), "268", MB)
    assert stated(nvlink, "0.60", MS) and nvlink < compute           # hidden
    _, ib = ring_round_times(c, h, "H100", "InfiniBand")
    assert stated(ib, "5.37", MS) and ib > compute                   # not hidden
    assert c < min_block_size(H100, IB)                              # as 16,384 < 19,780 predicts
    gqa = ring_round_bytes(c, h, g=4)
    assert stated(gqa, "67", MB)
    _, ib_gqa = ring_round_times(c, h, "H100", "InfiniBand", g=4)
    assert stated(ib_gqa, "1.34", MS) and ib_gqa < compute           # hidden again
    ring = comm_bytes("ring", s, h, n)
    assert ring == pytest.approx(7 * ring_round_bytes(c, h))
    assert stated(ring, "1.88", GB)
    ulysses = comm_bytes("ulysses", s, h, n)
    assert ulysses == pytest.approx(4 * 7 / 8 * 2 * 131_072 * 4096 / 8)
    assert stated(ulysses, "470", MB)
    assert ring / ulysses == pytest.approx(n / 2)


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_table_of_bytes_per_method(n):
    s, h = 4096 * n, 2048
    c = s / n
    assert comm_bytes("sp", s, h, n) == pytest.approx(4 * (n - 1) / n * 2 * s * h)
    assert comm_bytes("ring", s, h, n) == pytest.approx((n - 1) * 4 * c * h)
    assert comm_bytes("ring", s, h, n) == pytest.approx(4 * s * h * (n - 1) / n)
    assert comm_bytes("ulysses", s, h, n) == pytest.approx(4 * (n - 1) / n * 2 * s * h / n)
    # MHA: Ulysses sends N_c / 2 times fewer bytes than ring attention
    assert comm_bytes("ring", s, h, n) / comm_bytes("ulysses", s, h, n) == pytest.approx(n / 2)
    # GQA: ring sends g times fewer; Ulysses' K/V terms shrink by g
    g = 4
    assert comm_bytes("ring", s, h, n, g=g) == pytest.approx(comm_bytes("ring", s, h, n) / g)
    ul_q_o = 2 * (n - 1) / n * 2 * s * h / n
    assert comm_bytes("ulysses", s, h, n, g=g) == pytest.approx(ul_q_o + ul_q_o / g)


def test_ulysses_bytes_constant_when_s_and_n_grow_together():
    h = 4096
    per = [comm_bytes("ulysses", 8192 * n, h, n) for n in (8, 16, 32, 64)]
    # only (N_c - 1)/N_c changes: nearly constant, approaching 8 * 8192 * h
    for value in per:
        assert 0.85 * 8 * 8192 * h < value < 8 * 8192 * h


# ---------------------------------------------------------------- worked example (e) and MoE
def test_worked_example_e_moe_layer():
    h, _E, Ne, k, d_ff, T = 4096, 8, 8, 2, 14_336, 8192
    a2a = moe_a2a_bytes(k, T, h, Ne)
    assert a2a == 2 * 2 * 8192 * 4096 * 2 * 7 / 8
    assert stated(a2a, "235", MB)
    assert stated(a2a / NVLINK, "0.52", MS)
    assert stated(a2a / IB, "4.70", MS)
    assert k * T == 16_384
    assert stated(6 * h * d_ff, "352", 1e6)
    flops = moe_expert_flops(k, T, h, d_ff, swiglu=True)
    assert stated(flops, "5.77", 1e12)
    expert_time = flops / H100
    assert stated(expert_time, "5.84", MS)
    assert stated(a2a / NVLINK / expert_time, "0.09")
    assert stated(a2a / IB / expert_time, "0.80")
    # the closed form agrees with the measured ratio, and with 19,780 / (1.5 d_ff) * 7/8
    assert moe_comm_ratio(H100, IB, Ne, d_ff, swiglu=True) == pytest.approx(a2a / IB / expert_time)
    assert moe_comm_ratio("H100", "NVLink", Ne, d_ff, swiglu=True) == pytest.approx(a2a / NVLINK / expert_time)
    assert stated(19_780 / (1.5 * 14_336) * 7 / 8, "0.80")


def test_moe_ratio_two_matrix_mlp_matches_times():
    k, T, h, Ne, d_ff = 1, 1000, 1024, 4, 2048
    t_a2a = moe_a2a_bytes(k, T, h, Ne) / IB
    t_exp = moe_expert_flops(k, T, h, d_ff) / H100
    assert moe_expert_flops(k, T, h, d_ff) == 2 * 2 * h * d_ff * k * T
    assert moe_comm_ratio(H100, IB, Ne, d_ff) == pytest.approx(t_a2a / t_exp)
    # DeepSeek-V3-sized experts over InfiniBand: far larger than 1
    assert moe_comm_ratio(H100, IB, 64, 2048) > 5
    # NVLink F/W ~ 2,200, InfiniBand ~ 20,000
    assert round(H100 / NVLINK, -2) == 2200 and round(H100 / IB, -3) == 20_000


def test_in_code_moe_formula():
    # section 5 (d): Ne = 8, k = 2, T = 4096, h = 1024, bf16 -> 29.360128 MB by the formula
    assert moe_a2a_bytes(2, 4096, 1024, 8) / 1e6 == pytest.approx(29.360128, abs=1e-9)


def test_check_yourself_6_moe_bytes():
    assert moe_a2a_bytes(1, 1024, 2048, 4) == 6_291_456
    assert stated(moe_a2a_bytes(1, 1024, 2048, 4), "6.3", MB)
    assert moe_a2a_bytes(1, 1024, 2048, 4) == 2 * 3 / 4 * 1024 * 4096


def test_single_gpu_sends_nothing():
    assert moe_a2a_bytes(2, 100, 64, 1) == 0
    assert comm_bytes("ring", 64, 32, 1) == 0
    assert comm_bytes("ulysses", 64, 32, 1) == 0
    assert comm_bytes("sp", 64, 32, 1) == 0
    # an empty tensor is valid and costs nothing
    for collective in (cost.all_reduce_bytes, cost.reduce_scatter_bytes, cost.all_gather_bytes):
        assert collective(0, 4) == 0


# ---------------------------------------------------------------- bad input
def test_bad_inputs_raise_value_error():
    with pytest.raises(ValueError, match="sp.*ring.*ulysses.*allgather"):
        comm_bytes("tree", 1024, 64, 4)
    with pytest.raises(ValueError, match="multiple of 4"):
        comm_bytes("ring", 1023, 64, 4)
    with pytest.raises(ValueError):
        comm_bytes("ring", 1024, 64, 0)
    with pytest.raises(ValueError):
        activation_bytes(1024, 1, 64, 8, t=0)
    with pytest.raises(ValueError):
        activation_bytes(-1, 1, 64, 8)
    with pytest.raises(ValueError):
        min_block_size(H100, 0)
    with pytest.raises(ValueError):
        min_block_size(H100, IB, g=0)
    with pytest.raises(ValueError):
        moe_a2a_bytes(0, 1024, 64, 4)
    with pytest.raises(ValueError):
        moe_comm_ratio(H100, IB, 4, math.nan)
    with pytest.raises(ValueError):
        ring_round_flops(-5, 64)


# ---------------------------------------------------------------- combining: all-gather CP, USP
@pytest.mark.parametrize("n", [1, 2, 8, 16])
@pytest.mark.parametrize("g", [1, 4, 8])
def test_allgather_sends_the_ring_bytes_in_one_step(n, g):
    s, h = 8192 * n, 4096
    ag = comm_bytes("allgather", s, h, n, g=g)
    assert ag == pytest.approx((n - 1) / n * 2 * s * h * 2 / g)
    assert ag == pytest.approx(comm_bytes("ring", s, h, n, g=g))
    assert comm_bytes("allgather", s, h, n, g=g, e=4) == pytest.approx(2 * ag)


def test_allgather_with_gqa_at_128k():
    """Llama 3's reason: with GQA (g = 8) gathering K and V of 128K tokens is 8x cheaper."""
    s, h, n = 131_072, 4096, 16
    assert comm_bytes("allgather", s, h, n, g=8) == pytest.approx(15 / 16 * 2 * s * h * 2 / 8)
    assert comm_bytes("allgather", s, h, n, g=8) / comm_bytes("allgather", s, h, n) == \
        pytest.approx(1 / 8)


@pytest.mark.parametrize("u,r", [(1, 1), (1, 8), (8, 1), (2, 4), (4, 2), (8, 2), (3, 5)])
@pytest.mark.parametrize("g", [1, 2, 4])
def test_usp_bytes(u, r, g):
    n, h, e = u * r, 1024, 2
    s = 64 * n
    c = s / n
    got = cost.usp_bytes(s, h, u, r, g=g, e=e)
    assert got == pytest.approx((u - 1) / u * (2 + 2 / g) * c * h * e
                                + (r - 1) * 2 * (s / r) * h * e / (g * u))
    if r == 1:
        assert got == pytest.approx(comm_bytes("ulysses", s, h, u, g=g, e=e))
    if u == 1:
        assert got == pytest.approx(comm_bytes("ring", s, h, r, g=g, e=e))
    if u > 1 and r > 1:          # strictly between the two ends
        assert comm_bytes("ulysses", s, h, n, g=g) < got < comm_bytes("ring", s, h, n, g=g)


def test_usp_beyond_the_head_limit_at_128k():
    """8 K/V heads on 16 GPUs: Ulysses over 8 in the node, a ring of 2 across nodes."""
    s, h = 131_072, 4096
    usp = cost.usp_bytes(s, h, 8, 2, g=4)
    c = s / 16
    assert usp == pytest.approx(7 / 8 * 2.5 * c * h * 2 + 1 * 2 * (s / 2) * h * 2 / 32)
    assert usp < comm_bytes("ring", s, h, 16, g=4)
    with pytest.raises(ValueError, match="ring_size"):
        cost.usp_bytes(s, h, 8, 0)
    with pytest.raises(ValueError, match="multiple of 16"):
        cost.usp_bytes(s + 8, h, 8, 2)
