"""shard_sequence / gather_sequence on 2 gloo ranks (one launch), against lesson10.layouts."""
import pytest

from lesson10.dist.bench import check_shard_cases
from lesson10.dist.launch import launch
from lesson10.layouts import shard_positions

N = 2
CASES = [(16, "contiguous"), (16, "zigzag"), (16, "striped"), (4, "zigzag"), (6, "zigzag"),
         (5, "contiguous")]


@pytest.fixture(scope="module")
def results():
    return launch(check_shard_cases, N, CASES, backend="gloo", timeout=60, quiet=True)


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
