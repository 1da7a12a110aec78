"""Joining a group that ``torchrun`` started: one process per rank, across machines.

:func:`lesson10.spmd.launch.launch` starts the ranks itself, on one machine; under ``torchrun``
every rank is already a process, and it only has to join the group from the environment
``torchrun`` set (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``)::

    rank, world = init_from_env()      # torchrun --nproc-per-node 4 -m lesson10.run ...
    ...                                # the same method code as under launch()
    shutdown()
"""
from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from .launch import check_peer_timeout, choose_backend

__all__ = ["init_from_env", "is_torchrun", "shutdown"]


def is_torchrun() -> bool:
    """True inside a process started by ``torchrun`` (its env vars are set)."""
    return "TORCHELASTIC_RUN_ID" in os.environ or all(
        v in os.environ for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def init_from_env(backend: str = "auto", timeout: float = 300.0, threads: int | None = None,
                  quiet: bool = False, peer_timeout: float | None = None) -> tuple[int, int]:
    """Initialise the default process group from ``torchrun``'s environment.

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
    ``MASTER_ADDR``/``MASTER_PORT``; picks NCCL when this node has a GPU per local
    rank (``auto``), sets the CUDA device to ``LOCAL_RANK``, limits threads to
    ``cpu_count // LOCAL_WORLD_SIZE``. Returns ``(rank, world_size)``. Does nothing
    (but return them) when the group already exists. Without torchrun's variables
    it is a one-rank group on 127.0.0.1 so that a plain ``python -m ...`` works too.

    ``peer_timeout`` (``timeout`` is its older name): the process group's timeout, how long
    the start or one collective waits for a peer before this rank raises; a dead or hung
    peer then surfaces within about that many seconds, on every rank still running.
    """
    timeout = check_peer_timeout(timeout if peer_timeout is None else peer_timeout)
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if is_torchrun():
        rank = int(os.environ["RANK"])
        world = int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        init_method = "env://"
    else:  # a plain `python ...`: one rank, nothing written to os.environ
        import socket
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        rank, world, local_rank, local_world = 0, 1, 0, 1
        init_method = f"tcp://127.0.0.1:{port}"
    backend = choose_backend(local_world, backend)
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // local_world)
    torch.set_num_threads(threads)
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout))
    if rank == 0 and not quiet:
        print(f"init_from_env: {world} rank(s), backend={backend}, {threads} thread(s) per rank")
    return rank, world


def shutdown() -> None:
    """Destroy the default process group if there is one (end of a torchrun program)."""
    if dist.is_initialized():
        dist.destroy_process_group()
