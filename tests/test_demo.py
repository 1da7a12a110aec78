"""`python -m lesson10 demo`: every simulated method against its reference and the lesson's bytes."""
import subprocess
import sys

import pytest

from lesson10.runs.demo import format_table, run_demo


@pytest.fixture(scope="module")
def rows():
    return run_demo(seed=1)


def test_every_method_matches_its_reference(rows):
    names = [r[0] for r in rows]
    for needle in ("SP", "ring zigzag", "ring contiguous", "ulysses", "MoE"):
        assert any(needle in n for n in names), needle
    for method, _n, err, *_ in rows:
        assert err < 1e-12, (method, err)


def test_measured_bytes_equal_the_closed_forms(rows):
    for method, _n, _err, measured, formula, _note in rows:
        if method.startswith("MoE"):
            # random routing: the formula is the expectation; drops only lower it
            assert measured <= 1.3 * formula
            continue
        assert measured == pytest.approx(formula, rel=1e-12), method


def test_table_and_cli(rows):
    table = format_table(rows)
    assert table.count("\n") == len(rows) + 1
    out = subprocess.run([sys.executable, "-m", "lesson10", "demo"], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    assert "worst error" in out.stdout and "ring zigzag" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "lesson10", "nonsense"], capture_output=True, text=True,
                         timeout=600)
    assert bad.returncode == 2 and "unknown command" in bad.stderr
