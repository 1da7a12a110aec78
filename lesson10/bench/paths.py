"""Where the benchmarks write their tables: one constant, at the bottom of ``bench/`` so that
every benchmark module and the ``bench`` command import it without importing each other."""
from __future__ import annotations

from pathlib import Path

__all__ = ["RESULTS_DIR"]

RESULTS_DIR = Path("benchmarks") / "results"
