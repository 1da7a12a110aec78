"""lesson10: sequence, context and expert parallelism.

Two implementations of every method of the lesson:

* ``lesson10.sim``  -- NumPy, all ranks in one process, every byte counted;
* ``lesson10.spmd`` -- torch.distributed, one process per rank (gloo / NCCL / torchrun);
  it needs PyTorch, the ``spmd`` extra: ``pip install "lesson10[spmd]"``.

``lesson10.layouts``, ``lesson10.cost`` and ``lesson10.topology`` hold what both share:
which tokens a rank holds, the lesson's closed forms, and which ranks share a node.
Every error the package raises on purpose is a :class:`Lesson10Error` (``lesson10.errors``).
"""
__version__ = "0.2.0"

from . import cost, layouts, topology
from .errors import Lesson10Error

__all__ = ["__version__", "cost", "layouts", "topology", "Lesson10Error"]
