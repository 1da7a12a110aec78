"""All-gather context parallelism (lesson10.spmd.allgather) on real torch.distributed (gloo,
2 and 4 ranks) against one process: every layout, causal or not, GQA, document masks, one
float32 case and two independent groups of 2 ranks; bytes equal ``cost.comm_bytes("allgather")``.

The runs are :func:`lesson10.runs.workers.check_attention` inside the shared launch per rank
count (``rank_results`` in conftest).
"""
import pytest
from rank_workers import inexact_rows

from lesson10 import cost

B, S, A, D = 2, 16, 8, 4
DOCS = [5, 1, 6, 1, 3]                 # packed documents across rank boundaries, two of one token


def _cases(n):
    base = dict(b=B, s=S, a=A, d=D, dtype="float64", method="allgather")
    cases = [dict(base, layout=layout, causal=causal, a_kv=a_kv, docs=DOCS if a_kv == 2 else None)
             for layout in ("zigzag", "contiguous", "striped") for causal in (True, False)
             for a_kv in (4, 2)]
    cases.append(dict(base, layout="zigzag", causal=True, a_kv=2, dtype="float32", docs=DOCS))
    if n == 4:   # inside two independent groups of 2 ranks (group=)
        cases.append(dict(base, layout="zigzag", causal=True, a_kv=2, split=2, docs=DOCS, seed=4))
    return [dict(c, seed=c.get("seed", i)) for i, c in enumerate(cases)]


RANK_JOBS = {"allgather": lambda n: ("check_attention", _cases(n))}


@pytest.mark.parametrize("n", [2, 4])
def test_outputs_and_gradients_match_one_process(rank_results, n):
    out = rank_results(n, "allgather")
    assert len(out) == n and not inexact_rows(out, len(_cases(n)))


@pytest.mark.parametrize("n", [2, 4])
def test_bytes_equal_the_formula(rank_results, n):
    """(N-1)/N 2 s h e/g forward, all gathered; the backward reduce-scatters as much."""
    rows = [row for rank_rows in rank_results(n, "allgather") for row in rank_rows]
    size = {"float64": 8, "float32": 4}
    want = [cost.comm_bytes("allgather", S, c["a"] * c["d"], row["n"], g=c["a"] / c["a_kv"],
                            e=size[c["dtype"]]) * B for row, c in ((r, r["case"]) for r in rows)]
    assert [row["fwd"] for row in rows] == [row["formula_fwd"] for row in rows] == want
    assert all(row["fwd_by_op"]["all_gather"] == row["fwd"] for row in rows)
    assert all(row["bwd_by_op"] == {"reduce_scatter": row["fwd"]} for row in rows)
