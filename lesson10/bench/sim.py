"""``python -m lesson10 bench sim``: how fast the NumPy simulation is (no torch needed).

Times :func:`simulate_moe` (the vectorised routing simulator, up to ``T = 2**20``
tokens, ``E = 256``, ``k = 8``, ``Ne = 64``) and the simulated ring and Ulysses
attention at moderate sizes, checks each result (bytes against the lesson's
formula, attention against the single-process reference), prints a markdown table
and writes it to ``benchmarks/results/sim.md``. Times are the best of ``--reps``
runs; a shared machine makes them noisy. On a machine with other busy processes,
BLAS threads fight for the cores and the attention cases can be 10x slower; run
``OPENBLAS_NUM_THREADS=1 python -m lesson10 bench sim`` there (the table records it).
"""
from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numpy as np

from .. import cost
from ..layouts import shard_positions
from ..sim.attention import attention
from ..sim.comm import SimGroup
from ..sim.moe import simulate_moe
from ..sim.ring import ring_attention
from ..sim.ulysses import ulysses_attention
from .paths import RESULTS_DIR

__all__ = ["main", "bench_moe", "bench_attention"]

MOE_CASES = [  # (T all GPUs, E, k, Ne, capacity_factor, skew)
    (2**20, 256, 8, 64, None, 0.0),
    (2**20, 256, 8, 64, 1.25, 0.0),
    (2**20, 256, 8, 64, 1.25, 1.0),
    (8 * 8192, 8, 2, 8, None, 0.0),              # worked example (e): Mixtral-like, T=8192 per GPU
    (2**16, 64, 2, 8, 1.0, 2.0),
]
ATTN_CASES = [  # (method, s, a, a_kv, d, N_c, layout)
    ("ring", 2048, 8, 8, 64, 8, "zigzag"),
    ("ring", 2048, 8, 2, 64, 8, "contiguous"),
    ("ulysses", 2048, 8, 8, 64, 8, "contiguous"),
    ("ulysses", 2048, 8, 4, 64, 4, "zigzag"),
]


def _best(fn, reps: int):
    best, out = float("inf"), None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def bench_moe(reps: int = 3, cases=MOE_CASES) -> list[dict]:
    """Time ``simulate_moe`` on each case; report drops, imbalance and bytes vs the formula."""
    rows = []
    for T, E, k, Ne, cf, skew in cases:
        t, st = _best(lambda: simulate_moe(T, E, k, Ne, capacity_factor=cf, skew=skew), reps)
        rows.append({"case": f"simulate_moe T={T:,} E={E} k={k} Ne={Ne} CF={cf} skew={skew}",
                     "seconds": t,
                     "check": f"drop {st.drop_rate:.3f}, max/mean {st.imbalance:.2f}, "
                              f"bytes/formula {st.bytes_mean / st.bytes_formula:.4f}"})
    return rows


def bench_attention(reps: int = 1, cases=ATTN_CASES, seed: int = 0) -> list[dict]:
    """Time simulated ring / Ulysses attention (causal, float64); check error and bytes."""
    rng = np.random.default_rng(seed)
    rows = []
    for method, s, a, a_kv, d, n, layout in cases:
        q = rng.standard_normal((s, a, d))
        k = rng.standard_normal((s, a_kv, d))
        v = rng.standard_normal((s, a_kv, d))
        pos = shard_positions(s, n, layout)
        fn = ring_attention if method == "ring" else ulysses_attention
        groups = []

        def run():
            groups.append(SimGroup(n))
            return fn([q[p] for p in pos], [k[p] for p in pos], [v[p] for p in pos], pos,
                      causal=True, group=groups[-1])

        t, out = _best(run, reps)
        t_ref, (ref, _) = _best(lambda: attention(q, k, v, causal=True), 1)
        err = max(float(np.abs(o - ref[p]).max()) for o, p in zip(out, pos))
        formula = cost.comm_bytes(method, s, a * d, n, g=a // a_kv, e=2)
        rows.append({"case": f"{method} s={s} a={a} a_kv={a_kv} d={d} N_c={n} {layout}",
                     "seconds": t,
                     "check": f"max err {err:.1e}, bytes/formula "
                              f"{groups[-1].bytes_sent.max() / formula:.4f}, "
                              f"one-process reference {t_ref:.2f} s"})
    return rows


def table(rows) -> str:
    lines = ["| case | time (s) | check |", "|---|---:|---|"]
    lines += [f"| {r['case']} | {r['seconds']:.3f} | {r['check']} |" for r in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    """Run the simulation benchmarks, print the table and write ``sim.md``."""
    p = argparse.ArgumentParser(prog="python -m lesson10 bench sim",
                                description="time the NumPy simulation")
    p.add_argument("--reps", type=int, default=3, help="runs per MoE case (best is kept)")
    p.add_argument("--out", default=str(RESULTS_DIR), help="folder for sim.md")
    p.add_argument("--quick", action="store_true", help="only the T = 2**20 MoE case")
    args = p.parse_args(argv)
    moe_cases = MOE_CASES[:1] if args.quick else MOE_CASES
    rows = bench_moe(args.reps, moe_cases)
    if not args.quick:
        rows += bench_attention()
    text = "\n".join([
        "# NumPy simulation benchmark", "",
        f"Python {platform.python_version()}, NumPy {np.__version__}, {os.cpu_count()} CPUs; "
        f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}; "
        f"best of {args.reps} runs for MoE, one run for attention (float64, causal). "
        "`simulate_moe` takes T = tokens over all GPUs.", "",
        table(rows), ""])
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "sim.md").write_text(text)
    print(text)
    print(f"wrote {out_dir / 'sim.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
