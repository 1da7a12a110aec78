"""`run`'s verdict and report: passed, failed and rejected told apart, a refused case end to end,
and where the bytes went across nodes (the README's commands at their defaults:
tests/test_run_readme_defaults.py)."""
from lesson10.runs import cli as run

#: the README's `run moe --node-size 2 --max-nodes 1` (its defaults otherwise)
MOE_NODES = ["moe", "--node-size", "2", "--max-nodes", "1"]


def _cases(argv, n):
    args = run._parser("test").parse_args(argv + ["--nproc", str(n)])
    todo = run.cases(args, n)
    (worker,) = {name for name, _ in todo}
    return worker, [kw for _, kw in todo]


RANK_JOBS = {"moe_nodes": lambda n: _cases(MOE_NODES, n)}
#: Ulysses with one K/V head on two ranks: refused (each rank needs whole K/V heads)
RANK_JOBS["rejected"] = lambda n: ("check_attention", [dict(method="ulysses", s=16, a=2, a_kv=1, d=4,
                                                            dtype="float32")])


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
    assert run.verdict(results) == (f"{len(results)} checked run(s) passed: OK", 0), results
    text = "\n".join(run.report(r) for r in results)
    for r in results:
        assert r["nodes"] == 2 and r["dispatch"] == "two_level" and r["nodes_used"] == 1
        assert r["fwd_link"] == r["link_expected"]
        assert f"{r['fwd_link']['inter']:,}" in text
    assert "on 2 nodes of 2 ranks" in text and "two_level dispatch, rank 0 from the routing" in text
    one_node = rank_results(2, "moe_nodes")[0]
    assert all(r["nodes"] == 1 for r in one_node)
    assert "across nodes" not in "\n".join(run.report(r) for r in one_node)
