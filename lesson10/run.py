"""``torchrun ... -m lesson10.run METHOD``: the module torchrun starts in every rank.

The command itself (its options, the checks, the verdict) is :mod:`lesson10.runs.cli`;
``python -m lesson10 run`` reaches the same ``main``.
"""
import sys

from .runs.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
