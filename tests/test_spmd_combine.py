"""The lesson's combinations on real torch.distributed (gloo, 2 and 4 ranks) against one
process: all-gather context parallelism, document masks (ring and all-gather), USP
(Ulysses inside groups of consecutive ranks, ring attention across them) and
node-limited MoE routing. Outputs and gradients in float64 (and one float32 case each);
measured bytes equal the closed forms of ``lesson10.cost``.

The runs are :func:`lesson10.spmd.workers.check_attention` / ``check_moe`` inside the
shared launch per rank count (``rank_results`` in conftest).
"""
import pytest

B, S, A, D = 2, 16, 8, 4
DOCS = [5, 1, 6, 1, 3]                 # packed documents across rank boundaries, two of one token


def _cases(n):
    base = dict(b=B, s=S, a=A, d=D, dtype="float64")
    cases = []
    for layout in ("zigzag", "contiguous", "striped"):
        for causal in (True, False):
            for a_kv in (4, 2):
                cases.append(dict(base, method="allgather", layout=layout, causal=causal,
                                  a_kv=a_kv, docs=DOCS if a_kv == 2 else None))
    for layout in ("zigzag", "contiguous"):
        for causal in (True, False):
            cases.append(dict(base, method="ring", layout=layout, causal=causal, a_kv=2, docs=DOCS))
            for u in sorted({1, 2, n}):
                for docs in (None, DOCS):
                    cases.append(dict(base, method="usp", ulysses_size=u, layout=layout,
                                      causal=causal, a_kv=4, docs=docs))
    cases.append(dict(base, method="usp", ulysses_size=2, layout="zigzag", causal=True, a_kv=2))
    cases.append(dict(base, method="allgather", layout="zigzag", causal=True, a_kv=2,
                      dtype="float32", docs=DOCS))
    cases.append(dict(base, method="usp", ulysses_size=2, layout="zigzag", causal=True, a_kv=2,
                      dtype="float32"))
    if n == 4:   # inside two independent groups of 2 ranks (group=): sub-groups of a sub-group
        cases.append(dict(base, method="usp", ulysses_size=2, layout="zigzag", causal=True,
                          a_kv=2, split=2, seed=3))
        cases.append(dict(base, method="allgather", layout="zigzag", causal=True, a_kv=2,
                          split=2, docs=DOCS, seed=4))
    return [dict(c, seed=c.get("seed", i)) for i, c in enumerate(cases)]


def _errors(n):
    base = dict(b=1, s=S, a=A, d=D, dtype="float64", method="usp", layout="zigzag")
    return [dict(base, a_kv=1, ulysses_size=2),          # Ulysses part beyond the K/V heads
            dict(base, a_kv=4, ulysses_size=3),          # does not divide N
            dict(base, a_kv=4, ulysses_size=2, layout="striped")]


MOE = dict(T=8, h=8, E=8, k=4, d_ff=6, dtype="float64", alpha=0.5)
MOE_CASES = [dict(MOE, nodes=2, max_nodes=1), dict(MOE, nodes=4, max_nodes=2),
             dict(MOE, nodes=4, max_nodes=3, capacity_factor=1.0),
             dict(MOE, nodes=2, max_nodes=1, capacity_factor=0.8, seed=1),
             dict(MOE, nodes=4, max_nodes=4)]

RANK_JOBS = {"combine": lambda n: ("check_attention", _cases(n)),
             "combine_errors": lambda n: ("check_attention", _errors(n)),
             "moe_nodes": lambda n: ("check_moe", MOE_CASES)}


@pytest.fixture(scope="module", params=[2, 4])
def results(request, rank_results):
    n = request.param
    return n, rank_results(n, "combine")


def test_outputs_and_gradients_match_one_process(results):
    n, out = results
    assert len(out) == n and all(len(rows) == len(_cases(n)) for rows in out)
    for rows in out:
        for row in rows:
            assert "error" not in row, row
            assert row["ok"] and set(row["err"]) == {"out", "dq", "dk", "dv"}, row


def test_bytes_equal_the_formulas(results):
    """All-gather: (N-1)/N 2 s h e/g forward, reduce-scattered back the same; a document
    mask changes no byte of the ring; USP: the all-to-alls plus the ring, cost.usp_bytes."""
    from lesson10 import cost

    n, out = results
    for rows in out:
        for row in rows:
            case = row["case"]
            assert row["fwd"] == row["formula_fwd"], row
            e = 8 if case["dtype"] == "float64" else 4
            g, h, nn = case["a"] / case["a_kv"], case["a"] * case["d"], row["n"]
            if case["method"] == "allgather":
                assert row["formula_fwd"] == cost.comm_bytes("allgather", S, h, nn, g=g, e=e) * B
                assert row["fwd_by_op"]["all_gather"] == row["fwd"]
                assert row["bwd_by_op"] == {"reduce_scatter": row["fwd"]}
            elif case["method"] == "ring":
                assert row["formula_fwd"] == cost.comm_bytes("ring", S, h, nn, g=g, e=e) * B
            else:
                u = case["ulysses_size"]
                c = S // nn
                assert row["formula_fwd"] == cost.usp_bytes(S, h, u, nn // u, g=g, e=e) * B
                a2a = (u - 1) / u * (2 + 2 / g) * c * h * e * B
                assert row["fwd_by_op"].get("all_to_all", 0) == a2a
                assert row["fwd_by_op"].get("ring_shift", 0) == row["fwd"] - a2a


def test_usp_groups_are_consecutive_ranks(results):
    """Ulysses on consecutive ranks: with u = 2 of 4 ranks, ranks 0, 1 exchange Q/K/V
    (all-to-all) and ranks 0, 2 form a ring; u = N is Ulysses (no ring bytes), u = 1 the ring
    (no all-to-all bytes)."""
    n, out = results
    for rows in out:
        for row in rows:
            if row["case"]["method"] != "usp" or row["case"].get("split", 1) > 1:
                continue
            u = row["case"]["ulysses_size"]
            assert (row["fwd_by_op"].get("all_to_all", 0) > 0) == (u > 1)
            assert (row["fwd_by_op"].get("ring_shift", 0) > 0) == (u < n)


def test_usp_bad_sizes_say_what_to_do(rank_results):
    for rows in rank_results(2, "combine_errors"):
        over, not_div, striped = (row["error"] for row in rows)
        assert "ulysses_size = 2" in over and "n_kv = 1" in over and "ring" in over
        assert "divides N" in not_div
        assert "zigzag" in striped and "contiguous" in striped


@pytest.mark.parametrize("n", [2, 4])
def test_node_limited_moe_matches_the_reference_and_the_simulator(rank_results, n):
    out = rank_results(n, "moe_nodes")
    for rows in out:
        for row, case in zip(rows, MOE_CASES):
            assert "error" not in row, row
            assert row["ok"] and row["err"]["sim"] < 1e-12, row
            assert row["nodes_used"] <= case["max_nodes"]
            # bytes: exactly the kept copies that leave this rank, both ways
            assert row["fwd"] == (row["remote_sent"] + row["remote_received"]) * row["row_bytes"]
    # the limit binds: with one node allowed of two, every token stays on one node
    assert all(rows[0]["nodes_used"] == 1 for rows in out)
