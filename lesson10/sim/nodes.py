"""Node-limited routing (DeepSeek-V3) and the bytes of a two-level (node, GPU) all-to-all.

The ``E`` experts are split evenly over ``nodes`` nodes, in order: expert ``i`` is on node
``i // (E/nodes)``. With ``max_nodes = M`` every token first scores each node by the sum
of its ``m = ceil(k/M)`` largest routing scores on that node (``k/M`` when ``M`` divides
``k``, as in DeepSeek-V3: ``k = 8``, ``M = 4``, ``m = 2``), keeps the ``M`` best nodes (ties
to the lower node id), and then picks its top ``k`` experts among the experts of those
nodes only. ``M`` nodes must hold at least ``k`` experts: ``M * E/nodes >= k``.

Bytes (:func:`node_bytes`): ``Ne`` GPUs, ``Ne/nodes`` per node, GPU ``g`` on node
``g // (Ne/nodes)``. A token on GPU ``src`` (node ``ns``, local index ``l``) crosses to each
*remote* node it uses once, to the GPU with the same local index there (its relay), which
forwards it over the node's fast links to the GPUs of its experts; the outputs come back
the same way, summed with their gates on the relay, so the combine sends one vector per
(token, remote node) too. Inter-node: ``h e`` per (token, remote node) in the dispatch
(sent by ``src``) and in the combine (sent by the relay). Intra-node: ``h e`` per kept
(token, expert) copy whose expert GPU is not the GPU holding the token in that node
(``src`` on its own node, the relay on a remote one), in the dispatch (sent by the holder)
and in the combine (sent back by the expert's GPU). Dropped copies are not sent.
"""
from __future__ import annotations

import numpy as np

from ..topology import check_nodes  # the rule, shared with spmd

__all__ = ["check_nodes", "node_limited_scores", "node_bytes", "one_hop_copies"]


def node_limited_scores(scores: np.ndarray, k: int, nodes: int, max_nodes: int) -> np.ndarray:
    """``scores (T, E)`` with the experts outside each token's ``max_nodes`` best nodes set to
    ``-inf`` (node score: the sum of the node's ``ceil(k/max_nodes)`` largest scores)."""
    T, E = scores.shape
    per_node = E // nodes
    if max_nodes >= nodes:
        return scores
    m = -(-k // max_nodes)
    by_node = np.sort(scores.reshape(T, nodes, per_node), axis=2)[:, :, per_node - m:]
    node_score = by_node.sum(axis=2)                                   # (T, nodes)
    best = np.argsort(-node_score, axis=1, kind="stable")[:, :max_nodes]
    allowed = np.zeros((T, nodes), dtype=bool)
    np.put_along_axis(allowed, best, True, axis=1)
    return np.where(np.repeat(allowed, per_node, axis=1), scores, -np.inf)


def node_bytes(experts, keep, src_gpu, E: int, Ne: int, nodes: int, h: int, e: float = 2):
    """Inter- and intra-node bytes per GPU (dispatch + combine), see the module docstring.

    ``experts (N, k)`` expert ids, ``keep (N, k)`` bool (or None: all kept), ``src_gpu (N,)``
    the GPU of each token. Returns ``(internode (Ne,), intranode (Ne,), remote (N,))`` with
    ``remote[t]`` the number of remote nodes token ``t`` is sent to.
    """
    experts = np.asarray(experts, dtype=np.int64)
    N = experts.shape[0]
    keep = np.ones(experts.shape, dtype=bool) if keep is None else np.asarray(keep, dtype=bool)
    src = np.asarray(src_gpu, dtype=np.int64)
    gpn = Ne // nodes                                                  # GPUs per node
    e_node = experts // (E // nodes)                                   # (N, k)
    e_gpu = experts // (E // Ne)
    s_node, local = src // gpn, src % gpn
    used = np.zeros((N, nodes), dtype=bool)                            # nodes with a kept copy
    rows = np.broadcast_to(np.arange(N)[:, None], experts.shape)
    used[rows[keep], e_node[keep]] = True
    used[np.arange(N), s_node] = False                                 # the own node is free
    remote = used.sum(axis=1)
    inter = np.bincount(src, weights=remote, minlength=Ne)             # dispatch, by src
    t_idx, n_idx = np.nonzero(used)
    inter += np.bincount(n_idx * gpn + local[t_idx], minlength=Ne)     # combine, by the relay
    holder = np.where(e_node == s_node[:, None], src[:, None], e_node * gpn + local[:, None])
    intra = one_hop_copies(holder, e_gpu, keep, Ne)
    return inter * float(h * e), intra * float(h * e), remote


def one_hop_copies(src, dst, keep, Ne: int) -> np.ndarray:
    """Copies each of ``Ne`` GPUs sends over one hop, float ``(Ne,)``: a kept copy ``(N, k)``
    leaves GPU ``src`` for GPU ``dst`` in the dispatch (counted on ``src``) and comes back
    in the combine (counted on ``dst``); a copy already on its GPU is not sent. With
    ``src`` the tokens' own GPUs this is the flat all-to-all (notebook 05's exercise, which
    its sandbox withholds); :func:`node_bytes` uses it for the hop inside a node."""
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    fwd = np.asarray(keep, dtype=bool) & (dst != src)
    return (np.bincount(src[fwd], minlength=Ne)                        # dispatch, by holder
            + np.bincount(dst[fwd], minlength=Ne)).astype(float)       # combine, by expert GPU
