"""`python -m lesson10 bench moe|sp` on tiny sizes (gloo, 2 ranks): the tables and their checks."""
import re

import pytest

from lesson10 import cost
from lesson10.dist import bench


def _rows(md: str, first: str):
    """Cells of the markdown table rows that start with ``| first |``."""
    return [[c.strip() for c in line.strip("|").split("|")]
            for line in md.splitlines() if line.startswith(f"| {first} |")]


def _num(cell: str) -> float:
    return float(cell.replace(",", "").rstrip("%"))


def test_bench_moe_writes_the_table(tmp_path, capsys):
    T, h, E, k = 32, 8, 4, 2
    rc = bench.main(["moe", "--nproc", "2", "--tokens", str(T), "--hidden", str(h),
                     "--experts", str(E), "--topk", str(k), "--ffn", "8", "--reps", "1",
                     "--out", str(tmp_path)])
    assert rc == 0
    md = (tmp_path / "moe.md").read_text()
    assert "wrote" in capsys.readouterr().out
    main = [r for r in _rows(md, "2") if len(r) == 11]
    # one row per (capacity factor, skew)
    assert sorted((r[1], r[2]) for r in main) == sorted(
        (cf, sk) for cf in ("none", "1", "1.25") for sk in ("0", "1", "2"))
    formula = cost.moe_a2a_bytes(k, T, h, 2, e=4)           # float32: e = 4
    for r in main:
        dropped, fwd_mean, fwd_max, form, bwd_mean = map(_num, r[4:9])
        assert form == formula
        assert fwd_mean <= fwd_max
        # the backward all-to-alls are the forward ones with the splits swapped
        assert bwd_mean == fwd_mean
        assert _num(r[9]) >= 1.0 and _num(r[10]) >= 1.0     # max/mean >= 1
        if r[1] == "none":
            assert dropped == 0.0                           # dropless
        if r[2] == "0" and r[1] == "none":                  # random uniform routing: near the formula
            assert 0.6 * formula <= fwd_mean <= 1.4 * formula
    # skew concentrates the routed copies: skew 2 is more imbalanced than skew 0
    by = {(r[1], r[2]): r for r in main}
    assert _num(by[("none", "2")][9]) > _num(by[("none", "0")][9])
    # dense single-process comparison rows, for skew 0 and 2, with N = N_e T tokens
    dense = [r for r in _rows(md, "2") if len(r) == 7]
    assert sorted(r[1] for r in dense) == ["0", "2"]
    assert all(r[2] == str(2 * T) for r in dense)


def test_bench_sp_writes_the_table(tmp_path):
    s, h, t = 16, 8, 2
    rc = bench.main(["sp", "--nproc", str(t), "--seq", str(s), "--hidden", str(h),
                     "--reps", "1", "--out", str(tmp_path)])
    assert rc == 0
    md = (tmp_path / "sp.md").read_text()
    time_part, mem_part = md.split("## Time and bytes")[1].split("## Activation memory")
    byt = {r[1]: r for r in _rows(time_part, str(t))}
    mem = {r[1]: r for r in _rows(mem_part, str(t)) if len(r) == 7}
    ratio = [r for r in _rows(mem_part, str(t)) if len(r) == 5]
    assert set(byt) == set(mem) == {"TP", "TP + SP"} and len(ratio) == 1
    # same activation bytes both ways, = one all-reduce of (s, h) float32 = half a layer's
    half_layer = cost.comm_bytes("sp", s, h, t, e=4) / 2
    for col in (3, 4):                                      # forward, backward
        assert _num(byt["TP"][col]) == _num(byt["TP + SP"][col]) == half_layer
    assert _num(byt["TP"][5]) == 0                          # no parameter all-reduce under TP
    assert _num(byt["TP + SP"][5]) > 0                      # LN weights are partial sums under SP
    # activation memory per rank: SP keeps less than TP, as this code's terms predict
    assert _num(mem["TP + SP"][2]) < _num(mem["TP"][2])
    for r in mem.values():
        assert _num(r[2]) / (s * h) == pytest.approx(_num(r[3]), abs=0.01)
        assert _num(r[3]) == pytest.approx(_num(r[4]), rel=0.05)
    assert _num(ratio[0][1]) < 1


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_block_terms_are_the_lessons_share_of_a_layer(t):
    s, b, h = 64, 2, 32
    sbh = s * b * h
    tp = bench.sp_block_activation_bytes(s, b, h, t, sp=False)
    sp = bench.sp_block_activation_bytes(s, b, h, t, sp=True)
    # Korthikanti: LN input 2, fc1 input 2, mask 1 replicated; GELU in/out 16 split
    assert tp == pytest.approx(sbh * (5 + 16 / t))
    assert sp == pytest.approx(21 * sbh / t)
    # the rest of the layer (attention, flash, and the other LN): 5 + 8/t replicated resp. 13/t
    assert cost.activation_bytes(s, b, h, 4, t=t) - tp == pytest.approx(sbh * (5 + 8 / t))
    assert cost.activation_bytes(s, b, h, 4, t=t, sp=True) - sp == pytest.approx(13 * sbh / t)
    # keeping the all-gathered fc1 input costs (1 - 1/t) of it
    full = bench.sp_block_activation_bytes(s, b, h, t, sp=True, regather=False)
    assert full - sp == pytest.approx(2 * sbh * (1 - 1 / t))


def test_bench_moe_sp_reject_bad_sizes(tmp_path):
    with pytest.raises(ValueError, match="multiple of every --nproc"):
        bench.main(["moe", "--nproc", "3", "--experts", "8", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="--topk"):
        bench.main(["moe", "--nproc", "2", "--experts", "4", "--topk", "5", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="multiples of the TP degree"):
        bench.main(["sp", "--nproc", "3", "--seq", "16", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        bench.main(["moe", "--tokens", "0", "--out", str(tmp_path)])
    assert not re.search("moe|sp", " ".join(p.name for p in tmp_path.iterdir()))
