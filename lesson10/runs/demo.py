"""``python -m lesson10 demo``: every simulated method on a small case.

For each method it prints the largest difference from the single-process
reference and the bytes each rank sent, measured by the ``SimGroup`` ledger,
next to the lesson's closed form from :mod:`lesson10.cost`.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .. import cost, sim
from ..layouts import shard_positions


def _row(method, n, err, measured, formula, note=""):
    return (method, n, err, measured, formula, note)


def run_demo(seed: int = 0, e: int = 2) -> list[tuple]:
    """Run the simulations; return rows (method, ranks, max error, bytes/rank, formula, note)."""
    rng = np.random.default_rng(seed)
    rows = []

    # Megatron SP vs TP on a token-wise op (RMSNorm): same numbers, same bytes.
    t, s, h = 4, 16, 8
    partials = [rng.standard_normal((s, h)) for _ in range(t)]

    def rms_norm(x):                              # token-wise: each row scaled by its own RMS
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6)

    g_tp, g_sp = sim.SimGroup(t, e=e), sim.SimGroup(t, e=e)
    tp = sim.tp_forward(partials, rms_norm, g_tp)
    sp = sim.sp_forward(partials, rms_norm, g_sp)
    err = max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(tp, sp))
    one_pair = 2 * (t - 1) / t * s * h * e          # one all-reduce = one RS + one AG
    rows.append(_row("TP (all-reduce)", t, 0.0, g_tp.bytes_sent.max(), one_pair, "2(t-1)/t*s*h*e"))
    rows.append(_row("SP (RS + AG)", t, err, g_sp.bytes_sent.max(), one_pair, "max |SP - TP|"))

    # Ring attention (zig-zag and contiguous, causal) and Ulysses vs full attention.
    s, a, d, n = 32, 8, 4, 4
    for a_kv in (a, a // 2):
        g = a // a_kv
        q = rng.standard_normal((s, a, d))
        k = rng.standard_normal((s, a_kv, d))
        v = rng.standard_normal((s, a_kv, d))
        ref, _ = sim.attention(q, k, v, causal=True)
        for method, layout in (("ring", "zigzag"), ("ring", "contiguous"), ("ulysses", "contiguous")):
            pos = shard_positions(s, n, layout)
            group = sim.SimGroup(n, e=e)
            attend: Callable[..., Any] = (sim.ring_attention if method == "ring"
                                          else sim.ulysses_attention)
            out = attend([q[p] for p in pos], [k[p] for p in pos], [v[p] for p in pos], pos,
                         causal=True, group=group)
            err = max(float(np.abs(o - ref[p]).max()) for o, p in zip(out, pos))
            formula = cost.comm_bytes(method, s, a * d, n, g=g, e=e)
            name = f"{method} {layout}" + (f" GQA g={g}" if g > 1 else "")
            rows.append(_row(name, n, err, group.bytes_sent.max(), formula, "causal"))

        # The combinations: all-gather CP with a document mask, and USP (Ulysses x ring).
        doc = np.repeat(np.arange(4), [11, 1, 13, 7])      # packed documents across ranks
        pos = shard_positions(s, n, "zigzag")
        shards = [[x[p] for p in pos] for x in (q, k, v)]
        doc_ref, _ = sim.attention(q, k, v, causal=True, doc_ids=doc)
        gqa = f" GQA g={g}" if g > 1 else ""
        combos: list[tuple[str, Callable[..., Any], tuple, float]] = [
            ("allgather zigzag+docs", sim.allgather_attention, (),
             cost.comm_bytes("allgather", s, a * d, n, g=g, e=e)),
            ("usp 2x2 zigzag+docs", sim.usp_attention, (2,),
             cost.usp_bytes(s, a * d, 2, n // 2, g=g, e=e))]
        for name, combo, more, formula in combos:
            group = sim.SimGroup(n, e=e)
            out = combo(*shards, pos, *more, doc_ids=doc, group=group)
            err = max(float(np.abs(o - doc_ref[p]).max()) for o, p in zip(out, pos))
            rows.append(_row(name + gqa, n, err, group.bytes_sent.max(), formula,
                             "causal + document mask"))

    return rows + _moe_rows(rng, e)


def _moe_rows(rng, e: int) -> list[tuple]:
    """Expert parallelism: dispatch + combine through all-to-alls vs the dense MoE."""
    rows = []
    n, T, h, E, top, d_ff = 4, 64, 8, 8, 2, 16
    x = [rng.standard_normal((T, h)) for _ in range(n)]
    router_w = rng.standard_normal((h, E)) * 0.1
    experts = [(rng.standard_normal((h, d_ff)) / np.sqrt(h), rng.standard_normal((d_ff, h)) / np.sqrt(d_ff))
               for _ in range(E)]
    for cf in (None, 1.0):
        group = sim.SimGroup(n, e=e)
        y = sim.moe_layer(x, router_w, experts, top, capacity_factor=cf, group=group)
        ref = sim.moe_reference(np.concatenate(x), router_w, experts, top, capacity_factor=cf)
        err = float(np.abs(np.concatenate(y) - ref).max())
        rows.append(_row(f"MoE top-{top} CF={cf}", n, err, group.bytes_sent.mean(),
                         cost.moe_a2a_bytes(top, T, h, n, e=e), "mean bytes; formula = uniform routing"))
    # Node-limited routing (DeepSeek-V3): 4 GPUs as 2 nodes, each token on at most 1 node.
    group = sim.SimGroup(n, e=e)
    y = sim.moe_layer(x, router_w, experts, top, group=group, nodes=2, max_nodes=1)
    ref = sim.moe_reference(np.concatenate(x), router_w, experts, top, nodes=2, max_nodes=1)
    rows.append(_row(f"MoE top-{top} max_nodes=1 of 2", n, float(np.abs(np.concatenate(y) - ref).max()),
                     group.bytes_sent.mean(), cost.moe_a2a_bytes(top, T, h, n, e=e),
                     "mean bytes; formula = uniform routing"))
    return rows


def format_table(rows) -> str:
    head = f"{'method':30s} {'ranks':>5s} {'max error':>10s} {'bytes/rank':>12s} {'lesson':>12s}  note"
    lines = [head, "-" * len(head)]
    for method, n, err, meas, formula, note in rows:
        lines.append(f"{method:30s} {n:5d} {err:10.1e} {meas:12,.0f} {formula:12,.0f}  {note}")
    return "\n".join(lines)


def main(argv=None) -> int:
    rows = run_demo()
    print(format_table(rows))
    worst = max(r[2] for r in rows)
    print(f"\nall methods agree with their single-process reference (worst error {worst:.1e})"
          if worst < 1e-10 else f"\nWARNING: worst error {worst:.1e}")
    return 0 if worst < 1e-10 else 1
