"""lesson10.spmd.notebook_workers (notebook 06): one launch of every demo on 2 ranks.

Expected bytes are written out from the lesson's formulas here (not read from
lesson10.cost), drops are checked against the dropless run's expert counts, and
errors against float64 rounding.
"""
import math
import os

import pytest

from lesson10.spmd import notebook_workers as nw
from lesson10.spmd.launch import launch

N = 2
SP = dict(b=2, s=8, h=16, ffn=32, p=0.1)
ATT = dict(b=1, s=16, a=4, a_kv=2, d=4)          # g = 2
MOE = dict(T=8, h=8, E=4, k=2, d_ff=8)
E8 = 8                                           # float64 bytes per element
TOL = 1e-12


@pytest.fixture(scope="module")
def res():
    return launch(nw.all_demos, N, sp=SP, ring=dict(ATT, reps=1, time_s=32, time_a=2, time_d=8),
                  ulysses=ATT, moe=MOE, gqa=dict(a=4, a_kv=1), quiet=True, timeout=120)


def test_hello_one_process_per_rank(res):
    hello = [r["hello"] for r in res]
    assert [h["rank"] for h in hello] == [0, 1]
    assert all(h["world"] == N and h["backend"] == "gloo" for h in hello)
    assert len({h["pid"] for h in hello} | {os.getpid()}) == N + 1


def test_sp_same_output_and_bytes(res):
    b, s, h = SP["b"], SP["s"], SP["h"]
    # two blocks, each one ring all-reduce (TP) = reduce-scatter + all-gather (SP) of (b, s, h)
    want = 2 * 2 * (N - 1) / N * b * s * h * E8
    for r in res:
        sp = r["sp"]
        assert sp["tp"]["fwd"] == sp["sp"]["fwd"] == sp["formula_fwd"] == want
        assert sp["tp"]["bwd"] == sp["sp"]["bwd"] == want
        assert sp["tp"]["fwd_side"] == {} and sp["tp"]["bwd_side"] == {}
        # LN weight, LN bias and the row-parallel bias: 3h partial sums per block
        # ... and the re-gather of the LayerNorm output shard, (t-1)/t of (b, s, h) per block
        assert sp["sp"]["bwd_side"] == {"param_grad": 2 * 2 * (N - 1) / N * 3 * h * E8,
                                        "ag_recompute": 2 * (N - 1) / N * b * s * h * E8}
        assert sp["tp"]["tokens_per_rank"] == s and sp["sp"]["tokens_per_rank"] == s // N
        assert sp["tp_vs_sp"] < TOL
        for m in ("tp", "sp"):
            assert max(sp[m]["out_err"], sp[m]["dx_err"], sp[m]["grad_err"]) < TOL


def test_ring_exact_and_bytes(res):
    b, s, a, a_kv, d = (ATT[k] for k in ("b", "s", "a", "a_kv", "d"))
    c, h, g = s // N, a * d, a // a_kv
    fwd = (N - 1) * 2 * c * h * E8 / g * b
    for r in res:
        ring = r["ring"]
        assert ring["formula_fwd"] == fwd
        for lay, chk in ring["check"].items():
            assert chk["fwd"] == fwd and chk["bwd"] == (2 * N - 1) * fwd / (N - 1)
            assert max(chk[k] for k in ("out_err", "dq_err", "dk_err", "dv_err")) < TOL
        half = c // 2
        rank = r["hello"]["rank"]
        zz = list(range(rank * half, (rank + 1) * half)) + \
            list(range((2 * N - 1 - rank) * half, (2 * N - rank) * half))
        assert ring["check"]["zigzag"]["tokens"] == zz
        assert ring["check"]["contiguous"]["tokens"] == list(range(rank * c, (rank + 1) * c))
        for lay in ("zigzag", "contiguous"):
            t = ring["time"][lay]
            assert t["median_s"] > 0 and len(t["compute_per_rank_s"]) == N


def test_ring_timing_is_the_same_on_every_rank(res):
    # the slowest-rank time is all-reduced with MAX: every rank reports the same number
    assert res[0]["ring"]["time"] == res[1]["ring"]["time"]


def test_ulysses_bytes_any_layout(res):
    b, s, a, a_kv, d = (ATT[k] for k in ("b", "s", "a", "a_kv", "d"))
    h = a * d

    def formula(g):
        return (N - 1) / N * (2 + 2 / g) * s * h * E8 / N * b

    for r in res:
        cases = r["ulysses"]["cases"]
        assert cases["gqa"]["fwd"] == cases["gqa_zigzag"]["fwd"] == formula(a / a_kv)
        # one K/V head copied to lcm(1, N) = N heads before the all-to-all
        assert cases["replicated"]["fwd"] == formula(a / math.lcm(1, N))
        for c in cases.values():
            assert c["bwd"] == c["fwd"] == c["formula_fwd"]
            assert max(c[k] for k in ("out_err", "dq_err", "dk_err", "dv_err")) < TOL
    assert "replicate_kv" in res[0]["gqa_error"] and "N_c = 2" in res[0]["gqa_error"]


def test_moe_bytes_and_drops(res):
    T, h, E, k = (MOE[key] for key in ("T", "h", "E", "k"))
    for r in res:
        cases = r["moe"]["cases"]
        uni = cases["uniform, no capacity"]
        assert uni["fwd"] == uni["bwd"] == 2 * k * T * h * E8 * (N - 1) / N
        assert uni["load"] == [k * T * N // E] * E and uni["dropped"] == 0
        counts = cases["random, no capacity"]["load"]          # dropless: every copy counted
        assert sum(counts) == k * T * N and cases["random, no capacity"]["dropped"] == 0
        for name, c in cases.items():
            assert c["fwd"] == c["bwd"] == (c["remote_sent"] + c["remote_received"]) * h * E8
            assert c["dropped"] == c["ref_dropped"]
            assert max(c["y_err"], c["dx_err"]) < TOL
            if c["cf"] is not None:
                cap = math.ceil(c["cf"] * k * T * N / E)
                assert c["capacity"] == cap
                assert c["dropped"] == sum(max(0, n - cap) for n in counts)
                assert c["load"] == [min(n, cap) for n in counts]
    for name in res[0]["moe"]["cases"]:
        assert sum(r["moe"]["cases"][name]["dropped_mine"] for r in res) == \
            res[0]["moe"]["cases"][name]["dropped"]


def test_bad_dtype_is_a_clear_error():
    with pytest.raises(ValueError, match="dtype must be one of"):
        nw._dtype("float16")
