"""Ring attention on real torch.distributed (gloo, 2 and 4 ranks), against one process.

All cases run inside the shared launch per rank count (``rank_results`` in conftest:
starting ranks costs seconds); the worker ``lesson10.runs.workers.check_attention``
compares each rank's output and gradients with autograd through plain attention on the
whole sequence.
"""
import itertools

import numpy as np
import pytest
from rank_workers import bad_input_test

from lesson10 import cost
from lesson10.layouts import causal_work, shard_positions
from lesson10.spmd.ring import ring_blocks

B, S, A, D = 2, 24, 4, 8          # s = 24 splits into 2*N_c chunks for N_c = 2 and 4
E = {"float64": 8, "float32": 4}


def _cases():
    cases = []
    for dtype, causal, layout, a_kv in itertools.product(
            ("float64", "float32"), (True, False), ("zigzag", "contiguous"), (4, 2)):
        cases.append(dict(method="ring", b=B, s=S, a=A, a_kv=a_kv, d=D, dtype=dtype,
                          causal=causal, layout=layout, seed=len(cases)))
    # the transfer-before-compute variant and the einsum fallback give the same answer
    cases.append(dict(method="ring", b=B, s=S, a=A, a_kv=1, d=D, dtype="float64", causal=True,
                      layout="zigzag", overlap=False, seed=99))
    cases.append(dict(method="ring", b=B, s=S, a=A, a_kv=2, d=D, dtype="float64", causal=True,
                      layout="contiguous", impl="einsum", seed=98))
    return cases


def _split_cases():
    """Two independent groups of 2 ranks inside 4 ranks (group= argument): ring attention,
    and Ulysses (whose other tests use the whole world)."""
    return [dict(method=m, b=1, s=S, a=A, a_kv=2, d=D, dtype="float64", causal=True,
                 layout="zigzag", split=2, seed=7) for m in ("ring", "ulysses")]


DOC_S, DOCS = 16, [5, 1, 6, 1, 3]    # packed documents across rank boundaries, two of one token


def _doc_cases():
    """Document masks (``docs=``: the lengths of the packed documents), in float64."""
    return [dict(method="ring", b=B, s=DOC_S, a=8, a_kv=2, d=4, dtype="float64", causal=causal,
                 layout=layout, docs=DOCS, seed=50 + i)
            for i, (layout, causal) in enumerate(itertools.product(("zigzag", "contiguous"),
                                                                   (True, False)))]


RANK_JOBS = {"bad_input": lambda n: ("bad_input_cases", {"prefix": "ring"}),
             "ring": lambda n: ("check_attention", _cases() + (_split_cases() if n == 4 else [])),
             "ring_docs": lambda n: ("check_attention", _doc_cases()),
             "ring_errors": lambda n: ("ring_error_messages", {})}


@pytest.fixture(scope="module", params=[2, 4])
def results(request, rank_results):
    n = request.param
    return n, rank_results(n, "ring")


@pytest.fixture(scope="module")
def errors(rank_results):
    return rank_results(2, "ring_errors")


def test_outputs_and_gradients_match_single_process(results):
    n, out = results
    n_split = len(_split_cases()) if n == 4 else 0
    assert len(out) == n and all(len(rows) == len(_cases()) + n_split for rows in out)
    for rank_rows in out:
        for row in rank_rows:
            assert set(row["err"]) == {"out", "dq", "dk", "dv"}, row
            assert row["max_err"] <= row["tol"] == (1e-9 if row["case"]["dtype"] == "float64" else 1e-4)
        assert [row["n"] for row in rank_rows[len(_cases()):]] == [2] * n_split


def test_bytes_match_cost_formula(results):
    """Forward: N_c - 1 hops of compact K and V (cost.comm_bytes('ring')); backward: the
    same K/V hops plus N_c hops of dK/dV, so (2 N_c - 1)/(N_c - 1) times the forward."""
    n, out = results
    for rank_rows in out:
        for row in rank_rows:
            c = row["case"]
            g = c["a"] // c["a_kv"]
            n = row["n"]
            want = cost.comm_bytes(row["method"], c["s"], c["a"] * c["d"], n, g=g,
                                   e=E[c["dtype"]]) * c["b"]
            assert row["formula_fwd"] == want
            # besides the method's traffic only a small all-gather of the shapes, checked
            # to be equal on every rank, recorded apart as "metadata"
            if row["method"] == "ulysses":       # four all-to-alls each way
                assert set(row["fwd_by_op"]) == {"all_to_all", "metadata"}
                assert row["fwd_by_op"]["all_to_all"] == want == row["bwd"]
                continue
            assert row["fwd"] == want
            assert set(row["fwd_by_op"]) == {"ring_shift", "metadata"}
            assert row["bwd"] * (n - 1) == row["fwd"] * (2 * n - 1)


def test_gqa_sends_g_times_fewer_bytes(results):
    _, out = results
    rows = {(r["case"]["dtype"], r["case"]["causal"], r["case"]["layout"], r["case"]["a_kv"]): r["fwd"]
            for r in out[0][:16]}
    for (dt, c, lay, a_kv), nb in rows.items():
        if a_kv == 2:
            assert 2 * nb == rows[(dt, c, lay, 4)]


def test_bad_input_gives_clear_errors(errors):
    for msgs in errors:
        assert msgs["odd_zigzag"].startswith("ValueError") and "even" in msgs["odd_zigzag"]
        assert msgs["heads"].startswith("ValueError") and "multiple" in msgs["heads"]
        assert msgs["kv_mismatch"].startswith("ValueError")
        assert msgs["layout"].startswith("ValueError") and "zigzag" in msgs["layout"]
        assert msgs["ranks_disagree"].startswith("ValueError") and "every rank" in msgs["ranks_disagree"]


@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_skipped_blocks_are_exactly_the_masked_ones(n, layout):
    """The blocks ring_blocks computes hold every visible pair, and off the diagonal no
    masked pair; per (round, rank) their visible pairs are the lesson's causal_work."""
    s = 4 * n
    c = s // n
    pos = shard_positions(s, n, layout)
    work = causal_work(n, layout, s=s)
    computed = np.zeros((n, n))
    for k in range(n):
        for r in range(n):
            src = (r - k) % n
            for qs, ks, cz in ring_blocks(layout, True, r, src, c):
                qp, kp = pos[r][qs], pos[src][ks]
                vis = kp[None, :] <= qp[:, None]
                if not cz:
                    assert vis.all()
                computed[k, r] += vis.sum()
    np.testing.assert_array_equal(computed, work)
    if layout == "zigzag":
        # equal work per round: the diagonal round is c(c+... )/2 pairs, the others c^2/2
        assert all(len(set(row)) == 1 for row in computed)
        assert (computed[1:] == c * c / 2).all()


@pytest.mark.parametrize("n", [2, 4])
def test_document_masks_are_exact_and_change_no_byte(rank_results, n):
    for rows in rank_results(n, "ring_docs"):
        assert len(rows) == len(_doc_cases())
        for row in rows:
            assert "error" not in row, row
            assert row["ok"] and set(row["err"]) == {"out", "dq", "dk", "dv"}, row
            g, h = 8 / 2, 8 * 4
            assert row["fwd"] == row["formula_fwd"] == cost.comm_bytes("ring", DOC_S, h, n, g=g, e=8) * B


# multi-process bad input (rank_workers.bad_input_cases) -> what its error says
test_multi_process_bad_input_says_what_to_do = bad_input_test({
    "ring int": "floating-point",
    "ring shards differ": "different shapes or dtypes on the ranks",
})


def test_an_empty_sequence_runs_on_every_rank(rank_results):
    assert all(res["ring empty"] == ("ok", (1, 0, 2, 3)) for res in rank_results(2, "bad_input"))
