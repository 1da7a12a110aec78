"""ARCHITECTURE.md is the map of lesson10/: every module is on it once, and nothing else."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def listed() -> list[str]:
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    return re.findall(r"^\| `(lesson10/[^`]+\.py)` \|", text, re.M)


def modules() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in (ROOT / "lesson10").rglob("*.py")
            if "__pycache__" not in p.parts}


def test_every_module_is_on_the_map_once():
    names = listed()
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
    missing = sorted(modules() - set(names))
    assert not missing, f"add a line for each to ARCHITECTURE.md: {missing}"


def test_nothing_on_the_map_is_gone():
    gone = sorted(set(listed()) - modules())
    assert not gone, f"ARCHITECTURE.md lists modules that do not exist: {gone}"


def test_the_map_catches_a_module_it_does_not_list(tmp_path):
    # the parser reads table rows only: a row removed is a module missing
    names = set(listed())
    assert "lesson10/spmd/ring.py" in names and len(names) >= 60
