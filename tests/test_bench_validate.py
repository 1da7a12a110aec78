"""lesson10.bench.validate: a bench case refused in one line before any rank starts."""
from argparse import Namespace

import pytest

from lesson10 import bench
from lesson10.bench.validate import attention_sizes, ulysses_fits


@pytest.mark.parametrize("argv, words", [
    (["ring", "--heads", "6", "--kv-heads", "4"], "not a multiple of --kv-heads 4"),
    (["ring", "--nproc", "2", "--seq", "6"], "--seq must be a multiple of 4; use --seq 8"),
    (["ulysses", "--nproc", "4", "--heads", "2", "--seq", "64"], "must be multiples of 4"),
    (["sp", "--nproc", "3", "--seq", "64"], "multiples of the TP degree t = 3"),
    (["memory", "--block", "7"], "use an even --block, e.g. 8"),
    (["cstar", "--cstar-heads", "6", "--kv-heads", "4"], "--cstar-heads 6"),
    (["ring", "--nproc", "0"], "--nproc"),
])
def test_a_bad_case_is_refused_before_any_rank_starts(argv, words, tmp_path, capsys):
    assert bench.main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())                      # nothing written


def test_an_out_under_a_file_is_refused(tmp_path, capsys):
    (tmp_path / "f").write_text("", encoding="utf-8")
    assert bench.main(["cstar", "--out", str(tmp_path / "f" / "out")]) == 2
    assert "--out" in capsys.readouterr().err


def test_attention_sizes_default_kv_heads_per_benchmark():
    args = Namespace(heads=8, seq=None, kv_heads=None)
    assert attention_sizes(args, "ring") == (4096, 8, 8)
    assert attention_sizes(args, "compare") == (4096, 8, 2)          # GQA: a quarter
    assert attention_sizes(Namespace(heads=2, seq=64, kv_heads=1), "compare") == (64, 2, 1)


def test_ulysses_needs_whole_kv_heads_per_rank():
    assert ulysses_fits(8, 4, 4) and ulysses_fits(4, 4, 2)
    assert not ulysses_fits(8, 2, 4) and not ulysses_fits(6, 6, 4)
