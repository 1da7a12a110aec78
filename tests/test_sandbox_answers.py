"""No shipped course code computes an exercise's answer (issue 32), a tested property.

Each notebook's sandbox ships real course code (layouts, cost, topology, sim) for the
notebook's exploration cells, less what its exercises ask for (lesson10/checks/refused.py).
tests/sandbox_reach.py runs inside that sandbox's stand-in, judging, and calls every
function it can reach -- module functions, class methods, the stand-in's own helpers -- on
each exercise's recorded cases with the arguments remapped in every way the types allow.
A call that gives the answer (or a part of a tuple or dict answer) on every case fails the
test. The search is shown to work: run against another notebook's sandbox, where a
reference is shipped, it finds that reference.

The exercises whose cases hold served objects (sp_forward, ring_attention, seq_to_heads,
heads_to_seq, ulysses_attention) are left out: their answer depends on what is served (a
network that delivers other values, a kernel with an offset), which no shipped function
sees (tests/test_checks_observed.py).
"""
from __future__ import annotations

import json
import pickle
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import sandbox_reach
import test_checks_answers as T

from lesson10.course.grade import standin

HERE = Path(__file__).resolve().parent
RIGHT = {ex: fns[0] for ex, fns in T.RIGHT.items()}


def search(boxes: Path, tmp: Path, jobs: list) -> dict:
    """``{(notebook of the cases, box): found}`` for each ``(cases of a notebook, box)``."""
    def one(job):
        (nb, cases), box = job
        path = tmp / f"{nb}-{box}.pkl"
        path.write_bytes(pickle.dumps(cases))
        done = subprocess.run([sys.executable, str(HERE / "sandbox_reach.py"), str(boxes / box),
                               str(path)], capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, done.stderr[-3000:]
        doc = json.loads(done.stdout.strip().splitlines()[-1])
        assert doc["calls"] > 1000, doc                   # the search called something
        return (nb, box), doc["found"]
    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(one, jobs))


@pytest.fixture(scope="module")
def boxes(tmp_path_factory):
    return standin.write_all(tmp_path_factory.mktemp("boxes"))


@pytest.mark.slow
def test_no_function_a_notebook_s_sandbox_ships_gives_an_answer(boxes, tmp_path):
    cases = sandbox_reach.record_cases(RIGHT)
    assert sum(len(c) for c in cases.values()) == 13        # every exercise of plain data
    found = search(boxes, tmp_path, [((nb, c), nb) for nb, c in sorted(cases.items())])
    hits = [f"{nb}: {hit}" for (nb, _), got in found.items() for hit in got]
    assert not hits, "shipped code computes an answer:\n" + "\n".join(hits)


#: (exercise, a sandbox that ships its reference, the call the search must find)
SHIPPED = [("block_attention", "03_load_balance", "lesson10.sim.attention.attention"),
           ("ulysses_bytes", "03_load_balance", "lesson10.cost.comm_bytes"),
           ("zigzag_positions", "04_ulysses", "lesson10.layouts.shard_positions"),
           ("route_topk", "01_sequence_parallel", "lesson10.sim.moe.route_topk")]


@pytest.mark.slow
def test_the_search_finds_a_reference_where_a_sandbox_ships_it(boxes, tmp_path):
    jobs = []
    for ex, box, _ in SHIPPED:
        [(nb, cases)] = sandbox_reach.record_cases(RIGHT, {ex}).items()
        jobs.append(((nb, cases), box))
    found = search(boxes, tmp_path, jobs)
    for (ex, box, call), (_, got) in zip(SHIPPED, found.items()):
        assert any(h["exercise"] == ex and h["call"] == call and h["gives"] == "answer"
                   for h in got), (ex, box, got[:5])


def test_the_search_s_comparison_and_remapping():
    import numpy as np
    a = [np.arange(3.0), np.arange(2.0)]
    assert sandbox_reach.same([x.copy() for x in a], a)
    assert not sandbox_reach.same([a[1], a[0]], a) and not sandbox_reach.same(np.float64(2), (1, 2))
    parts = sandbox_reach.targets((np.array([[0.5, 0.25]]), np.zeros(2)), [])
    assert [w for w, _ in parts] == ["answer", "part 0"]              # zeros: any function's

    def f(s, h, n, method="sp", e=2):
        return 0
    maps = list(sandbox_reach.mappings(f, sandbox_reach.sources((8, 4, 2), {}), ["ring"],
                                       names=("s", "h", "n")))
    assert maps[0] == ((("arg", 0), ("arg", 1), ("arg", 2)), {})      # by name first
    assert ((("arg", 2), ("arg", 0), ("arg", 1)), {"method": ("const", "ring")}) in maps
