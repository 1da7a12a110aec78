"""The c* experiment: the paced ring link (ring_options(bandwidth=)) and `bench cstar`."""
import math

import pytest

from lesson10 import cost
from lesson10.bench.cstar import crossing, cstar_table
from lesson10.spmd.ring import ring_options

pytestmark = pytest.mark.slow   # a whole command end to end: make test-slow

# 400 ms per transfer: the paced time dominates the real one (a few ms idle, tens of ms on a
# slow, loaded machine), so the bounds below hold however fast the machine is
BW, NBYTES = 5e6, 2_000_000

RANK_JOBS = {"paced": lambda n: ("paced_ring", {"bandwidth": BW, "nbytes": NBYTES}),
             "syncs": lambda n: ("clock_syncs", {})}


def _row(c, compute, transfer):
    return {"c": c, "compute_no_overlap_s": compute, "exposed_no_overlap_s": transfer,
            "compute_s": compute, "transfer_s": transfer, "exposed_s": max(0.0, transfer - compute),
            "model_exposed_s": 0.0}


def test_crossing_is_where_compute_meets_transfer():
    # compute 4 c^2 units, transfer 2 c units: equal at c = 1/2 * ... = 64 for these constants
    rows = [_row(c, c * c / 64, c) for c in (16, 32, 128, 256)]
    assert crossing(rows) == pytest.approx(64, rel=1e-9)        # log-log interpolation is exact
    assert crossing(rows[2:]) is None                            # compute already ahead
    assert crossing([_row(c, 1e-3 * c, c) for c in (16, 32)]) is None


def test_table_reports_the_prediction_and_the_verdict():
    rows = [_row(c, c * c / 64, c) for c in (16, 32, 128, 256)]
    res = {"F": 1e10, "W_set": 1e8, "W": 1e8, "c_star": 100.0, "causal": False, "g": 1.0,
           "e": 4, "a": 2, "d": 8, "dtype": "float32", "rows": rows}
    text = "\n".join(cstar_table(res))
    assert "**100** tokens" in text and "**64**" in text and "Within 2x: **yes**" in text
    res["c_star"] = 400.0
    assert "Within 2x: **no**" in "\n".join(cstar_table(res))


def test_bandwidth_must_be_a_positive_number():
    for bad in (0, -1.0, float("inf"), True, "fast"):
        with pytest.raises(ValueError, match="bandwidth"), ring_options(bandwidth=bad):
            pass


def test_paced_link_takes_bytes_over_bandwidth_and_hides_behind_compute(rank_results):
    out = rank_results(2, "paced")
    for r, res in enumerate(out):
        assert res["alone"] >= NBYTES / BW                 # not done before B / W
        assert res["alone"] < 2 * NBYTES / BW               # and not a second period later
        assert res["hidden_wait"] < 0.5 * NBYTES / BW       # compute covered the transfer
        assert res["received"] == 1 + (r - 1) % 2           # from rank r - 1
        sweep = res["sweep"]
        assert len(sweep["rows"]) == 2 and sweep["W"] <= sweep["W_set"] * 1.01
        e, g = 4, 2.0
        assert sweep["c_star"] == pytest.approx(
            cost.min_block_size(sweep["F"], sweep["W"], False, g, e))
        for row in sweep["rows"]:
            nbytes = 2 * row["c"] * (2 * 8 / g) * e
            assert row["transfer_s"] == pytest.approx(nbytes / sweep["W"])
            assert row["exposed_no_overlap_s"] >= 0.9 * nbytes / sweep["W_set"]
            assert math.isfinite(row["compute_s"])


def test_every_clock_read_of_the_cstar_experiment_waits_for_the_gpu(rank_results):
    """On CUDA, kernels and NCCL transfers run behind the host's back: the c* experiment
    synchronises before and after each timed piece (counted here through stand-ins, since on
    CPU the synchronisation is a no-op), and the ring's per-round timings do too, but only
    while timings are recorded."""
    for res in rank_results(2, "syncs"):
        assert res["cstar"] == 2 * 2 * 2                     # F and W: before and after, 2 reps each
        assert res["ring_timed"] == 4 * res["rounds"]        # 4 clock reads per forward round
        assert res["ring_plain"] == 0
