"""The method registry (lesson10.runs.registry) is what everyone reads: run's choices and help, the
CLI usage, the README's table, the workers; its functions load and its byte formulas are
lesson10.cost's."""
import re
from pathlib import Path

import pytest

from lesson10 import cost
from lesson10.__main__ import USAGE
from lesson10.runs import registry as methods
from lesson10.runs import workers
from lesson10.runs.cli import METHODS as RUN_METHODS
from lesson10.runs.cli import _parser

ROOT = Path(__file__).resolve().parents[1]


def test_run_and_the_cli_usage_list_every_method():
    assert RUN_METHODS == methods.names() == ("sp", "ring", "ulysses", "allgather", "usp", "moe")
    helptext = _parser("run").format_help()
    for name, m in methods.METHODS.items():
        assert re.search(rf"\b{name}\b", USAGE), name
        assert re.sub(r"\s", "", f"{name}: {m.summary}") in re.sub(r"\s", "", helptext), name


def test_the_readme_table_names_every_method():
    table = ROOT.joinpath("README.md").read_text().split("| method (`run` name)")[1].split("\n\n")[0]
    assert sorted(re.findall(r"\(`(\w+)`\)", table)) == sorted(methods.names())


@pytest.mark.parametrize("name", methods.names())
def test_each_record_loads_its_functions_and_its_worker(name):
    m = methods.get(name)
    assert callable(m.spmd_function()) and callable(m.sim_function())
    assert callable(getattr(workers, m.worker))
    if m.layouts:
        assert m.default_layout in m.layouts


def test_byte_formulas_are_the_cost_module():
    for name in ("sp", "ring", "ulysses", "allgather"):
        assert methods.get(name).bytes_fwd(64, 32, 4, g=2) == cost.comm_bytes(name, 64, 32, 4, g=2)
    assert methods.get("usp").bytes_fwd(64, 32, 4, ulysses_size=2) == cost.usp_bytes(64, 32, 2, 2)
    assert methods.get("moe").bytes_fwd(64, 32, 4) == cost.moe_a2a_bytes(2, 16, 32, 4)


def test_an_unknown_method_names_the_known_ones():
    with pytest.raises(ValueError, match="ring, ulysses"):
        methods.get("tree")
