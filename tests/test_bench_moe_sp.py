"""`python -m lesson10 bench moe|sp` on tiny sizes (gloo, 2 ranks): the tables and their checks."""
import re
from fractions import Fraction

import pytest

from lesson10 import bench, cost

pytestmark = pytest.mark.slow   # a whole command end to end: make test-slow


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
    assert (tmp_path / "moe.png").read_bytes()[:4] == b"\x89PNG"
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


@pytest.fixture(scope="module")
def sp_md(tmp_path_factory):
    out = tmp_path_factory.mktemp("sp")
    rc = bench.main(["sp", "--nproc", "2", "4", "--seq", str(SP_S), "--hidden", str(SP_H),
                     "--reps", "1", "--out", str(out)])
    assert rc == 0
    return (out / "sp.md").read_text()


SP_S, SP_H = 16, 8          # b = 1, ffn = 4h, p = 0.1 (the benchmark's defaults)


@pytest.mark.parametrize("t", [2, 4])
def test_bench_sp_bytes(sp_md, t):
    s, h, e = SP_S, SP_H, 4                                  # timed rows: float32
    time_part = sp_md.split("## Time and bytes")[1].split("## Activation memory")[0]
    byt = {r[1]: r for r in _rows(time_part, str(t))}
    assert set(byt) == {"TP", "TP + SP"} and all(r[2] == "float32" for r in byt.values())
    # same activation bytes both ways, = one all-reduce of (s, h) float32 = half a layer's
    half_layer = cost.comm_bytes("sp", s, h, t, e=e) / 2
    for col in (4, 5):                                      # forward, backward
        assert _num(byt["TP"][col]) == _num(byt["TP + SP"][col]) == half_layer == _num(byt["TP"][8])
    # SP re-gathers the s/t shard of the fc1 input in the backward: (t-1)/t of (s, h)
    assert _num(byt["TP"][6]) == 0
    assert _num(byt["TP + SP"][6]) == (t - 1) * s * h * e / t
    assert _num(byt["TP"][7]) == 0                          # no parameter all-reduce under TP
    assert _num(byt["TP + SP"][7]) == cost.all_reduce_bytes(3 * h * e, t)   # LN w, b; fc2 bias


@pytest.mark.parametrize("t", [2, 4])
def test_bench_sp_memory_is_the_count(sp_md, t):
    s, h = SP_S, SP_H
    sbh = s * h
    mem_part = sp_md.split("## Activation memory")[1]
    mem = {(r[1], r[2]): r for r in _rows(mem_part, str(t)) if len(r) == 10}
    ratio = {r[1]: r for r in _rows(mem_part, str(t)) if len(r) == 7}
    assert set(mem) == {(m, d) for m in ("TP", "TP + SP") for d in ("float32", "bfloat16")}
    assert set(ratio) == {"float32", "bfloat16"}
    for (mode, dt), r in mem.items():
        e = 4 if dt == "float32" else 2
        sp = mode == "TP + SP"
        tokens = s // t if sp else s
        measured, count, stats = _num(r[3]), _num(r[4]), _num(r[5])
        # CPU LayerNorm keeps mean and 1/std in the input dtype: two numbers per token held
        assert stats == 2 * e * tokens
        # LN input e, fc1 input e (SP: its s/t shard), GELU in/out 2 * 4e/t, bool mask 1
        want = sbh * (10 * e + 1) / t if sp else sbh * (2 * e + 1 + 8 * e / t)
        assert measured == count == want + stats
        if dt == "bfloat16":                                # the lesson's terms, exactly
            assert measured - stats == (21 * sbh / t if sp else sbh * (5 + 16 / t))
    # SP / TP without the LN statistics: the lesson's (21/t) / (5 + 16/t) in bfloat16
    sp_b, tp_b = (mem[(m, "bfloat16")] for m in ("TP + SP", "TP"))
    got = Fraction(int(_num(sp_b[3]) - _num(sp_b[5])), int(_num(tp_b[3]) - _num(tp_b[5])))
    assert got == Fraction(21, 5 * t + 16)
    assert _num(ratio["bfloat16"][3]) == _num(ratio["bfloat16"][4]) == round(21 / (5 * t + 16), 4)
    assert _num(ratio["float32"][3]) == round(41 / (9 * t + 32), 4)
    # storing the shard makes SP save memory in every dtype
    for dt in ("float32", "bfloat16"):
        assert _num(ratio[dt][2]) < 1


@pytest.mark.parametrize("t", [1, 2, 4, 8])
def test_block_terms_are_the_lessons_share_of_a_layer(t):
    s, b, h = 64, 2, 32
    sbh = s * b * h
    tp = cost.sp_block_activation_bytes(s, b, h, t, sp=False)
    sp = cost.sp_block_activation_bytes(s, b, h, t, sp=True)
    # Korthikanti: LN input 2, fc1 input 2, mask 1 replicated; GELU in/out 16 split
    assert tp == pytest.approx(sbh * (5 + 16 / t))
    assert sp == pytest.approx(21 * sbh / t)
    # the rest of the layer (attention, flash, and the other LN): 5 + 8/t replicated resp. 13/t
    assert cost.activation_bytes(s, b, h, 4, t=t) - tp == pytest.approx(sbh * (5 + 8 / t))
    assert cost.activation_bytes(s, b, h, 4, t=t, sp=True) - sp == pytest.approx(13 * sbh / t)
    # keeping the all-gathered fc1 input costs (1 - 1/t) of it
    full = cost.sp_block_activation_bytes(s, b, h, t, sp=True, regather=False)
    assert full - sp == pytest.approx(2 * sbh * (1 - 1 / t))


def test_bench_moe_sp_reject_bad_sizes(tmp_path, capsys):
    for argv, says in ((["moe", "--nproc", "3", "--experts", "8"], "do not split over N_e = 3"),
                       (["moe", "--nproc", "2", "--experts", "4", "--topk", "5"], "--topk 5"),
                       (["sp", "--nproc", "3", "--seq", "16"], "multiples of the TP degree"),
                       (["moe", "--tokens", "0"], "--tokens must be")):
        assert bench.main([*argv, "--out", str(tmp_path)]) == 2
        assert says in capsys.readouterr().err
    assert not re.search("moe|sp", " ".join(p.name for p in tmp_path.iterdir()))
