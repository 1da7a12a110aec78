"""USP (lesson10.spmd.usp: Ulysses inside groups of consecutive ranks, ring attention across
them) on real torch.distributed (gloo, 2 and 4 ranks) against one process: every Ulysses
size, document masks, GQA, the striped layout, one float32 case and sub-groups of a sub-group; bytes equal
``cost.usp_bytes``, split into the all-to-alls and the ring; bad sizes say what to do.
Each run is one ``check_attention`` of :mod:`lesson10.runs.workers` in the shared launch
(``rank_results``); the cases mirror those of ``test_spmd_allgather.py``.
"""
import pytest
from rank_workers import inexact_rows

from lesson10 import cost

DOCS = [5, 1, 6, 1, 3]                 # packed documents across rank boundaries, two of one token
B, S, A, D = 2, 16, 8, 4


def _cases(n):
    base = dict(b=B, s=S, a=A, d=D, dtype="float64", method="usp")
    cases = [dict(base, ulysses_size=u, layout=layout, causal=causal, a_kv=4, docs=docs)
             for layout in ("zigzag", "contiguous") for causal in (True, False)
             for u in sorted({1, 2, n}) for docs in (None, DOCS)]
    cases += [dict(base, ulysses_size=2, layout="striped", causal=True, a_kv=4, docs=docs)
              for docs in (None, DOCS)]            # any layout: the ring takes positions
    cases.append(dict(base, ulysses_size=2, layout="zigzag", causal=True, a_kv=2))
    cases.append(dict(base, ulysses_size=2, layout="zigzag", causal=True, a_kv=2, dtype="float32"))
    if n == 4:   # inside two independent groups of 2 ranks (group=): sub-groups of a sub-group
        cases.append(dict(base, ulysses_size=2, layout="zigzag", causal=True, a_kv=2, split=2,
                          seed=3))
    return [dict(c, seed=c.get("seed", i)) for i, c in enumerate(cases)]


BAD = dict(b=1, s=S, a=A, d=D, dtype="float64", method="usp", layout="zigzag")
BAD_SIZES = {   # case -> the words its error must contain
    "Ulysses part beyond the K/V heads": (dict(BAD, a_kv=1, ulysses_size=2),
                                          ("ulysses_size = 2", "n_kv = 1", "ring")),
    "ulysses_size does not divide N": (dict(BAD, a_kv=4, ulysses_size=3), ("divides N",)),
    "misspelled layout": (dict(BAD, a_kv=4, ulysses_size=2, layout="zigzog"), ("unknown layout",)),
}

RANK_JOBS = {"usp": lambda n: ("check_attention", _cases(n)),
             "uneven": lambda n: ("usp_after_an_uneven_group", {}) if n == 4 else ("hello", {}),
             "usp_errors": lambda n: ("check_attention", [c for c, _ in BAD_SIZES.values()])}


@pytest.fixture(scope="module", params=[2, 4])
def results(request, rank_results):
    return request.param, rank_results(request.param, "usp")


def test_outputs_and_gradients_match_one_process(results):
    assert len(results[1]) == results[0] and not inexact_rows(results[1], len(_cases(results[0])))


def test_bytes_equal_the_formula(results):
    """The all-to-alls of the Ulysses part plus the ring: cost.usp_bytes."""
    n, out = results
    for rows in out:
        for row in rows:
            case = row["case"]
            e = 8 if case["dtype"] == "float64" else 4
            g, h, nn, u = case["a"] / case["a_kv"], case["a"] * case["d"], row["n"], case["ulysses_size"]
            assert row["fwd"] == row["formula_fwd"], row
            assert row["formula_fwd"] == cost.usp_bytes(S, h, u, nn // u, g=g, e=e) * B
            a2a = (u - 1) / u * (2 + 2 / g) * (S // nn) * h * e * B
            assert row["fwd_by_op"].get("all_to_all", 0) == a2a
            assert row["fwd_by_op"].get("ring_shift", 0) == row["fwd"] - a2a


def test_usp_groups_are_consecutive_ranks(results):
    """Ulysses on consecutive ranks: with u = 2 of 4 ranks, ranks 0, 1 exchange Q/K/V
    (all-to-all) and ranks 0, 2 form a ring; u = N is Ulysses (no ring bytes), u = 1 the ring
    (no all-to-all bytes)."""
    n, out = results
    for rows in out:
        for row in rows:
            if row["case"].get("split", 1) > 1:
                continue
            u = row["case"]["ulysses_size"]
            assert (row["fwd_by_op"].get("all_to_all", 0) > 0) == (u > 1)
            assert (row["fwd_by_op"].get("ring_shift", 0) > 0) == (u < n)


@pytest.mark.parametrize("what", list(BAD_SIZES))
def test_usp_bad_sizes_say_what_to_do(rank_results, what):
    words = BAD_SIZES[what][1]
    for rows in rank_results(2, "usp_errors"):
        message = rows[list(BAD_SIZES).index(what)]["error"]
        assert all(w in message for w in words), (what, message)


def test_world_usp_does_not_hang_after_a_group_that_leaves_ranks_out(rank_results):
    """Its sub-groups are made by every rank in one order, so torch's group names agree
    (locally synchronised groups would be named after each rank's own group count)."""
    outs = rank_results(4, "uneven")
    assert not inexact_rows(outs, 2), outs
