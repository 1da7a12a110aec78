"""This rank's device and dtypes: the helpers every method, worker and benchmark uses to put
tensors where the backend wants them and to time GPU work honestly."""
from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["current_device", "DTYPES", "torch_dtype", "synchronize", "synchronize_device"]


def current_device() -> torch.device:
    """The device of this rank: ``cuda:LOCAL_RANK`` under NCCL, else CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


#: dtype names accepted by the workers, the benchmarks and the command line
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


def torch_dtype(name: str) -> torch.dtype:
    """``"float32"`` -> ``torch.float32`` (one of :data:`DTYPES`); ValueError otherwise."""
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def synchronize() -> None:
    """Wait for this rank's GPU work (a no-op on CPU), before reading a clock."""
    if current_device().type == "cuda":
        torch.cuda.synchronize()


def synchronize_device(like: torch.Tensor) -> None:
    """Wait for the GPU work queued on ``like``'s device (a no-op for a CPU tensor): CUDA runs
    kernels and NCCL transfers asynchronously, so a clock read without it times the launch."""
    if like.is_cuda:
        torch.cuda.synchronize(like.device)
