"""``python -m lesson10 bench nodes``: the flat and the two-level MoE dispatch across nodes.

Four configurations of :class:`~lesson10.spmd.moe.ExpertParallelMoE` on 2 nodes of 2 ranks:
``dispatch`` flat or two-level, with and without ``max_nodes=1``. For each: the median
step (forward + backward), and the bytes each rank sent inside its node and across nodes,
counted by :mod:`lesson10.spmd.bytecount` (activation only: the gates, ids and counts that
travel with them are left out). Two set-ups:

* on this machine, 4 ranks pretending to be 2 nodes (:func:`lesson10.topology.assume`):
  the bytes are those of a real two-node run, the times are not (every link is loopback);
* ``--twohost`` (root): two network namespaces joined by a veth, ``--rate`` on the link
  (``tc tbf``), torchrun ``--nnodes 2 --nproc-per-node 2``; the times are a slow network's,
  and the veth's kernel counters give the bytes that really crossed.

Results in ``nodes.md``. Under torchrun, ``python -m lesson10.bench.nodes CONFIG_JSON`` is
one rank of the two-host run (it prints ``NODES_JSON`` and the rows on rank 0).
"""
from __future__ import annotations

import json
import sys
import time

__all__ = ["time_dispatch", "nodes_table", "bench", "CONFIGS", "twohost_harness"]

#: (dispatch, max_nodes) of the four configurations
CONFIGS = [("flat", None), ("two_level", None), ("flat", 1), ("two_level", 1)]


def _step(cfg, st):
    """One timed forward + backward of ``cfg`` (the layer and tokens are built once)."""
    import torch
    import torch.distributed as dist

    from ..spmd.comm import count_bytes
    from ..spmd.device import current_device, torch_dtype
    from ..spmd.moe import ExpertParallelMoE
    from .harness import timed
    if "layer" not in st:
        dt, dev = torch_dtype(cfg["dtype"]), current_device()
        st["layer"] = ExpertParallelMoE(cfg["h"], cfg["E"], cfg["d_ff"], cfg["k"],
                                        capacity_factor=cfg.get("cf"), seed=0, dtype=dt,
                                        max_nodes=cfg["max_nodes"],
                                        dispatch=cfg["dispatch"]).to(dev)
        g = torch.Generator().manual_seed(1 + dist.get_rank())
        st["x"], st["dy"] = (torch.randn(cfg["T"], cfg["h"], generator=g).to(dt).to(dev)
                             for _ in range(2))
        st["x"].requires_grad_()
    layer, x, dy = st["layer"], st["x"], st["dy"]

    def run():
        with count_bytes() as c:
            ((layer(x) * dy).sum() + layer.aux_loss).backward()
        st["bytes"] = (c.intra, c.inter)
    return timed(run)


def time_dispatch(configs: list[dict], reps: int = 5, node_size: int | None = None) -> list[dict]:
    """Worker (every rank): the median step of each config and every rank's bytes
    ``(intra, inter)``; ``node_size``: pretend nodes of that many ranks."""
    import contextlib

    import torch
    import torch.distributed as dist

    from .. import topology
    from .harness import interleaved, median
    with topology.assume(node_size) if node_size else contextlib.nullcontext():
        times, states = interleaved(configs, _step, reps, 1)
        rows = []
        for cfg, ts, st in zip(configs, times, states):
            mine = torch.tensor(st["bytes"], dtype=torch.int64)
            parts = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
            dist.all_gather(parts, mine)
            rows.append({**cfg, "median_s": median(ts), "dispatch_ran": st["layer"].dispatch,
                         "intra": [int(p[0]) for p in parts], "inter": [int(p[1]) for p in parts],
                         "nodes": topology.current().nodes})
    return rows


def nodes_table(rows: list[dict], wire: dict | None = None) -> list[str]:
    """Markdown rows: config, ms/step, bytes per rank inside / across nodes (fwd + bwd), the
    saving across nodes against the flat dispatch; ``wire``: kernel bytes per config."""
    flat = {r["max_nodes"]: sum(r["inter"]) for r in rows if r["dispatch"] == "flat"}
    head = ["dispatch", "max_nodes", "ms/step", "inside a node, bytes/rank", "across nodes, bytes/rank",
            "across vs flat"]
    if wire:
        head.append("veth bytes per step (kernel)")
    body = []
    for r in rows:
        n = len(r["inter"])
        line = [r["dispatch"], r["max_nodes"] or "none", f"{1e3 * r['median_s']:.1f}",
                f"{sum(r['intra']) / n:,.0f}", f"{sum(r['inter']) / n:,.0f}",
                f"{sum(r['inter']) / max(flat.get(r['max_nodes'], 1), 1):.2f}"]
        if wire:
            line.append(f"{wire[(r['dispatch'], r['max_nodes'])]:,.0f}")
        body.append(line)
    from .harness import md_table
    return [md_table(head, body), ""]


def _configs(args) -> list[dict]:
    base = {"T": args.tokens, "h": args.hidden or 256, "E": args.experts, "k": args.topk,
            "d_ff": args.ffn or 512, "dtype": args.dtype, "cf": None}
    return [{**base, "dispatch": d, "max_nodes": m} for d, m in CONFIGS]


def bench(args, out_dir):
    """Both set-ups (the second with ``--twohost``); writes ``nodes.md``."""
    from ..spmd.launch import launch
    from .harness import machine_note, write_table
    configs = _configs(args)
    rows = launch(time_dispatch, 4, configs, args.reps, 2, backend=args.backend,
                  timeout=args.timeout, threads=1, quiet=True)[0]
    c = configs[0]
    text = ["# MoE dispatch across nodes: flat vs two-level", "",
            f"T={c['T']} tokens per rank, h={c['h']}, E={c['E']} experts, top-{c['k']}, "
            f"d_ff={c['d_ff']}, {c['dtype']}, dropless; 2 nodes of 2 ranks; step = forward + "
            f"backward; median of {args.reps} reps; bytes = activation bytes sent per rank per "
            f"step, forward + backward (lesson10.spmd.bytecount); {machine_note()}.", "",
            "## One machine, 4 ranks pretending to be 2 nodes (bytes exact, times loopback)", "",
            *nodes_table(rows)]
    if getattr(args, "twohost", False):
        text += _twohost_section(configs, args)
    write_table(out_dir / "nodes.md", text)
    return rows


def twohost_harness():
    """The module ``tests/twohost.py`` of the repository this package was installed from
    (editable); a SystemExit that says so where there is none."""
    from pathlib import Path
    tests = Path(__file__).resolve().parents[2] / "tests"
    if not (tests / "twohost.py").is_file():
        raise SystemExit("bench nodes --twohost: the two-host harness is tests/twohost.py of "
                         "the repository; run it from a clone (pip install -e .)")
    if str(tests) not in sys.path:
        sys.path.insert(0, str(tests))
    import twohost
    return twohost


def _twohost_section(configs, args) -> list[str]:
    """The same configs across two network namespaces with a ``--rate`` link (the harness
    is the tests' ``tests/twohost.py``: this needs the repository, not only the package)."""
    harness = twohost_harness()
    rows, wire = [], {}
    with harness.TwoHosts(rate=args.rate) as hosts:
        for cfg in configs:
            res = harness.torchrun_two(hosts, [json.dumps([cfg]), str(args.reps)], timeout=args.timeout,
                               module="lesson10.bench.nodes")
            rows += _parse(res)
            wire[(cfg["dispatch"], cfg["max_nodes"])] = res.link_bytes / (args.reps + 1)
    return [f"## Two hosts (network namespaces), link {args.rate} (tc tbf), torchrun 2 x 2", "",
            "The veth column is everything the kernel moved per step, both directions: the "
            "whole run's bytes (start-up, the count exchanges, the gates sent to the relays, "
            "TCP headers) divided by the reps + 1 warm-up.", "",
            *nodes_table(rows, wire)]


def _parse(res) -> list[dict]:
    """Rank 0's rows from the two-host run's output."""
    for line in res.output[0].splitlines():
        if line.startswith("NODES_JSON "):
            return json.loads(line[len("NODES_JSON "):])
    raise RuntimeError(f"bench nodes: no result from the two-host run (exit {res.status}):\n"
                       f"{res.output[0][-2000:]}\n{res.output[1][-2000:]}")


def _torchrun_main(argv) -> int:
    """One rank of the two-host run: ``CONFIGS_JSON [reps]``."""
    import torch.distributed as dist

    from ..spmd.torchrun import init_from_env, shutdown
    configs = json.loads(argv[0])
    reps = int(argv[1]) if len(argv) > 1 else 5
    init_from_env(quiet=True)
    try:
        t0 = time.perf_counter()
        rows = time_dispatch(configs, reps)
        if dist.get_rank() == 0:
            print("NODES_JSON " + json.dumps(rows), flush=True)
            print(f"({time.perf_counter() - t0:.1f} s)", flush=True)
    finally:
        shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(_torchrun_main(sys.argv[1:]))
