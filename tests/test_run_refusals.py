"""Bad input for ``run`` and ``bench``: refused in the parent, before any rank starts.

Each case runs the real command line in a fresh Python (``python -m lesson10 ...``) and must
exit 2 with one line on stderr that names the limit, no traceback, nothing on stdout (no
"launch: N rank(s)" line: no rank was started), before torch is imported (a rule, not a time).
"""
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from lesson10.runs import registry, validate

#: runs ``python -m lesson10 ...`` and writes to the file named first whether torch was
#: imported by the end (a refusal must come before any torch import and any rank: asserted
#: as that rule, not as a time, since machines differ 4x in speed and this one is shared)
_RUN = ("import runpy, sys\n"
        "mark = sys.argv.pop(1)\n"
        "try:\n"
        "    runpy.run_module('lesson10', run_name='__main__', alter_sys=True)\n"
        "finally:\n"
        "    open(mark, 'w').write(str('torch' in sys.modules))\n")


RUN = [  # (argv, words the one line must contain)
    (["ring", "--nproc", "0"], "--nproc"),
    (["ring", "--nproc", "-2"], "--nproc"),
    (["ring", "--seq", "-8"], "--seq"),
    (["ring", "--batch", "-1"], "--batch"),
    (["ring", "--batch", "0"], "--batch"),
    (["ring", "--heads", "0"], "--heads"),
    (["ring", "--dim", "0"], "--dim"),
    (["ring", "--kv-heads", "3"], "--kv-heads 3"),
    (["ring", "--kv-heads", "0"], "--kv-heads"),
    (["ring", "--node-size", "0"], "--node-size"),
    (["ring", "--nproc", "4", "--node-size", "3"], "nodes of 3"),
    (["ring", "--layout", "diagonal"], "layout"),
    (["ring", "--seq", "2000000"], "memory available"),
    (["ring", "--timeout", "0"], "--timeout"),
    (["ulysses", "--nproc", "4", "--heads", "4", "--kv-heads", "2"], "--kv-heads 2"),
    (["ulysses", "--layout", "zigzag", "--seq", "6"], "multiple of 4"),
    (["usp", "--nproc", "4", "--ulysses-size", "3"], "ulysses_size"),
    (["usp", "--nproc", "4", "--ulysses-size", "4", "--kv-heads", "2"], "ulysses_size"),
    (["usp", "--ulysses-size", "0"], "--ulysses-size"),
    (["allgather", "--seq", "6"], "multiple of 4"),
    (["sp", "--seq", "7"], "--seq 7"),
    (["sp", "--seq", "0"], "--seq"),
    (["sp", "--nproc", "4", "--heads", "1", "--dim", "3"], "--heads 1"),
    (["sp", "--seq", "400000000"], "memory available"),
    (["moe", "--seq", "0"], "--seq"),
    (["moe", "--seq", "-5"], "--seq"),
    (["moe", "--seq", "7"], "--seq 7"),
    (["moe", "--seq", "50000000"], "memory available"),
    (["moe", "--experts", "1"], "--experts 1"),
    (["moe", "--experts", "3"], "--experts 3"),
    (["moe", "--experts", "0"], "--experts"),
    (["moe", "--topk", "5", "--experts", "4"], "--topk 5"),
    (["moe", "--topk", "0"], "--topk"),
    (["moe", "--capacity-factor", "0"], "capacity"),
    (["moe", "--capacity-factor", "-1.5"], "capacity"),
    (["moe", "--capacity-factor", "lots"], "capacity"),
    (["moe", "--max-nodes", "0"], "--max-nodes"),
    (["moe", "--nproc", "4", "--node-size", "2", "--max-nodes", "1", "--experts", "4",
      "--topk", "3"], "max_nodes"),
]

BENCH = [
    (["moe", "--experts", "1"], "--experts 1"),
    (["moe", "--topk", "5", "--experts", "4"], "--topk 5"),
    (["moe", "--tokens", "100000000"], "memory available"),
    (["moe", "--tokens", "0"], "--tokens"),
    (["moe", "--capacity-factor", "none", "0"], "capacity"),
    (["ulysses", "--heads", "3"], "--heads 3"),
    (["ring", "--out", "/proc/nope"], "--out /proc/nope"),
    (["ring", "--seq", "6"], "multiple of 4"),
    (["ring", "--nproc", "2", "0"], "--nproc"),
    (["ring", "--kv-heads", "0"], "--kv-heads"),
    (["ring", "--seq", "1000000"], "memory available"),
    (["compare", "--nproc", "4", "--node-size", "3"], "nodes of 3"),
    (["nodes", "--twohost", "--rate", "bogus"], "rate"),
    (["nodes", "--experts", "6"], "--experts 6"),
    (["sp", "--seq", "7"], "multiples of the TP degree"),
    (["memory", "--block", "3"], "--block 3"),
    (["cstar", "--kv-heads", "5"], "--kv-heads"),
    (["cstar", "--bandwidth", "-1"], "--bandwidth"),
    (["all", "--reps", "0"], "--reps"),
]


def _refused(cmd: str, argv: list[str], words: str, tmp_path) -> None:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env.pop("WORLD_SIZE", None)
    extra = [] if cmd == "run" or "--out" in argv else ["--out", str(tmp_path)]
    mark = tmp_path / "torch-imported"
    proc = subprocess.run([sys.executable, "-c", _RUN, str(mark), cmd, *argv, *extra],
                          capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.returncode, proc.stdout, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert words in err, err
    assert proc.stdout == "" and "launch:" not in err, proc.stdout      # no rank started
    assert mark.read_text() == "False", f"torch was imported before the refusal: {err}"
    assert not list(tmp_path.glob("*.md")), "a refused bench wrote a table"


@pytest.mark.parametrize("argv,words", RUN, ids=[" ".join(a) for a, _ in RUN])
def test_run_refuses_bad_input_at_once(argv, words, tmp_path):
    _refused("run", argv, words, tmp_path)


@pytest.mark.parametrize("argv,words", BENCH, ids=[" ".join(a) for a, _ in BENCH])
def test_bench_refuses_bad_input_at_once(argv, words, tmp_path):
    _refused("bench", argv, words, tmp_path)


def _args(method, **kw):
    base = dict(method=method, seq=64, heads=4, kv_heads=None, dim=8, batch=1, dtype="float32",
                layout=None, ulysses_size=None, max_nodes=None, node_size=None, experts=None,
                topk=None, capacity_factor=1.25, timeout=60.0, peer_timeout=30.0)
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("method", sorted(registry.METHODS))
def test_the_defaults_of_every_method_pass_the_checks(method):
    validate.check_run(_args(method), 2)
    validate.check_run(_args(method), 4)


def test_the_refusals_use_the_lessons_rules():
    # Ulysses' head limit is USP's with u = N; a USP group of 4 cannot cut 2 K/V heads
    with pytest.raises(validate.Refused, match="whole K/V heads"):
        validate.check_run(_args("ulysses", kv_heads=2), 4)
    with pytest.raises(validate.Refused, match="ulysses_size = 4"):
        validate.check_run(_args("usp", kv_heads=2, ulysses_size=4), 4)
    # k <= E, E a multiple of N_e, CF > 0, node-limited routing that leaves k experts
    for kw, says in ((dict(experts=2), "E >= N_e"), (dict(topk=9, experts=8), "--topk 9"),
                     (dict(capacity_factor=0.0), "capacity_factor"),
                     (dict(node_size=2, max_nodes=1, experts=4, topk=3), "fewer than k = 3")):
        with pytest.raises(validate.Refused, match=says):
            validate.check_run(_args("moe", **kw), 4)
    assert validate.moe_case(_args("moe", experts=12, topk=3), 4).config.E == 12


def test_the_memory_estimate_grows_with_the_sizes_and_compares_with_the_machine(monkeypatch):
    small = validate.need_bytes(_args("ring", seq=1024), 2)
    big = validate.need_bytes(_args("ring", seq=10240), 2)
    assert 95 < big / small <= 100                               # the s^2 scores dominate
    monkeypatch.setattr(validate, "memory_available", lambda: int(4 * small))
    validate.check_memory(small, 4, "x", "y")
    with pytest.raises(validate.Refused, match="more than the"):
        validate.check_memory(small, 5, "x", "y")
    assert validate.memory_available() > 0


def test_dtype_names_are_the_workers():
    torch = pytest.importorskip("torch")
    from lesson10.spmd.device import DTYPES
    assert set(validate.DTYPE_NAMES) == set(DTYPES)
    assert all(validate.ELEM[n] == torch.empty((), dtype=t).element_size() for n, t in DTYPES.items())
