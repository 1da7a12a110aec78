"""lesson10.spmd.validate: the checks every real method runs on its local shards (no rank
needed: they look at shapes and dtypes only)."""
import pytest
import torch

from lesson10.spmd.validate import (
    IMPLS,
    check_doc_ids,
    check_float,
    check_impl,
    check_local_qkv,
    check_positions,
    check_qkv,
    require_rank,
)


def _qkv(b=1, s=4, a=4, a_kv=2, d=3, dtype=torch.float32):
    return (torch.zeros(b, s, a, d, dtype=dtype), torch.zeros(b, s, a_kv, d, dtype=dtype),
            torch.zeros(b, s, a_kv, d, dtype=dtype))


def test_gqa_returns_the_query_heads_per_kv_head():
    assert check_qkv(*_qkv(a=6, a_kv=2)) == 3
    assert check_qkv(*_qkv(a=2, a_kv=2)) == 1


@pytest.mark.parametrize("q, k, v, words", [
    (*_qkv(a=3, a_kv=2), "multiple of the number of K/V heads"),
    (*_qkv(d=0), "head dim d"),
    (_qkv()[0][0], *_qkv()[1:], "4-D"),
    (*_qkv()[:2], _qkv(a_kv=1)[2], "same shape"),
])
def test_check_qkv_names_the_broken_rule(q, k, v, words):
    with pytest.raises(ValueError, match=words):
        check_qkv(q, k, v)


def test_check_float_refuses_integers_mixed_dtypes_and_arrays():
    with pytest.raises(ValueError, match="floating-point"):
        check_float(x=torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="mixed dtypes"):
        check_float(x=torch.zeros(2), y=torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="torch.Tensor"):
        check_float(x=[1.0])


def test_local_shards_must_share_their_length_and_name_the_method():
    q, k, v = _qkv()
    check_local_qkv(q, k, v, "ring")
    with pytest.raises(ValueError, match="^ring: .*local sequence length"):
        check_local_qkv(q, k[:, :2], v[:, :2], "ring")


def test_doc_ids_and_positions_are_int64_and_refuse_floats():
    assert check_doc_ids([0, 0, 1], 3).dtype == torch.int64
    assert check_doc_ids(None) is None
    with pytest.raises(ValueError, match="integer document ids"):
        check_doc_ids([0.5, 1.0])
    with pytest.raises(ValueError, match="s = 4"):
        check_doc_ids([0, 1, 2], 4)
    q_pos, k_pos = check_positions(None, [3, 1], 2, 2, "cpu")
    assert q_pos.tolist() == [0, 1] and k_pos.tolist() == [3, 1]
    with pytest.raises(ValueError, match="integer token ids"):
        check_positions([0.0, 1.0], None, 2, 2, "cpu")
    with pytest.raises(ValueError, match="2 entries"):
        check_positions([0], None, 2, 2, "cpu")


def test_impl_choice_and_empty_blocks():
    q, k, _ = _qkv()
    assert [check_impl(i, q, k) for i in IMPLS] == list(IMPLS)
    assert check_impl("kernel", q[:, :0], k) == "einsum"
    with pytest.raises(ValueError, match="impl must be one of"):
        check_impl("flash", q, k)


def test_outside_a_rank_a_method_says_how_to_start_one():
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        pytest.skip("a process group is running in this process")
    with pytest.raises(RuntimeError, match="ring runs inside a rank"):
        require_rank("ring")
