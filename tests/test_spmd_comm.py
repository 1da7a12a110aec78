"""lesson10.spmd.comm: the collective wrappers give the right tensors and record their
bytes at ring-algorithm cost (matching lesson10.cost), with the real element size."""
import pytest
import torch

from lesson10 import cost
from lesson10.spmd.comm import count_bytes, record


def test_counter_nests_and_records():
    with count_bytes() as outer:
        record("ring_shift", 10)
        with count_bytes() as inner:
            record("ring_shift", 5)
            record("all_to_all", 7)
    record("ring_shift", 1000)                      # outside: not counted
    assert outer.sent == 22 and outer.by_op == {"ring_shift": 15, "all_to_all": 7}
    assert inner.sent == 12 and inner.calls == 2


RANK_JOBS = {"comm": lambda n: ("comm_cases", {})}


@pytest.fixture(scope="module", params=[2, 4])
def run(request, rank_results):
    n = request.param
    return n, rank_results(n, "comm")


def _x(r, n, dtype):
    return torch.arange(2 * n * 3, dtype=dtype).reshape(2, n, 3) + 100 * r


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_collectives_values_and_bytes(run, dtype):
    n, outs = run
    name = str(dtype).split(".")[-1]
    e = torch.empty((), dtype=dtype).element_size()
    xs = [_x(r, n, dtype) for r in range(n)]
    full_bytes = xs[0].numel() * e
    total = sum(xs)
    for r, res in enumerate(outs):
        ar, by = res[f"all_reduce_{name}"]
        assert torch.equal(ar, total) and ar.dtype == dtype
        assert by == {"all_reduce": cost.all_reduce_bytes(full_bytes, n)}
        ag, by = res[f"all_gather_{name}"]
        assert torch.equal(ag, torch.cat(xs, dim=1))
        assert by == {"all_gather": cost.all_gather_bytes(n * full_bytes, n)}
        rs, by = res[f"reduce_scatter_{name}"]
        assert torch.equal(rs, total[:, r:r + 1])
        assert by == {"reduce_scatter": cost.reduce_scatter_bytes(full_bytes, n)}
        a2a, by, ins, outs_ = res[f"all_to_all_{name}"]
        want = torch.cat([torch.full((outs_[j], 2), float(10 * j + r), dtype=dtype) for j in range(n)])
        assert torch.equal(a2a, want)
        assert by == {"all_to_all": (sum(ins) - ins[r]) * 2 * e}


def test_bad_input_errors(run):
    n, outs = run
    for res in outs:
        assert "multiple" in res["rs_error"]
        assert "mismatched shards" in res["shape_error"]
