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

from .comm import SimGroup

__all__ = ["tp_forward", "sp_forward"]


def _group(partials, group):
    if group is None:
        return SimGroup(len(partials))
    if len(partials) != group.n:
        raise ValueError(f"got {len(partials)} partial sums for a group of {group.n} ranks")
    return group


def tp_forward(partials, op, group=None):
    """Plain TP: ``all_reduce(partials)`` then ``op`` on all tokens.

    Returns a list with every rank's result, each the full ``op(sum_r partials[r])``.
    """
    group = _group(partials, group)
    return [op(x) for x in group.all_reduce(partials)]


def sp_forward(partials, op, group=None, gather: bool = True):
    """TP + SP: reduce-scatter along tokens (axis 0), ``op`` on the local ``s/t`` tokens,
    then all-gather. Each rank stores only its ``s/t`` tokens in between.

    Returns every rank's full result (as :func:`tp_forward`); with ``gather=False`` it
    returns the local shards ``op(...)`` of ``s/t`` tokens and skips the all-gather.
    """
    group = _group(partials, group)
    shards = [op(x) for x in group.reduce_scatter(partials, axis=0)]
    return group.all_gather(shards, axis=0) if gather else shards
