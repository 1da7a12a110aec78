"""The public API of DESIGN.md: names, argument order and defaults; `sim` without torch;
the version; the `python -m lesson10` command dispatch.

Every signature below is copied from DESIGN.md ("Signatures below are the contract; add
keyword arguments freely, keep these"), so a renamed argument or a changed default fails
here before it breaks a notebook.
"""
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lesson10 import __main__ as cli
from lesson10 import checks, cost, layouts, sim

ROOT = Path(__file__).resolve().parents[1]
_ANY = object()


def assert_signature(fn, *spec):
    """``spec``: the leading parameters in order; ``"name"`` (any default) or
    ``("name", default)``. Further parameters may follow (added keywords)."""
    params = list(inspect.signature(fn).parameters.values())
    assert len(params) >= len(spec), (fn, params)
    for p, item in zip(params, spec):
        name, default = (item, _ANY) if isinstance(item, str) else item
        assert p.name == name, f"{fn.__qualname__}: parameter {p.name!r}, DESIGN.md says {name!r}"
        if default is not _ANY:
            assert p.default is not inspect.Parameter.empty and p.default == default, \
                f"{fn.__qualname__}({name}=...): default {p.default!r}, DESIGN.md says {default!r}"


def test_layouts_and_cost_signatures():
    assert_signature(layouts.shard_positions, "s", "n", "layout")
    assert_signature(layouts.causal_work, "n", "layout", ("s", None))
    assert_signature(layouts.ring_time, "work")
    assert_signature(cost.activation_bytes, "s", "b", "h", "a", ("t", 1), ("sp", False), ("flash", True))
    assert_signature(cost.comm_bytes, "method", "s", "h", "n", ("g", 1), ("e", 2))
    assert_signature(cost.min_block_size, "F", "W", ("causal", False), ("g", 1), ("e", 2))
    assert_signature(cost.moe_a2a_bytes, "k", "T", "h", "Ne", ("e", 2))
    assert_signature(cost.moe_comm_ratio, "F", "W", "Ne", "d_ff", ("swiglu", False))
    assert {"H100", "H200", "NVLink", "InfiniBand"} <= set(cost.HARDWARE)


def test_sim_signatures():
    assert_signature(sim.SimGroup, "n", ("e", 2))
    g = sim.SimGroup(2)
    assert_signature(g.all_reduce, "xs")
    assert_signature(g.reduce_scatter, "xs", ("axis", 0))
    assert_signature(g.all_gather, "xs", ("axis", 0))
    assert_signature(g.all_to_all, "blocks")
    assert_signature(g.ring_shift, "xs")
    assert callable(g.reset) and list(g.bytes_sent) == [0, 0]
    assert_signature(sim.attention, "q", "k", "v", ("causal", False), ("q_pos", None), ("k_pos", None))
    assert_signature(sim.merge, "o1", "lse1", "o2", "lse2")
    assert_signature(sim.tp_forward, "partials", "op", "group")
    assert_signature(sim.sp_forward, "partials", "op", "group")
    for fn in (sim.ring_attention, sim.ulysses_attention):     # "the same signature"
        assert_signature(fn, "q_shards", "k_shards", "v_shards", "positions", ("causal", True),
                         ("group", None))
    assert_signature(sim.seq_to_heads, "shards", "group")
    assert_signature(sim.heads_to_seq, "shards", "group")
    assert_signature(sim.route_topk, "logits", "k")
    assert_signature(sim.moe_layer, "x_shards", "router_w", "experts", "k", ("capacity_factor", None),
                     ("group", None))
    assert_signature(sim.moe_reference, "x", "router_w", "experts", "k", ("capacity_factor", None))
    assert_signature(sim.simulate_moe, "T", "E", "k", "Ne", ("capacity_factor", None), ("skew", 0.0),
                     ("seed", 0))
    assert_signature(sim.switch_aux_loss, "probs", "experts", ("alpha", 1e-2))
    assert_signature(sim.update_expert_bias, "bias", "load", "rate")


def test_dist_signatures():
    from lesson10 import spmd
    params = inspect.signature(spmd.launch).parameters
    assert list(params)[:3] == ["fn", "nprocs", "args"]
    assert params["args"].kind is inspect.Parameter.VAR_POSITIONAL
    assert params["backend"].default == "auto" and "timeout" in params
    for fn in (spmd.shard_sequence, spmd.gather_sequence):
        assert_signature(fn, list(inspect.signature(fn).parameters)[0], "layout", ("group", None), ("dim", 1))
    assert list(inspect.signature(spmd.shard_sequence).parameters)[0] == "x"
    assert list(inspect.signature(spmd.gather_sequence).parameters)[0] == "x_local"
    assert_signature(spmd.ring_attention, "q", "k", "v", ("causal", True), ("layout", "zigzag"),
                     ("group", None))
    assert_signature(spmd.ulysses_attention, "q", "k", "v", ("causal", True), ("layout", "contiguous"),
                     ("group", None))
    import torch
    assert issubclass(spmd.SequenceParallelBlock, torch.nn.Module)
    assert issubclass(spmd.ExpertParallelMoE, torch.nn.Module)


def test_sim_and_spmd_share_one_vocabulary():
    """The same concept has the same name and argument order in sim and spmd."""
    from lesson10 import spmd
    from lesson10.spmd import attention as dattn
    from lesson10.spmd import moe as dmoe

    def names(fn):
        return list(inspect.signature(fn).parameters)
    assert names(sim.shard_sequence)[:3] == names(spmd.shard_sequence)[:3] == ["x", "layout", "group"]
    assert names(layouts.visible)[:4] == names(dattn.visible)[:4]          # one visibility mask
    assert not hasattr(dattn, "visible_mask")
    # moe_reference: the same arguments after the experts, and y unless return_aux=True
    assert names(sim.moe_reference)[3:] == names(dmoe.moe_reference)[4:]
    for fn in (sim.moe_reference, dmoe.moe_reference):
        assert inspect.signature(fn).parameters["return_aux"].default is False
    # the sim's capacity rule takes C; the exercise capacity_keep takes the capacity factor
    assert not hasattr(sim, "capacity_keep")
    assert names(sim.keep_within_capacity) == ["experts", "E", "capacity"]


def test_check_failed_is_an_assertion_error_and_every_exercise_has_a_check():
    assert issubclass(checks.CheckFailed, AssertionError)
    for name in checks.EXERCISES:
        assert callable(getattr(checks, f"check_{name}"))


def test_sim_layouts_and_cost_do_not_import_torch():
    code = ("import sys; import lesson10, lesson10.sim, lesson10.layouts, lesson10.cost; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_version_is_the_pyproject_version():
    import lesson10
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert lesson10.__version__ == project["version"]


# ---------------------------------------------------------------- python -m lesson10
def test_cli_help_names_the_five_commands(capsys):
    assert cli.main(["--help"]) == 0
    usage = capsys.readouterr().out
    for cmd in ("demo", "run", "bench", "grade", "build"):
        assert re.search(rf"^\s+{cmd}\b", usage, re.M), cmd
    assert cli.main(["nonsense"]) == 2
    assert "unknown command 'nonsense'" in capsys.readouterr().err


def test_cli_dispatches_build_grade_run_and_bench(tmp_path, capsys):
    assert cli.main(["build", "--check"]) == 0                 # the committed tree is up to date
    assert "up to date" in capsys.readouterr().out
    assert cli.main(["grade", str(tmp_path / "missing.ipynb")]) == 2
    assert "no such file" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:                    # reaches run's own parser
        cli.main(["run", "no-such-method"])
    assert info.value.code == 2 and "invalid choice" in capsys.readouterr().err
    # reaches the benchmark's checks, which refuse in one line before any rank starts
    assert cli.main(["bench", "moe", "--tokens", "0", "--out", str(tmp_path)]) == 2
    assert "--tokens must be an integer >= 1" in capsys.readouterr().err


def test_cli_bench_sim_writes_its_table_where_told(tmp_path, capsys):
    assert cli.main(["bench", "sim", "--quick", "--reps", "1", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "sim.md").read_text()
    assert "wrote" in capsys.readouterr().out
    # one simulate_moe row (T = 2**20, dropless): random uniform routing sends the lesson's
    # 2 k T h e (N_e - 1)/N_e bytes up to sampling noise
    m = re.search(r"\| simulate_moe T=1,048,576 .*CF=None .*drop (\S+), .*bytes/formula ([\d.]+) \|", md)
    assert m, md
    assert float(m.group(1).rstrip(",")) == 0.0
    assert abs(float(m.group(2)) - 1) < 0.01


def test_sim_bench_attention_rows_check_error_and_bytes():
    from lesson10.bench.sim import bench_attention, table
    rows = bench_attention(cases=[("ring", 32, 4, 2, 4, 4, "zigzag"),
                                  ("ulysses", 32, 4, 2, 4, 2, "contiguous")])
    assert len(rows) == 2 and table(rows).count("\n") == 3
    for row in rows:
        err = float(re.search(r"max err (\S+),", row["check"]).group(1))
        ratio = float(re.search(r"bytes/formula ([\d.]+)", row["check"]).group(1))
        assert err < 1e-12 and ratio == 1.0, row
