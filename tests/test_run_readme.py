"""Every `python -m lesson10 run ...` of the README passes its own check at its defaults, on 2
and 4 ranks, and the exit status and the last line say what happened.

The README's cases are taken from `run.cases` with the command's own default arguments, and
run in the shared launch (no extra start of ranks). `run moe` and `run sp --seq 4096` are
float32 runs whose largest gradients are in the hundreds (the test checks that they are): their
absolute errors reach 1e-4 and beyond, while relative to the values' size they are about 1e-6.
"""
import pytest

from lesson10.runs import cli as run

README = {"moe": ["moe"], "sp4096": ["sp", "--seq", "4096"],
          "moe_nodes": ["moe", "--node-size", "2", "--max-nodes", "1"],
          "moe_knobs": ["moe", "--experts", "8", "--topk", "3", "--capacity-factor", "1.0"]}


def _cases(argv, n):
    args = run._parser("test").parse_args(argv + ["--nproc", str(n)])
    todo = run.cases(args, n)
    (worker,) = {name for name, _ in todo}
    return worker, [kw for _, kw in todo]


RANK_JOBS = {name: (lambda n, argv=argv: _cases(argv, n)) for name, argv in README.items()}
#: Ulysses with one K/V head on two ranks: refused (each rank needs whole K/V heads)
RANK_JOBS["rejected"] = lambda n: ("check_attention", [dict(method="ulysses", s=16, a=2, a_kv=1, d=4,
                                                            dtype="float32")])


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


def _res(ok=True, **kw):
    base = {"method": "moe", "case": {"T": 4, "dtype": "float32"}, "n": 2, "rank": 0,
            "err": {"y": 2e-3}, "max_err": 2e-3, "scale": {"y": 10.0}, "rel_err": {"y": 2e-4},
            "max_rel_err": 2e-4, "worst": "y", "tol": 1e-4, "ok": ok, "fwd": 0, "bwd": 0,
            "fwd_by_op": {}, "bwd_by_op": {}, "formula_fwd": 0, "time_s": 0.01}
    return {**base, **kw}


def test_verdict_tells_passed_failed_and_rejected_apart():
    assert run.verdict([_res(), _res()]) == ("2 checked run(s) passed: OK", 0)
    line, status = run.verdict([_res(), _res(ok=False)])
    assert status == 1 and line.startswith("FAILED") and "y 2.0e-04 > 0.0001" in line
    rejected = {"method": "ulysses", "case": {"a_kv": 1}, "error": "needs whole K/V heads"}
    line, status = run.verdict([_res(ok=False), rejected])
    assert status == 2 and line.startswith("REJECTED") and "ulysses: needs whole K/V heads" in line
    assert "TOO LARGE" not in line + run.report(rejected) + run.report(_res(ok=False))
    assert "REJECTED" in run.report(rejected) and "needs whole K/V heads" in run.report(rejected)
    assert "FAILED" in run.report(_res(ok=False))


def test_rejected_case_exits_2_and_says_what(capsys, monkeypatch, rank_results):
    """`run` end to end on what the ranks returned for a refused case (from the shared launch)."""
    import importlib
    launch_mod = importlib.import_module("lesson10.spmd.launch")   # (the package exports launch())
    got = rank_results(2, "rejected")
    monkeypatch.setattr(launch_mod, "launch", lambda *a, **k: got)
    rc = run.main(["ulysses", "--nproc", "2", "--seq", "16", "--heads", "2", "--kv-heads", "2",
                   "--dim", "4"])        # (a case the parent lets through; the ranks' answer is faked)
    out = capsys.readouterr().out
    assert rc == 2, out
    assert "REJECTED" in out and "K/V heads" in out and "TOO LARGE" not in out


def test_the_report_says_where_the_bytes_went_across_nodes(rank_results):
    results = rank_results(4, "moe_nodes")[0]
    text = "\n".join(run.report(r) for r in results)
    for r in results:
        assert r["nodes"] == 2 and r["dispatch"] == "two_level" and r["nodes_used"] == 1
        assert r["fwd_link"] == r["link_expected"]
        assert f"{r['fwd_link']['inter']:,}" in text
    assert "on 2 nodes of 2 ranks" in text and "two_level dispatch, rank 0 from the routing" in text
    one_node = rank_results(2, "moe_nodes")[0]
    assert all(r["nodes"] == 1 for r in one_node)
    assert "across nodes" not in "\n".join(run.report(r) for r in one_node)
