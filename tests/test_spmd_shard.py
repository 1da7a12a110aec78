"""shard_sequence / gather_sequence on 2 gloo ranks (one launch), against lesson10.layouts.

The worker is a function of this module: each rank imports it by name (pytest's default
import mode puts tests/ on sys.path, which spawned ranks inherit)."""
import pytest
import torch
from rank_workers import bad_input_test, shard_cases

from lesson10.layouts import shard_positions
from lesson10.spmd import count_bytes, gather_sequence, local_positions, shard_sequence
from lesson10.spmd.launch import launch

N = 2
CASES = [(16, "contiguous"), (16, "zigzag"), (16, "striped"), (4, "zigzag"), (6, "zigzag"),
         (5, "contiguous")]
# the sequence on another dim than the default dim=1: (shape, dim, layout)
DIM_CASES = [((8, 2, 3), 0, "zigzag"), ((2, 3, 12), 2, "striped"), ((2, 3, 8), -1, "contiguous"),
             ((2, 3, 4, 8), -1, "zigzag")]


def _numbered(shape):
    """Every entry different, so a shard taken along the wrong dim cannot look right."""
    return torch.arange(torch.Size(shape).numel(), dtype=torch.float64).reshape(shape)


def shard_worker(cases, dim_cases):
    """In each rank: the default-dim cases of ``rank_workers.shard_cases``, then shard /
    gather along other dims with the activation bytes of the gather, and local_positions."""
    rows = shard_cases(cases)
    dims = []
    for shape, dim, layout in dim_cases:
        x = _numbered(shape)
        loc = shard_sequence(x, layout, dim=dim)
        with count_bytes() as c:
            back = gather_sequence(loc, layout, dim=dim)
        dims.append({"local": loc, "back": back, "bytes": c.activation, "metadata": c.by_op.get("metadata", 0),
                     "pos": local_positions(x.shape[dim], layout).tolist()})
    return rows, dims


@pytest.fixture(scope="module")
def all_results():
    return launch(shard_worker, N, CASES, DIM_CASES, backend="gloo", timeout=600, quiet=True)


@pytest.fixture(scope="module")
def results(all_results):
    return [rows for rows, _ in all_results]


def test_each_rank_holds_the_layout_tokens_in_order(results):
    for r, rows in enumerate(results):
        for row in rows:
            if row["error"] is None:
                want = shard_positions(row["s"], N, row["layout"])[r].tolist()
                assert row["ids"] == want
                assert row["ids"] == sorted(row["ids"])


def test_gather_inverts_shard(results):
    for rows in results:
        ok = [row for row in rows if row["error"] is None]
        assert len(ok) == 4 and all(row["roundtrip"] for row in ok)


def test_zigzag_rank0_gets_first_and_last_chunk(results):
    row = results[0][1]                       # s = 16, zigzag: 4 chunks of 4 tokens
    assert row["ids"] == [0, 1, 2, 3, 12, 13, 14, 15]
    assert results[1][1]["ids"] == [4, 5, 6, 7, 8, 9, 10, 11]


def test_sequence_not_divisible_is_a_clear_error(results):
    for rows in results:
        bad = {(row["s"], row["layout"]): row["error"] for row in rows if row["error"]}
        assert set(bad) == {(6, "zigzag"), (5, "contiguous")}
        assert "multiple of 4" in bad[(6, "zigzag")] and "multiple of 2" in bad[(5, "contiguous")]


def test_other_dims_and_local_positions(all_results):
    for r, (_, dims) in enumerate(all_results):
        for (shape, dim, layout), res in zip(DIM_CASES, dims):
            x = _numbered(shape)
            want = shard_positions(x.shape[dim], N, layout)[r]
            assert res["pos"] == want.tolist()
            assert torch.equal(res["local"], x.index_select(dim, torch.as_tensor(want))), (shape, dim)
            assert torch.equal(res["back"], x), (shape, dim)
            # the all-gather sends this rank's shard to the N - 1 others, float64
            assert res["bytes"] == (N - 1) * x.numel() // N * 8


RANK_JOBS = {"bad_input": lambda n: ("bad_input_cases", {"prefix": "shard"})}


# multi-process bad input (rank_workers.bad_input_cases) -> what its error says
test_multi_process_bad_input_says_what_to_do = bad_input_test({
    "shard dim out of range": "pass the sequence dim",
    "shard numpy": "torch.as_tensor",
    "shard gather of shards that differ": "every rank must pass its s/n tokens",
})
