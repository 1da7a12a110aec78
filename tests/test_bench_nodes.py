"""`bench nodes`: the flat and the two-level MoE dispatch on 4 ranks as 2 nodes of 2, tiny
sizes; its table; the two-host part is in tests/test_multinode.py."""
import re

import pytest

from lesson10.bench import nodes

pytestmark = pytest.mark.slow   # a whole command end to end: make test-slow

BASE = {"T": 32, "h": 16, "E": 8, "k": 2, "d_ff": 16, "dtype": "float64", "cf": None}
CONFIGS = [{**BASE, "dispatch": d, "max_nodes": m} for d, m in nodes.CONFIGS]
RANK_JOBS = {"nodes": lambda n: ("bench_nodes", {"configs": CONFIGS if n == 4 else []})}


def test_two_level_saves_inter_node_bytes_and_the_table_says_so(rank_results):
    rows = rank_results(4, "nodes")[0]
    by = {(r["dispatch"], r["max_nodes"]): r for r in rows}
    assert all(r["nodes"] == 2 and r["dispatch_ran"] == r["dispatch"] for r in rows)
    across = {key: sum(r["inter"]) for key, r in by.items()}
    assert across[("two_level", None)] < across[("flat", None)]
    assert across[("two_level", 1)] < across[("two_level", None)]
    assert across[("flat", 1)] >= 0.8 * across[("flat", None)], "the flat dispatch ignores the limit"
    md = "\n".join(nodes.nodes_table(rows))
    ratios = dict(re.findall(r"^\| two_level \| (none|1) \|.*\| ([\d.]+) \|$", md, re.M))
    assert float(ratios["1"]) == round(across[("two_level", 1)] / across[("flat", 1)], 2)
    assert float(ratios["1"]) < float(ratios["none"]) < 1
