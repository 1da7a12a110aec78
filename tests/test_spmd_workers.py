"""lesson10.runs.workers (notebook 06, `run`, the tests): the checked runs on 2 ranks,
in the shared launch.

Expected bytes are written out from the lesson's formulas here (not read from
lesson10.cost), drops are checked against the dropless run's expert counts, and
errors against float64 rounding.
"""
import math
import os

import pytest

N = 2
SP = dict(b=2, s=8, h=16, ffn=32, p=0.1)
ATT = dict(b=1, s=16, a=4, a_kv=2, d=4)          # g = 2
MOE = dict(T=8, h=8, E=4, k=2, d_ff=8)
MOE_CASES = {"uniform, no capacity": dict(MOE, routing="uniform"), "random, no capacity": MOE,
             "random, CF = 1.0": dict(MOE, capacity_factor=1.0),
             "random, CF = 1.25": dict(MOE, capacity_factor=1.25)}
ULY_CASES = {"gqa": dict(ATT, method="ulysses"), "gqa_zigzag": dict(ATT, method="ulysses", layout="zigzag"),
             "replicated": dict(ATT, method="ulysses", a_kv=1, replicate_kv=True),
             "head_limit": dict(ATT, method="ulysses", a_kv=1)}
E8 = 8                                           # float64 bytes per element
TOL = 1e-12

RANK_JOBS = {
    "hello": lambda n: ("hello", {}),
    "sp": lambda n: ("check_sp", [dict(SP, sequence_parallel=m) for m in (False, True)]),
    "ring": lambda n: ("check_attention", [dict(ATT, method="ring", layout=lay)
                                           for lay in ("zigzag", "contiguous")]),
    "ulysses": lambda n: ("check_attention", list(ULY_CASES.values())),
    "moe": lambda n: ("check_moe", list(MOE_CASES.values())),
}


@pytest.fixture(scope="module")
def res(rank_results):
    return {name: rank_results(N, name) for name in RANK_JOBS}


def test_hello_one_process_per_rank(res):
    hello = res["hello"]
    assert [h["rank"] for h in hello] == [0, 1]
    assert all(h["world"] == N and h["backend"] == "gloo" for h in hello)
    assert len({h["pid"] for h in hello} | {os.getpid()}) == N + 1


def test_one_schema_for_every_method(res):
    keys = {"method", "case", "n", "rank", "err", "max_err", "tol", "ok", "fwd", "bwd",
            "fwd_by_op", "bwd_by_op", "formula_fwd", "time_s"}
    for name in ("sp", "ring", "moe"):
        for rank, out in enumerate(res[name]):
            for r in out:
                assert keys <= set(r), (name, set(r) ^ keys)
                assert r["rank"] == rank and r["n"] == N and r["ok"] and r["time_s"] > 0
                assert r["max_err"] == max(r["err"].values())
    # errors and times are all-reduced with MAX: every rank reports the same numbers
    for name in ("sp", "ring", "moe"):
        assert [r["err"] for r in res[name][0]] == [r["err"] for r in res[name][1]]
        assert [r["time_s"] for r in res[name][0]] == [r["time_s"] for r in res[name][1]]


def test_sp_same_output_and_bytes(res):
    b, s, h = SP["b"], SP["s"], SP["h"]
    # two blocks, each one ring all-reduce (TP) = reduce-scatter + all-gather (SP) of (b, s, h)
    want = 2 * 2 * (N - 1) / N * b * s * h * E8
    for tp, sp in res["sp"]:
        assert tp["fwd"] == sp["fwd"] == sp["formula_fwd"] == want
        assert tp["bwd"] == sp["bwd"] == want
        assert set(tp["fwd_by_op"]) == set(tp["bwd_by_op"]) == {"all_reduce"}
        # LN weight, LN bias and the row-parallel bias: 3h partial sums per block
        # ... and the re-gather of the LayerNorm output shard, (t-1)/t of (b, s, h) per block
        assert sp["bwd_by_op"]["param_grad"] == 2 * 2 * (N - 1) / N * 3 * h * E8
        assert sp["bwd_by_op"]["ag_recompute"] == 2 * (N - 1) / N * b * s * h * E8
        assert tp["tokens_per_rank"] == s and sp["tokens_per_rank"] == s // N
        assert len(sp["err"]) == 2 + 2 * 6 and max(tp["max_err"], sp["max_err"]) < TOL
        assert 0 < sp["dropped"] == tp["dropped"] < 0.5


def test_ring_exact_and_bytes(res):
    b, s, a, a_kv, d = (ATT[k] for k in ("b", "s", "a", "a_kv", "d"))
    c, h, g = s // N, a * d, a // a_kv
    fwd = (N - 1) * 2 * c * h * E8 / g * b
    for rank, (zig, cont) in enumerate(res["ring"]):
        for chk in (zig, cont):
            assert chk["formula_fwd"] == chk["fwd"] == fwd
            assert chk["bwd"] == (2 * N - 1) * fwd / (N - 1)
            assert chk["max_err"] < TOL and set(chk["err"]) == {"out", "dq", "dk", "dv"}
        half = c // 2
        zz = list(range(rank * half, (rank + 1) * half)) + \
            list(range((2 * N - 1 - rank) * half, (2 * N - rank) * half))
        assert zig["tokens"] == zz
        assert cont["tokens"] == list(range(rank * c, (rank + 1) * c))


def test_ulysses_bytes_any_layout(res):
    b, s, a, a_kv, d = (ATT[k] for k in ("b", "s", "a", "a_kv", "d"))
    h = a * d

    def formula(g):
        return (N - 1) / N * (2 + 2 / g) * s * h * E8 / N * b

    for out in res["ulysses"]:
        cases = dict(zip(ULY_CASES, out))
        assert cases["gqa"]["fwd"] == cases["gqa_zigzag"]["fwd"] == formula(a / a_kv)
        # one K/V head copied to lcm(1, N) = N heads before the all-to-all
        assert cases["replicated"]["fwd"] == formula(a / math.lcm(1, N))
        for name in ("gqa", "gqa_zigzag", "replicated"):
            c = cases[name]
            assert c["bwd"] == c["fwd"] == c["formula_fwd"]
            assert c["max_err"] < TOL
        err = cases["head_limit"]["error"]
        assert "replicate_kv" in err and "N_c = 2" in err and "ring" in err


def test_moe_bytes_and_drops(res):
    T, h, E, k = (MOE[key] for key in ("T", "h", "E", "k"))
    for out in res["moe"]:
        cases = dict(zip(MOE_CASES, out))
        uni = cases["uniform, no capacity"]
        assert uni["fwd"] == uni["bwd"] == 2 * k * T * h * E8 * (N - 1) / N == uni["formula_fwd"]
        assert uni["load"] == [k * T * N // E] * E and uni["dropped"] == 0
        counts = cases["random, no capacity"]["load"]          # dropless: every copy counted
        assert sum(counts) == k * T * N and cases["random, no capacity"]["dropped"] == 0
        for c in cases.values():
            assert c["fwd"] == c["bwd"] == (c["remote_sent"] + c["remote_received"]) * h * E8
            assert c["dropped"] == c["ref_dropped"]
            assert c["max_err"] < TOL
            cf = c["case"]["capacity_factor"]
            if cf is not None:
                cap = math.ceil(cf * k * T * N / E)
                assert c["capacity"] == cap
                assert c["dropped"] == sum(max(0, n - cap) for n in counts)
                assert c["load"] == [min(n, cap) for n in counts]
    for i in range(len(MOE_CASES)):
        assert sum(out[i]["dropped_mine"] for out in res["moe"]) == res["moe"][0][i]["dropped"]


def test_bad_dtype_is_a_clear_error():
    from lesson10.spmd.launch import torch_dtype
    with pytest.raises(ValueError, match="dtype must be one of"):
        torch_dtype("float16")
