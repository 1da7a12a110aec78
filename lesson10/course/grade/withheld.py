"""What each course notebook's sandbox withholds of the course's code.

A notebook is graded with the real ``layouts``, ``cost``, ``topology`` and ``sim`` (so its
display-only cells run: layouts, closed forms, the simulation's helpers), less the names
listed here for that notebook: the references of its exercises (what
``lesson10.checks.EXERCISES`` asks for) and whatever computes one of them in a line or two.
Their source is not in the sandbox. Each stands in as a stub that, in a display-only cell,
calls the student's own function of that exercise (the name on the right: the notebook's
``ring_attention`` for ``sim.ring_attention``, or an adapter of :data:`ADAPTERS` that builds
the call from the student's functions), and while an exercise is judged refuses
(``NotAvailable``). A name on the right of ``None``: no student function stands in (the
cell gets NotAvailable). ``figures`` stay placeholders; ``spmd``, ``runs``, ``bench`` and
``course`` stay stubs.

Why each name: the check of the exercise imports it as its reference, or it gives the
answer with no more than a call (``cost.comm_bytes("ulysses", ...)`` is ``ulysses_bytes``;
``SimGroup.reduce_scatter`` is ``reduce_scatter``; ``layouts.shard_positions(s, n,
"zigzag")`` is ``zigzag_positions``; ``sim.ring_attention(..., return_stats=True).work`` and
``_kept_per_source`` and ``simulate_moe``'s accounting give ``moe_stats``; the two-level
bytes of ``sim.nodes.node_bytes`` are not the flat all-to-all's, so it is shipped).
"""
from __future__ import annotations

import ast

from ...checks.refused import WITHHELD

#: the modules (paths under lesson10/) shipped as real code, the rest being stubs
REAL = ("layouts.py", "cost.py", "topology.py", "sim/")

#: notebook -> {qualified name as defined: the student's function, "adapter:NAME" or None}
#: (one table with the check cell, which refuses the same calls: :mod:`lesson10.checks.refused`)

#: stand-ins built from the student's functions (they run in the sandbox, in _standin.py);
#: each is course code that is no exercise's answer: the lesson's closed forms of the other
#: methods, the named layouts that no exercise asks for, argument plumbing
ADAPTERS = '''
import numpy as _np


def _adapt_group_reduce_scatter(self, xs, axis=0):
    if axis != 0:
        _refuse("SimGroup.reduce_scatter(axis != 0)")
    return _student("reduce_scatter", "SimGroup.reduce_scatter")(xs)


def _adapt_group_all_gather(self, xs, axis=0):
    if axis != 0:
        _refuse("SimGroup.all_gather(axis != 0)")
    return _student("all_gather", "SimGroup.all_gather")(xs)


def _adapt_group_all_reduce(self, xs):
    rs = _student("reduce_scatter", "SimGroup.all_reduce")
    return _student("all_gather", "SimGroup.all_reduce")(rs(xs))


def _adapt_tp_forward(partials, op, group=None):
    rs = _student("reduce_scatter", "tp_forward")
    return [op(y) for y in _student("all_gather", "tp_forward")(rs(partials))]


def _adapt_comm_bytes(method, s, h, n, g=1, e=2):
    m = str(method).lower()
    if m == "sp" and _has("sp_bytes"):
        return float(_student("sp_bytes", "comm_bytes('sp')")(s, h, n, e)[1])
    if m == "ulysses" and _has("ulysses_bytes"):
        return float(_student("ulysses_bytes", "comm_bytes('ulysses')")(s, h, n, g, e))
    if m == "ring":
        return (n - 1) * 2 * (s / n) * h * e / g
    if m == "allgather":
        return (n - 1) / n * 2 * s * h * e / g
    _refuse(f"lesson10.cost.comm_bytes({method!r})")


def _adapt_usp_bytes(s, h, ulysses_size, ring_size, g=1, e=2):
    u, r = ulysses_size, ring_size
    inside = _student("ulysses_bytes", "usp_bytes")(s / r, h, u, g, e)
    return float(inside) + (r - 1) * 2 * (s / r) * h * e / (g * u)


def _adapt_attention(q, k, v, causal=False, q_pos=None, k_pos=None, doc_ids=None):
    if doc_ids is not None:
        _refuse("lesson10.sim.attention(doc_ids=...)")
    block = _student("block_attention", "lesson10.sim.attention")
    q_pos = _np.arange(len(q)) if q_pos is None else q_pos
    k_pos = _np.arange(len(k)) if k_pos is None else k_pos
    return block(q, k, v, q_pos, k_pos, causal)


def _adapt_shard_positions(s, n, layout="contiguous"):
    name = str(getattr(layout, "value", layout)).lower()
    if name.startswith("zig"):
        return [_np.asarray(p) for p in _student("zigzag_positions", "shard_positions")(s, n)]
    if s % n:
        raise ValueError(f"s = {s} tokens cannot be split over n = {n} ranks")
    if name.startswith("contig"):
        return [_np.arange(r * (s // n), (r + 1) * (s // n)) for r in range(n)]
    if name.startswith("strip"):
        return [_np.arange(r, s, n) for r in range(n)]
    raise ValueError(f"unknown layout {layout!r}")


def _adapt_token_work(s, n, layout):
    work = _student("causal_work", "layouts.causal_work")
    return _np.asarray(work(_adapt_shard_positions(s, n, layout)), dtype=_np.int64)


def _adapt_ring_by_documents(q_shards, k_shards, v_shards, positions, causal=True, group=None,
                              return_stats=False, doc_ids=None):
    # notebook 03: the output is attention over every K/V block; the work per round and
    # rank is your causal_work, document by document (a document mask is block diagonal)
    from types import SimpleNamespace
    from lesson10.sim.attention import attention
    if isinstance(positions, str):
        positions = _adapt_shard_positions(sum(len(q) for q in q_shards), len(q_shards), positions)
    pos = [_np.asarray(p) for p in positions]
    order = _np.concatenate(pos)
    K, V = _np.concatenate(k_shards), _np.concatenate(v_shards)
    pairs = [attention(q, K, V, causal=causal, q_pos=p, k_pos=order, doc_ids=doc_ids)
             for q, p in zip(q_shards, pos)]
    out = [o for o, _ in pairs]
    if not return_stats:
        return out
    if not causal:
        _refuse("ring_attention(causal=False, return_stats=True)")
    work_fn = _student("causal_work", "ring_attention(return_stats=True)")
    docs = _np.zeros(len(order), dtype=int) if doc_ids is None else _np.asarray(doc_ids)
    work = sum(_np.asarray(work_fn([p[docs[p] == d] for p in pos]), dtype=_np.int64)
               for d in _np.unique(docs))
    ring_time = _student("ring_time", "ring_attention(return_stats=True)")
    return out, SimpleNamespace(work=work, ring_time=int(ring_time(work)),
                                lse=[lse for _, lse in pairs], skipped=work == 0,
                                n_skipped=int((work == 0).sum()), bytes_sent=None)


def _adapt_ulysses_attention(q_shards, k_shards, v_shards, positions, causal=True, group=None,
                             attention=None, replicate_kv=False, doc_ids=None):
    if doc_ids is not None:
        _refuse("ulysses_attention(doc_ids=...)")
    if replicate_kv:       # copy every K/V head rep times, as the lesson's fallback does
        from lesson10.sim.ulysses import kv_replication
        n, a, a_kv = len(q_shards), q_shards[0].shape[1], k_shards[0].shape[1]
        rep = kv_replication(a, a_kv, n)
        k_shards = [_np.repeat(x, rep, axis=1) for x in k_shards]
        v_shards = [_np.repeat(x, rep, axis=1) for x in v_shards]
    if group is None:
        from lesson10.sim.comm import SimGroup
        group = SimGroup(len(q_shards))
    if attention is None:
        from lesson10.sim.attention import attention
    uly = _student("ulysses_attention", "lesson10.sim.ulysses_attention")
    return uly(q_shards, k_shards, v_shards, positions, causal, group=group, attention=attention)


def _adapt_route_topk(logits, k, bias=None, nodes=None, max_nodes=None):
    if bias is not None:
        _refuse("lesson10.sim.route_topk(bias=...)")
    if nodes is not None and max_nodes is not None:
        from lesson10.sim.nodes import node_limited_scores
        logits = node_limited_scores(_np.asarray(logits, dtype=float), k, nodes, max_nodes)
    return _student("route_topk", "lesson10.sim.route_topk")(logits, k)


def _adapt_simulate_moe(T, E, k, Ne, capacity_factor=None, skew=0.0, seed=0, h=4096, e=2,
                        bias=None, popularity=None, nodes=None, max_nodes=None):
    # notebook 05: the course's routing and drops, your moe_stats for drops, loads and bytes
    from lesson10 import cost
    from lesson10.sim.moe import MoEStats, check_nodes, node_bytes, skewed_routing
    nodes, max_nodes = check_nodes(E, k, nodes, max_nodes)
    capacity = _adapt_expert_capacity(T, E, k, capacity_factor)
    popularity, choices = skewed_routing(T, E, k, skew, seed, bias, popularity, nodes, max_nodes)
    keep = _adapt_keep_within_capacity(choices, E, capacity)
    st = _student("moe_stats", "lesson10.sim.simulate_moe")(choices, keep, Ne, E, h, e)
    load_e = _np.bincount(choices[keep].ravel(), minlength=E)
    load_g = _np.asarray(st["load_per_gpu"])
    bytes_g = _np.asarray(st["bytes_per_gpu"], dtype=float)
    mean = float(load_g.mean())
    more = {}
    if nodes is not None:
        inter, intra, remote = node_bytes(choices, keep, _np.arange(T) // (T // Ne), E, Ne,
                                          nodes, h, e)
        more = dict(nodes=nodes, max_nodes=max_nodes, internode_bytes_per_gpu=inter,
                    intranode_bytes_per_gpu=intra, remote_nodes_per_token=float(remote.mean()))
    return MoEStats(
        T=T, E=E, k=k, Ne=Ne, capacity_factor=capacity_factor, capacity=capacity,
        skew=float(skew), h=h, e=e, drop_rate=float(st["drop_rate"]),
        dropped=int(T * k - keep.sum()), load_per_expert=load_e, load_per_gpu=load_g,
        max_load=int(load_g.max()), mean_load=mean,
        imbalance=float(load_g.max() / mean) if mean > 0 else 1.0, bytes_per_gpu=bytes_g,
        bytes_mean=float(bytes_g.mean()), bytes_max=float(bytes_g.max()),
        bytes_formula=cost.moe_a2a_bytes(k, T // Ne, h, Ne, e), traffic=None,
        popularity=popularity, **more)


def _adapt_one_hop_copies(src, dst, keep, Ne):
    # your moe_stats counts them: each copy becomes a token (k = 1) on its GPU src, sent to
    # an "expert" that is GPU dst (E = Ne); the GPUs get equal rows, padded with dropped copies
    src, dst = _np.asarray(src).ravel(), _np.asarray(dst).ravel()
    keep = _np.asarray(keep, dtype=bool).ravel()
    rows = max(1, int(_np.bincount(src, minlength=Ne).max(initial=0)))
    experts = _np.repeat(_np.arange(Ne), rows)[:, None]
    kept = _np.zeros((Ne * rows, 1), dtype=bool)
    for g in range(Ne):
        mine = _np.flatnonzero(src == g)
        experts[g * rows:g * rows + mine.size, 0] = dst[mine]
        kept[g * rows:g * rows + mine.size, 0] = keep[mine]
    st = _student("moe_stats", "lesson10.sim.nodes.one_hop_copies")(experts, kept, Ne, Ne, 1, 1)
    return _np.asarray(st["bytes_per_gpu"], dtype=float)


def _adapt_keep_within_capacity(experts, E, capacity):
    experts = _np.asarray(experts)
    if capacity is None:
        return _np.ones(experts.shape, dtype=bool)
    N, k = experts.shape
    cf = (capacity - 0.5) * E / (k * N) if N * k else 1.0      # ceil(cf k N / E) = capacity
    return _np.asarray(_student("capacity_keep", "keep_within_capacity")(experts, E, cf))


def _adapt_expert_capacity(N, E, k, capacity_factor=None):
    if capacity_factor is None:
        return None
    keep = _student("capacity_keep", "expert_capacity")
    return int(_np.asarray(keep(_np.zeros((N, k), dtype=int), E, capacity_factor)).sum())
'''


def is_real(rel: str) -> bool:
    """Whether the module at ``rel`` (a path under lesson10/) is shipped as real code."""
    return any(rel == r or (r.endswith("/") and rel.startswith(r)) for r in REAL)


_IMPORT = "from lesson10 import _standin as _lesson10_standin"


def _stub(name: str, public: str, spec, kind: str):
    call = {"function": "withheld", "method": "withheld_method", "static": "withheld"}[kind]
    text = f"{name} = _lesson10_standin.{call}({public!r}, {spec!r})"
    if kind == "static":
        text = f"{name} = staticmethod(_lesson10_standin.withheld({public!r}, {spec!r}))"
    return ast.parse(text).body[0]


def _class(node: ast.ClassDef, module: str, table: dict) -> ast.ClassDef:
    body = []
    for item in node.body:
        q = f"{module}.{node.name}.{getattr(item, 'name', '')}"
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and q in table:
            static = any(isinstance(d, ast.Name) and d.id == "staticmethod"
                         for d in item.decorator_list)
            body.append(_stub(item.name, q, table[q], "static" if static else "method"))
        else:
            body.append(item)
    node.body = body
    return node


def real_module(module: str, tree: ast.Module, notebook: str, alias: dict) -> str:
    """The source of ``module`` for the sandbox of ``notebook``: the real code, with each
    withheld function (or method) replaced by its stand-in (see the module's docstring)."""
    table = WITHHELD.get(notebook, {})
    body: list[ast.stmt] = []
    for node in tree.body:
        q = f"{module}.{getattr(node, 'name', '')}"
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and q in table:
            body.append(_stub(node.name, alias.get(q, q), table[q], "function"))
        elif isinstance(node, ast.ClassDef):
            body.append(_class(node, module, table))
        else:
            body.append(node)
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None),
                                                           ast.Constant):
        body.pop(0)          # the module's docstring may speak of what is withheld
    at = 0
    for i, node in enumerate(body):
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            at = i + 1
    head = ast.parse(f'"""{module} while grading {notebook}: the course\'s code, less what '
                     f'the exercises ask for."""').body
    body[at:at] = [ast.parse(_IMPORT).body[0]]
    body[:0] = head
    return ast.unparse(ast.Module(body=body, type_ignores=[])) + "\n"
