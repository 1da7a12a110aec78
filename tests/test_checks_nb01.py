"""lesson10.checks.nb01_sequence_parallel and lesson10.checks.mistakes: notebook 01's checks
pass a right collective, and a known wrong one is named in the hint."""
import numpy as np
import pytest

from lesson10.checks import CheckFailed
from lesson10.checks.mistakes import all_gather_mistake, first, reduce_scatter_mistake, same
from lesson10.checks.nb01_sequence_parallel import (
    aliased,
    check_all_gather,
    check_reduce_scatter,
    reduce_scatter_dtype_mistake,
)


def _rs(xs):
    t = len(xs)
    total = np.sum([np.asarray(x, dtype=float) for x in xs], axis=0)
    c = total.shape[0] // t
    return [total[i * c:(i + 1) * c].copy() for i in range(t)]


def _ag(shards):
    return [np.concatenate(shards) for _ in shards]


def _partials(t=2, c=2, h=3, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((t * c, h)) for _ in range(t)]


def test_right_collectives_pass(capsys):
    check_reduce_scatter(_rs, seed=0)
    check_all_gather(_ag, seed=0)
    out = capsys.readouterr().out
    assert "check_reduce_scatter passed" in out and "check_all_gather passed" in out


@pytest.mark.parametrize("wrong, hint", [
    (lambda xs: _rs(xs)[::-1], "rank 0 holds the last block"),
    (lambda xs: [b / len(xs) for b in _rs(xs)], "your shards are averages"),
])
def test_a_wrong_reduce_scatter_is_named(wrong, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_reduce_scatter(wrong, seed=0)


def test_a_gather_in_the_wrong_order_is_named():
    with pytest.raises(CheckFailed, match="reverse rank order"):
        check_all_gather(lambda shards: [np.concatenate(shards[::-1]) for _ in shards], seed=0)


def test_returning_an_input_itself_is_aliasing():
    xs = _partials(t=1)
    assert aliased(xs, xs, "xs", "case") == "case: the result of rank 0 is your input xs[0] itself " \
                                            "(it shares its memory), not a new array"
    assert aliased([x.copy() for x in xs], xs, "xs", "case") is None
    assert aliased(None, xs, "xs", "case") is None


def test_an_integer_accumulator_is_recognised():
    xs = _partials()
    truncated = [np.trunc(b) for b in _rs(xs)]
    assert "integer dtype" in reduce_scatter_dtype_mistake(xs, truncated)
    assert reduce_scatter_dtype_mistake(xs, _rs(xs)) is None
    assert reduce_scatter_dtype_mistake([x.astype(int) for x in xs], truncated) is None


def test_mistake_functions_name_the_shape_of_an_axis_mix_up():
    xs = _partials(t=2, c=2, h=4)
    hidden_split = [np.sum(xs, axis=0)[:, i * 2:(i + 1) * 2] for i in range(2)]
    assert "split the hidden axis" in reduce_scatter_mistake(xs, hidden_split)
    assert reduce_scatter_mistake(xs, _rs(xs)) is None
    shards = [x[:2] for x in xs]
    assert "hidden axis" in all_gather_mistake(shards, [np.concatenate(shards, axis=1)] * 2)
    assert "new axis" in all_gather_mistake(shards, [np.stack(shards)] * 2)


def test_same_and_first():
    assert same([np.ones(2)], [np.ones(2) + 1e-12]) and not same([np.ones(2)], [np.ones(3)])
    assert same(np.nan, np.nan) and not same("x", 1.0) and not same(np.ones(2), [np.ones(2)])

    def fails():
        raise ZeroDivisionError
    found = first(2.0, [("broken", fails), ("two", lambda: 2.0), ("three", lambda: 3.0), ("two", lambda: 2)])
    assert list(found.mistakes) == ["two"]
    assert first(5.0, [("two", lambda: 2.0)]) is None
