"""The real implementations on ``torch.distributed``: one process per rank (SPMD).

Every function runs inside one rank; ``group=None`` means the whole world.
Start ranks with :func:`launch` (gloo on CPU, NCCL with one GPU per rank) or
with ``torchrun`` (see :func:`init_from_env`). Local tensors are ``(b, s/N, a, d)``
with the sequence on dim 1. Measure what a method sends with :func:`count_bytes`.
:mod:`.workers` runs each method once on real ranks and checks it against one process.

PyTorch is the ``spmd`` extra of the package (``pip install "lesson10[spmd]"``); without it,
importing this package raises a ``ModuleNotFoundError`` that says so.
"""
#: what to do when torch is missing (the base install leaves it out)
INSTALL_HINT = ('lesson10.spmd runs on torch.distributed and needs PyTorch, which the base install '
                'of lesson10 leaves out: pip install "lesson10[spmd]" (or install torch yourself, '
                'e.g. a CPU or CUDA build from pytorch.org). Notebooks 01-05, the checks, the '
                'figures and the grader work without it.')

try:
    import torch as _torch  # noqa: F401
except ModuleNotFoundError as _exc:
    if _exc.name != "torch":        # torch is there but something it needs is not: say that
        raise
    raise ModuleNotFoundError(INSTALL_HINT, name="torch") from None

__all__ = [
    "launch", "init_from_env", "is_torchrun", "shutdown", "RankError", "LaunchTimeout",
    "count_bytes", "ByteCounter",
    "reference_attention", "local_attention", "merge",
    "shard_sequence", "gather_sequence", "local_positions",
    "ring_attention", "RingAttention", "ring_options",
    "seq_to_heads", "heads_to_seq", "ulysses_attention", "allgather_attention", "usp_attention",
    "copy_to_tp", "reduce_from_tp", "gather_from_sp", "reduce_scatter_to_sp",
    "ColumnParallelLinear", "RowParallelLinear", "SequenceParallelBlock", "ReferenceBlock",
    "ExpertParallelMoE", "moe_reference", "route_topk", "switch_aux_loss", "update_expert_bias",
]

from .allgather import allgather_attention  # noqa: E402
from .attention import local_attention, merge  # noqa: E402
from .comm import ByteCounter, count_bytes  # noqa: E402
from .launch import LaunchTimeout, RankError, launch  # noqa: E402
from .moe import ExpertParallelMoE, moe_reference, route_topk, switch_aux_loss, update_expert_bias  # noqa: E402
from .reference import attention as reference_attention  # noqa: E402
from .ring import RingAttention, ring_attention, ring_options  # noqa: E402
from .shard import gather_sequence, local_positions, shard_sequence  # noqa: E402
from .sp import (  # noqa: E402
    ColumnParallelLinear,
    ReferenceBlock,
    RowParallelLinear,
    SequenceParallelBlock,
    copy_to_tp,
    gather_from_sp,
    reduce_from_tp,
    reduce_scatter_to_sp,
)
from .torchrun import init_from_env, is_torchrun, shutdown  # noqa: E402
from .ulysses import heads_to_seq, seq_to_heads, ulysses_attention  # noqa: E402
from .usp import usp_attention  # noqa: E402
