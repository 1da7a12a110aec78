"""lesson10.runs.results and lesson10.runs.moe_checks: the parts of a checked run's result
that need no rank (errors against their scale, element sizes, uniform routing)."""
import numpy as np
import pytest
import torch

from lesson10.runs.moe_checks import uniform_router_tokens
from lesson10.runs.results import TOL, Errors, elem_size


def test_errors_keep_the_largest_difference_and_the_scale():
    errs = Errors()
    errs.tensor("out", torch.tensor([1.0, 2.0]), torch.tensor([1.5, -4.0]))
    errs.value("bytes", [10, 20], np.array([10, 23]))
    assert errs == {"out": 6.0, "bytes": 3.0}
    assert errs.scale == {"out": 4.0, "bytes": 23.0}
    errs.tensor("empty", torch.zeros(0), torch.zeros(0))
    assert errs["empty"] == 0.0 and errs.scale["empty"] == 0.0


def test_a_gradient_never_computed_is_an_error():
    with pytest.raises(RuntimeError, match="dq: no tensor to compare"):
        Errors().tensor("dq", None, torch.zeros(2))


def test_element_sizes_and_tolerances_cover_each_dtype():
    assert [elem_size(d) for d in ("float64", "float32", "bfloat16")] == [8, 4, 2]
    assert set(TOL) == {"float64", "float32", "bfloat16"}
    assert TOL["float64"] < TOL["float32"] < TOL["bfloat16"]


def test_uniform_router_tokens_route_every_expert_equally():
    T, h, E, k = 6, 5, 4, 2
    x, router_w = uniform_router_tokens(T, h, E, k, start=1)
    assert x.shape == (T, h) and router_w.shape == (h, E)
    top = torch.topk(x @ router_w, k, dim=1).indices
    assert top[0].tolist() == [1, 2] and top[1].tolist() == [3, 0]
    counts = torch.bincount(top.flatten(), minlength=E)
    assert counts.tolist() == [k * T // E] * E


def test_uniform_routing_needs_a_hidden_size_of_at_least_e():
    with pytest.raises(ValueError, match="h >= E"):
        uniform_router_tokens(4, 3, 4, 2)
