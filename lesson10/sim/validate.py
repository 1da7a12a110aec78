"""The checks that every simulated method runs on its per-rank inputs, kept out of the
algorithms a student reads.

A sharded argument is a list with one array per rank (:func:`lesson10.sim.check_shards`);
the positions of every rank are a layout name or one array of global token ids per rank,
together ``0..s-1`` once. Each check raises a ValueError that names the function and the
rule, and says what to pass instead.
"""
from __future__ import annotations

import numpy as np

from ..layouts import check_permutation, shard_positions
from .comm import SimGroup, check_shards

__all__ = ["check_group", "check_qkv_shards", "check_shards", "check_doc_ids",
           "check_token_positions", "real_finite"]


def check_group(group, n: int, where: str, needs: tuple = ()):
    """``group`` or a new ``SimGroup(n)`` when it is None; a ValueError unless it is a
    :class:`SimGroup` of ``n`` ranks, or another object that has the collectives named in
    ``needs`` (a network that a check serves, say, which offers only those)."""
    if group is None:
        return SimGroup(n)
    if not isinstance(group, SimGroup):
        if needs and all(callable(getattr(group, name, None)) for name in needs):
            return group
        also = f" (or an object with {', '.join(needs)})" if needs else ""
        ids = (" (document ids? everything after group is keyword-only: pass doc_ids=...)"
               if isinstance(group, (np.ndarray, list, tuple)) else "")
        raise ValueError(f"{where}: group must be a SimGroup{also}, or None; got "
                         f"{type(group).__name__}{ids}")
    if group.n != n:
        raise ValueError(f"{where}: {n} shards for a group of {group.n} ranks")
    return group


def check_qkv_shards(q_shards, k_shards, v_shards, positions, group, name, needs=()):
    """The per-rank inputs of every sim attention method, checked: ``(q, k, v, positions,
    group)``, with ``positions`` a list of arrays (a layout name becomes
    :func:`lesson10.layouts.shard_positions`). ``needs``: the collectives a group other than
    a SimGroup must offer (see ``comm.check_group``)."""
    q = check_shards(q_shards, f"{name}: q_shards")
    n = len(q)
    k = check_shards(k_shards, f"{name}: k_shards", n)
    v = check_shards(v_shards, f"{name}: v_shards", n)
    for what, x in (("q", q[0]), ("k", k[0]), ("v", v[0])):
        if x.ndim != 3:
            raise ValueError(f"{name}: each {what} shard must be (tokens, heads, head_dim), got {x.shape}")
    c = q[0].shape[0]
    if k[0].shape[0] != c or v[0].shape[:2] != k[0].shape[:2]:
        raise ValueError(f"{name}: every rank needs Q, K and V for the same tokens; got "
                         f"q {q[0].shape}, k {k[0].shape}, v {v[0].shape}")
    if isinstance(positions, str):                  # a layout name
        positions = shard_positions(n * c, n, positions)
    if not isinstance(positions, (list, tuple)) or len(positions) != n:
        raise ValueError(f"{name}: positions must be a list of {n} arrays of global token ids "
                         "(layouts.shard_positions(s, n, layout)) or a layout name")
    positions = [np.asarray(p) for p in positions]
    for r, p in enumerate(positions):
        if p.shape != (c,):
            raise ValueError(f"{name}: rank {r} holds {c} tokens but positions[{r}] has shape {p.shape}")
    check_permutation(np.concatenate(positions), name)
    group = check_group(group, n, name, needs)
    return q, k, v, positions, group


def check_token_positions(pos, length: int, name: str) -> np.ndarray:
    """``pos`` as ``length`` integer global token ids (``None``: ``0..length-1``)."""
    if pos is None:
        return np.arange(length)
    pos = np.asarray(pos)
    if pos.shape != (length,):
        raise ValueError(f"{name} must have one position per token, shape ({length},), got {pos.shape}")
    if not np.issubdtype(pos.dtype, np.integer):
        raise ValueError(f"{name} must hold integer token ids, got dtype {pos.dtype} "
                         f"(use layouts.shard_positions)")
    return pos


def check_doc_ids(doc_ids, s=None, where: str = "doc_ids"):
    """``doc_ids`` as an integer array of shape ``(s,)`` (one document id per global token
    position; any length if ``s`` is None), or None. Any integer labels work; a packed batch
    of documents of 3, 2 and 1 tokens is ``[0, 0, 0, 1, 1, 2]``."""
    if doc_ids is None:
        return None
    ids = np.asarray(doc_ids)
    if ids.ndim != 1 or (s is not None and ids.shape[0] != s):
        want = f"the s = {s}" if s is not None else "every"
        raise ValueError(f"{where}: doc_ids must give the document of {want} global token "
                         f"position, a 1-D array of shape ({s if s is not None else 's'},), "
                         f"got shape {ids.shape}")
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"{where}: doc_ids must be integer document ids (e.g. 0, 0, 0, 1, 1, 2), "
                         f"got dtype {ids.dtype}")
    return ids.astype(np.int64, copy=False)


def real_finite(x, name: str) -> np.ndarray:
    """``x`` as a float64 array; complex, non-numeric or non-finite values are a ValueError."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "biuf":
        raise ValueError(f"{name} must hold real numbers, got dtype {arr.dtype}; pass a float array")
    arr = arr.astype(float, copy=False)
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or inf; attention needs finite inputs (check the "
                         f"step that produced them)")
    return arr
