"""DeepSpeed-Ulysses on gloo: outputs and gradients equal full attention on one process
(all layouts, causal or not, GQA, replicated K/V), bytes equal lesson10.cost, and bad input
gives a clear error."""
import math

import pytest
from rank_workers import bad_input_test

from lesson10 import cost

S, D = 16, 4
LAYOUTS = ("contiguous", "zigzag", "striped")


def cases(n):
    U = dict(method="ulysses", dtype="float64")
    good = [dict(U, b=2, s=S, a=4, a_kv=4, d=D, causal=c, layout=l) for c in (True, False) for l in LAYOUTS]
    good += [dict(U, b=1, s=S, a=8, a_kv=4, d=D, causal=True, layout=l) for l in ("zigzag", "striped")]
    good += [dict(U, b=1, s=S, a=4, a_kv=2, d=D, causal=True, layout="zigzag", replicate_kv=n > 2),
             dict(U, b=1, s=S, a=4, a_kv=1, d=D, causal=False, layout="contiguous", replicate_kv=True),
             dict(U, b=2, s=S, a=4, a_kv=4, d=D, causal=True, layout="zigzag", dtype="float32"),
             dict(U, b=1, s=S, a=8, a_kv=2, d=D, causal=True, layout="contiguous", dtype="float32",
                  replicate_kv=n > 2)]
    bad = {"kv": dict(U, b=1, s=S, a=4, a_kv=1, d=D),
           "heads": dict(U, b=1, s=S, a=n + 1, a_kv=n + 1, d=D),
           "seq": dict(U, b=1, s=2 * n + n, a=4, a_kv=4, d=D, layout="zigzag")}
    return good, bad


RANK_JOBS = {"bad_input": lambda n: ("bad_input_cases", {"prefix": "ulysses"}),
             "ulysses": lambda n: ("check_attention", cases(n)[0] + list(cases(n)[1].values())),
             "ulysses_mismatch": lambda n: ("ulysses_mismatch", {})}


@pytest.fixture(scope="module", params=[2, 4])
def run(request, rank_results):
    n = request.param
    good, bad = cases(n)
    mismatch = [{"error": m} for m in rank_results(n, "ulysses_mismatch")]
    return n, good, {**bad, "mismatch": None}, [
        out + [m] for out, m in zip(rank_results(n, "ulysses"), mismatch)]


def test_matches_full_attention(run):
    n, good, _, outs = run
    for rank_out in outs:
        for res in rank_out[:len(good)]:
            assert "error" not in res, res
            assert set(res["err"]) == {"out", "dq", "dk", "dv"} and res["ok"], res


def test_bytes_are_the_four_all_to_alls(run):
    n, good, _, outs = run
    for rank_out in outs:
        for res in rank_out[:len(good)]:
            c = res["case"]
            e = 4 if c.get("dtype") == "float32" else 8
            n_kv = c["a_kv"]
            if c.get("replicate_kv") and n_kv % n:
                n_kv = math.lcm(n_kv, n)            # K/V heads after copying
            assert res["kv_heads_sent"] == n_kv
            want = cost.comm_bytes("ulysses", S, c["a"] * D, n, g=c["a"] / n_kv, e=e) * c["b"]
            assert res["fwd"] == res["fwd_by_op"]["all_to_all"] == pytest.approx(want, rel=1e-12)
            assert res["formula_fwd"] == pytest.approx(want, rel=1e-12)
            assert res["bwd_by_op"] == {"all_to_all": res["fwd"]}   # 4 inverse all-to-alls


def test_bad_input_errors(run):
    n, good, bad, outs = run
    for rank_out in outs:
        errs = dict(zip(bad, (r["error"] for r in rank_out[len(good):])))
        assert "K/V heads" in errs["kv"] and "replicate_kv=True" in errs["kv"] and "ring" in errs["kv"]
        assert f"not a multiple of {n}" in errs["heads"]
        assert "zigzag" in errs["seq"] and f"multiple of {2 * n}" in errs["seq"]
        assert "mismatched shards" in errs["mismatch"]


# multi-process bad input (rank_workers.bad_input_cases) -> what its error says
test_multi_process_bad_input_says_what_to_do = bad_input_test({
    "ulysses misspelled layout": "unknown layout 'zigzog'",
    "ulysses more ranks than kv heads": "Use ring attention",
})
