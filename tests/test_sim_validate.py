"""lesson10.sim.validate: the per-rank input checks of the simulated methods."""
import numpy as np
import pytest

from lesson10.layouts import shard_positions
from lesson10.sim import SimGroup
from lesson10.sim.validate import check_doc_ids, check_group, check_qkv_shards, check_token_positions, real_finite


def _shards(n=2, c=4, heads=2, d=4, seed=0):
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal((c, heads, d)) for _ in range(n)] for _ in range(3)]


def test_a_layout_name_becomes_each_rank_s_positions():
    q, k, v = _shards()
    *_, positions, group = check_qkv_shards(q, k, v, "zigzag", None, "f")
    expected = shard_positions(8, 2, "zigzag")
    assert [p.tolist() for p in positions] == [np.asarray(p).tolist() for p in expected]
    assert isinstance(group, SimGroup) and group.n == 2


def test_positions_that_repeat_a_token_are_refused():
    q, k, v = _shards()
    with pytest.raises(ValueError, match="^f"):
        check_qkv_shards(q, k, v, [np.array([0, 1, 2, 3]), np.array([3, 4, 5, 6])], None, "f")


@pytest.mark.parametrize("bad, words", [
    (lambda q, k, v: ([x[:, 0] for x in q], k, v), "tokens, heads, head_dim"),
    (lambda q, k, v: (q, [x[:2] for x in k], v), "same tokens"),
    (lambda q, k, v: (q, k, v[:1]), "v_shards"),
])
def test_shards_of_the_wrong_shape_or_count_name_the_rule(bad, words):
    q, k, v = bad(*_shards())
    with pytest.raises(ValueError, match=words):
        check_qkv_shards(q, k, v, "contiguous", None, "ring")


def test_a_positions_list_of_the_wrong_length_is_refused():
    q, k, v = _shards()
    with pytest.raises(ValueError, match="list of 2 arrays"):
        check_qkv_shards(q, k, v, [np.arange(8)], None, "f")


def test_a_group_of_another_size_or_kind_is_refused():
    with pytest.raises(ValueError, match="3 shards for a group of 2 ranks"):
        check_group(SimGroup(2), 3, "f")
    with pytest.raises(ValueError, match="or an object with send_recv"):
        check_group(object(), 2, "f", needs=("send_recv",))

    class Net:
        def send_recv(self, *a):
            return a
    net = Net()
    assert check_group(net, 2, "f", needs=("send_recv",)) is net


def test_token_positions_default_shape_and_dtype():
    assert check_token_positions(None, 4, "q_pos").tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        check_token_positions([0, 1, 2], 4, "q_pos")
    with pytest.raises(ValueError, match="integer token ids"):
        check_token_positions([0.0, 1.0, 2.0, 3.0], 4, "q_pos")


def test_doc_ids_are_int64_of_the_sequence_length():
    assert check_doc_ids(None) is None
    ids = check_doc_ids(np.array([0, 0, 1], dtype=np.int8), 3)
    assert ids.dtype == np.int64 and ids.tolist() == [0, 0, 1]
    with pytest.raises(ValueError, match="s = 4"):
        check_doc_ids([0, 0, 1], 4)
    with pytest.raises(ValueError, match="integer document ids"):
        check_doc_ids([0.5, 1.0])


def test_real_finite_refuses_complex_text_and_nan():
    assert real_finite([1, 2], "x").dtype == np.float64
    for bad, words in (([1j], "real numbers"), (["a"], "real numbers"), ([np.inf], "NaN or inf")):
        with pytest.raises(ValueError, match=words):
            real_finite(bad, "x")


def test_the_sim_attention_family_has_one_signature_with_a_keyword_only_tail():
    """ring, ulysses, allgather and usp: the same leading parameters in one order (USP adds
    its ulysses_size after positions), everything after group keyword-only, doc_ids first."""
    import inspect

    from lesson10 import sim
    P = inspect.Parameter
    for fn in (sim.ring_attention, sim.ulysses_attention, sim.allgather_attention,
               sim.usp_attention):
        params = list(inspect.signature(fn).parameters.values())
        names = [p.name for p in params if p.kind == P.POSITIONAL_OR_KEYWORD]
        lead = ["q_shards", "k_shards", "v_shards", "positions"]
        if fn is sim.usp_attention:
            lead.append("ulysses_size")
        assert names == lead + ["causal", "group"], (fn.__name__, names)
        assert inspect.signature(fn).parameters["causal"].default is True
        tail = [p for p in params if p.kind == P.KEYWORD_ONLY]
        assert tail and tail[0].name == "doc_ids" and tail[0].default is None, fn.__name__


def test_document_ids_passed_where_the_group_goes_are_named_in_the_error():
    from lesson10 import sim
    rng = np.random.default_rng(0)
    shards = [rng.standard_normal((2, 1, 2)) for _ in range(2)]
    with pytest.raises(ValueError, match="keyword-only: pass doc_ids="):
        sim.allgather_attention(shards, shards, shards, "contiguous", True, np.zeros(4, int))
