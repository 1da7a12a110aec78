"""The capacity rule of expert parallelism, written once (NumPy): where each (token, expert)
copy stands in its expert's queue, and which copies an expert with capacity ``C`` accepts.
First come, first served in global token order (rank 0's tokens first, each token's choices
in order). :mod:`lesson10.sim.moe`, the MoE figure, the checks and the real layer's checks
use it; :func:`lesson10.spmd.moe.arrival_order` is its torch form (a test compares them).
"""
from __future__ import annotations

import numbers

import numpy as np

__all__ = ["arrival_order", "keep_within_capacity"]


def _queues(experts, E: int):
    """``(order, place)``: the copies grouped by expert in arrival order (``order``, indices
    into the flat row-major copies) and each one's place in its expert's queue."""
    experts = np.asarray(experts)
    if experts.dtype.kind not in "iu":
        raise ValueError(f"experts must be integer expert ids (route_topk's output), got dtype "
                         f"{experts.dtype}")
    if experts.size and (experts.min() < 0 or experts.max() >= E):
        raise ValueError(f"experts must be expert ids in 0..{E - 1}, got values "
                         f"{experts.min()}..{experts.max()}")
    flat = experts.ravel()
    if np.iinfo(np.int16).max > E:
        flat = flat.astype(np.int16)                    # stable sort on int16 is a radix sort
    order = np.argsort(flat, kind="stable")             # copies grouped by expert, in arrival order
    by_expert = flat[order]
    starts = np.searchsorted(by_expert, np.arange(E, dtype=flat.dtype))  # first copy of each expert
    return order, np.arange(flat.size) - starts[by_expert]


def arrival_order(experts, E: int) -> np.ndarray:
    """Place of every copy in its expert's queue (0 = first): ``experts (N, k)`` expert ids
    in global token order -> int64 ``(N, k)``. Copy ``(t, j)`` comes after every earlier copy
    of the same expert in row-major (token, choice) order. The one arrival rule: the drops,
    the capacity figure and the real layer (:func:`lesson10.spmd.moe.arrival_order`) use it."""
    order, place = _queues(experts, E)
    arrival = np.empty(place.size, dtype=np.int64)
    arrival[order] = place
    return arrival.reshape(np.shape(experts))


def keep_within_capacity(experts, E: int, capacity) -> np.ndarray:
    """Which copies an expert accepts, first come first served: ``experts (N, k)`` in global
    token order -> bool ``(N, k)``, True where :func:`arrival_order` is below ``capacity``
    (an int ``C``, see :func:`expert_capacity`); ``capacity=None``: all kept. (The notebook's
    exercise ``capacity_keep`` takes the capacity *factor* instead.)"""
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, numbers.Integral)
                                 or capacity < 0):
        raise ValueError(f"capacity must be an integer >= 0 or None, got {capacity!r} "
                         f"(see expert_capacity)")
    order, place = _queues(experts, E)
    keep = np.ones(place.size, dtype=bool)
    if capacity is not None:
        keep[order[place >= capacity]] = False           # the late copies of full experts
    return keep.reshape(np.shape(experts))
