"""Every `python -m lesson10 run ...` of the README passes its own check at its defaults, on 2
and 4 ranks, and the exit status and the last line say what happened (make test-slow: the
defaults are the README's sizes, tens of seconds of ranks).

The README's cases are taken from `run.cases` with the command's own default arguments, and
run in the shared launch (no extra start of ranks). `run moe` and `run sp --seq 4096` are
float32 runs whose largest gradients are in the hundreds (the test checks that they are): their
absolute errors reach 1e-4 and beyond, while relative to the values' size they are about 1e-6.
"""
import pytest
from test_run_readme import _cases

from lesson10.runs import cli as run

pytestmark = pytest.mark.slow   # a whole command end to end: make test-slow

README = {"moe": ["moe"], "sp4096": ["sp", "--seq", "4096"],
          "moe_knobs": ["moe", "--experts", "8", "--topk", "3", "--capacity-factor", "1.0"]}


RANK_JOBS = {name: (lambda n, argv=argv: _cases(argv, n)) for name, argv in README.items()}


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("name", sorted(README))
def test_readme_command_passes_its_own_check(rank_results, n, name):
    results = rank_results(n, name)[0]
    assert all("error" not in r for r in results), results
    for r in results:
        assert r["case"]["dtype"] == "float32"
        assert r["ok"] and r["max_rel_err"] <= r["tol"] == 1e-4, (r["worst"], r["rel_err"], r["scale"])
    # the values are in the hundreds: an absolute 1e-4 would judge float32 rounding, not the method
    assert max(max(r["scale"].values()) for r in results) > 100, "the case no longer has large values"
    line, status = run.verdict(results)
    assert status == 0 and line.endswith("passed: OK")
