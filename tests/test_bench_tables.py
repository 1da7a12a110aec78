"""The tables of `bench memory`, `bench moe`, `bench sp` and `bench ulysses --breakdown`,
made from small hand-written rows (no rank is started): each column is computed from the
row it stands for."""
from lesson10 import cost
from lesson10.bench.memory import memory_table
from lesson10.bench.moe import _popularity, moe_table
from lesson10.bench.sp import sp_table
from lesson10.bench.ulysses_breakdown import PARTS, breakdown_table


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _body(text: str, header_word: str) -> list[list[str]]:
    """The rows of the first table whose header holds ``header_word``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|") and header_word in line)
    body = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        body.append(_cells(line))
    return body


def test_memory_table_compares_one_rank_with_one_process():
    rows = [{"n": 2, "c": 4, "s": 8, "ring_rise": 3_000_000, "inputs": 1_500_000},
            {"n": 4, "c": 4, "s": 16, "ring_rise": 3_100_000, "inputs": 1_500_000}]
    body = _body(memory_table(rows), "N_c")
    assert body == [["2", "4", "8", "1.5", "3.0", "3.0"], ["4", "4", "16", "1.5", "3.1", "6.0"]]


def _moe_row(n, cf, median_s, method="ep"):
    return {"method": method, "n": n, "cf": cf, "skew": 0.0, "median_s": median_s, "k": 2, "T": 8,
            "h": 4, "elem": 4, "drop_rate": 0.25, "bytes_fwd": [100, 300], "bytes_bwd": [50, 50],
            "counts": [1, 3], "load_rank": [2, 2]}


def test_moe_table_reports_drops_imbalance_and_the_dense_speed_up():
    text = moe_table([_moe_row(2, None, 0.1), _moe_row(2, 1.0, 0.05),
                      {"method": "dense", "n": 2, "skew": 0.0, "median_s": 0.3}])
    steps = _body(text, "dropped %")
    assert [r[:3] for r in steps] == [["2", "none", "0"], ["2", "1", "0"]]
    dropless = steps[0]
    assert dropless[4] == "25.0" and dropless[5] == "200" and dropless[6] == "300"
    assert dropless[7] == f"{cost.moe_a2a_bytes(2, 8, 4, 2, e=4):,.0f}"
    assert dropless[9:] == ["1.50", "1.00"]                 # max/mean of [1, 3] and of [2, 2]
    (speed,) = _body(text, "speed-up")                        # only the dropless row has one
    assert speed == ["2", "0", "16", "300.0", "100.0", "3.00", "150%"]


def test_moe_table_without_a_dense_run_has_no_speed_up_table():
    assert "speed-up" not in moe_table([_moe_row(2, None, 0.1)])


def test_moe_popularity_is_fixed_by_its_seed():
    assert _popularity(4, 1).tolist() == _popularity(4, 1).tolist()
    assert _popularity(4, 1).tolist() != _popularity(4, 2).tolist()


def _sp_row(sp, median_s, saved):
    return {"n": 2, "sp": sp, "dtype": "float32", "s": 8, "b": 1, "h": 4, "ffn": 16, "elem": 4,
            "stats_elem": 4, "saved_bytes": saved, "median_s": median_s,
            "bytes_fwd_by_op": {}, "bytes_bwd_by_op": {"ag_recompute": 7, "param_grad": 9}}


def test_sp_table_times_only_timed_rows_and_compares_sp_with_tp():
    text = sp_table([_sp_row(False, 0.2, 1000), _sp_row(True, 0.1, 600)])
    timed = _body(text, "fwd+bwd ms")
    assert [r[:4] for r in timed] == [["2", "TP", "float32", "200.0"], ["2", "TP + SP", "float32", "100.0"]]
    assert timed[1][6:8] == ["7", "9"]
    (ratio,) = _body(text, "SP / TP measured")
    assert ratio[2] == "0.6000" and ratio[-1] == "2.00"
    untimed = sp_table([_sp_row(False, None, 1000), _sp_row(True, None, 600)])
    assert _body(untimed, "fwd+bwd ms") == [] and _body(untimed, "SP / TP measured")[0][-1] == "-"


def test_breakdown_table_is_relative_to_the_floor_and_the_unfused_step():
    parts = [0.01] * len(PARTS)
    rows = [{"n": 2, "method": "sdpa", "threads": 2, "fused": False, "median_s": 0.1, "parts": None},
            {"n": 2, "method": "ulysses", "fused": False, "median_s": 0.2, "parts": parts},
            {"n": 2, "method": "ulysses", "fused": True, "groups": 2, "median_s": 0.1, "parts": parts}]
    floor, unfused, fused = _body(breakdown_table(rows), "variant")
    assert floor[:4] == ["floor: SDPA, 1 process x 2 threads", "100.0", "1.00", ""]
    assert unfused[:4] == ["unfused", "200.0", "2.00", "1.00"] and unfused[4] == "10.0 (5%)"
    assert fused[:4] == ["fused, 2 head group(s)", "100.0", "1.00", "0.50"] and fused[4] == "10.0 (10%)"
    assert len(fused) == 4 + len(PARTS)
