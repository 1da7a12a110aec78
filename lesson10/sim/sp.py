"""Megatron sequence parallelism vs plain tensor parallelism on a token-wise op.

After a row-parallel matmul each of the ``t`` ranks of a TP group holds a partial
sum ``partials[r]`` of shape ``(s, ...)`` (tokens first); the true activation is
``sum_r partials[r]``. The next region (dropout, residual, LayerNorm) is
token-wise, i.e. ``op(x)[i]`` depends only on ``x[i]``.

* TP: all-reduce, then every rank runs ``op`` on all ``s`` tokens.
* SP: reduce-scatter along the tokens, ``op`` on ``s/t`` tokens, all-gather
  (in the model the all-gather is the ``g`` before the next column-parallel matmul).

An all-reduce is a reduce-scatter followed by an all-gather, so both send the same
``2 (t-1)/t * s h e`` bytes per rank, and for a token-wise ``op`` the results are
the same numbers.
"""
from __future__ import annotations

import numpy as np

from .comm import check_shards
from .validate import check_group

__all__ = ["tp_forward", "sp_forward"]


def _group(partials, group, op):
    if not callable(op):
        raise ValueError(f"op must be a function applied to the tokens, got {type(op).__name__}")
    partials = check_shards(partials, "partials")
    if partials[0].ndim == 0:
        raise ValueError("partials: each rank's partial sum must be (s, ...), tokens first")
    return partials, check_group(group, len(partials), "partials")


def _token_wise(x, y, where: str):
    """``op`` must keep the tokens: ``op(x)`` has ``x.shape[0]`` rows."""
    if np.shape(y)[:1] != x.shape[:1]:
        raise ValueError(f"{where}: op must be token-wise (one output row per token), but it "
                         f"mapped {x.shape} to {np.shape(y)}")
    return y


def tp_forward(partials, op, group=None):
    """Plain TP: ``all_reduce(partials)`` then ``op`` on all tokens.

    Returns a list with every rank's result, each the full ``op(sum_r partials[r])``.
    """
    partials, group = _group(partials, group, op)
    return [_token_wise(x, op(x), "tp_forward") for x in group.all_reduce(partials)]


def sp_forward(partials, op, group=None, gather: bool = True):
    """TP + SP: reduce-scatter along tokens (axis 0), ``op`` on the local ``s/t`` tokens,
    then all-gather. Each rank stores only its ``s/t`` tokens in between.

    Returns every rank's full result (as :func:`tp_forward`); with ``gather=False`` it
    returns the local shards ``op(...)`` of ``s/t`` tokens and skips the all-gather.
    """
    partials, group = _group(partials, group, op)
    shards = [_token_wise(x, op(x), "sp_forward") for x in group.reduce_scatter(partials, axis=0)]
    return group.all_gather(shards, axis=0) if gather else shards
