"""The grader's stand-in runtime: copied verbatim into the sandbox as ``lesson10/_standin.py``.

The sandbox's ``lesson10`` has the course's names and none of its code (:mod:`.standin`
writes it). Every stub there calls into this module: :func:`reference` (a course function:
refused), :func:`withheld` (a function a notebook withholds: the student's own, or an
``_adapt_*`` adapter built from the student's functions, in display-only cells), and
:func:`check_stub` (``check_<exercise>``: hands the function to the judge). While an
exercise is judged (``JUDGING`` set by the runner in the judged fork) nothing here computes
anything: each adapter's first line is :func:`_not_judging`.

It imports nothing of the package at import time (there is no course code in the sandbox);
the few imports of ``lesson10`` inside functions reach the stand-in's own modules there
(``sim`` and the layouts are real code in the notebooks that ship them). Here it is an
ordinary module, linted, typed and unit-tested (``tests/test_grade_standin.py``).
"""
from __future__ import annotations

import numpy as _np


class NotAvailable(RuntimeError):
    """A course function was called inside the grader's sandbox."""


#: (exercise id, what to use instead) while an exercise is being judged in this process
JUDGING: tuple[str, str] | None = None


def _refuse(name):
    if JUDGING is not None:
        from lesson10.checks.refused import REFUSAL  # a literal: the stand-in keeps it
        exercise, instead = JUDGING
        raise NotAvailable(REFUSAL.format(exercise=exercise, name=name, instead=instead))
    raise NotAvailable(
        f"{name} is not available while the grader runs this notebook: the sandbox holds a "
        f"stand-in lesson10 with the course's names but none of its code. Your exercises "
        f"never need it; cells that explore with it run in your own Jupyter.")


def _not_judging(name):
    """Every adapter's first line: none runs while an exercise is judged (student code that
    reaches one, as a module attribute or through a stub's closure, is refused)."""
    if JUDGING is not None:
        _refuse(f"lesson10._standin.{name}")


def reference(name):
    def stub(*args, **kwargs):
        _refuse(name)
    stub.__name__ = stub.__qualname__ = name.rsplit(".", 1)[-1]
    stub.__module__ = name.rsplit(".", 1)[0]
    stub.__doc__ = f"stand-in for {name} (not available while grading)"
    return stub


def reference_class(name):
    def refuse(cls, *args, **kwargs):
        _refuse(name)
    short = name.rsplit(".", 1)[-1]
    return type(short, (), {"__new__": refuse, "__module__": name.rsplit(".", 1)[0],
                            "__doc__": f"stand-in for {name} (not available while grading)"})


def _user_ns():
    """The notebook's namespace (IPython's user namespace, else __main__)."""
    try:
        from IPython import get_ipython
        shell = get_ipython()
        if shell is not None:
            return shell.user_ns
    except Exception:  # noqa: BLE001
        pass
    import __main__
    return vars(__main__)


def _has(name):
    return callable(_user_ns().get(name))


_BUSY: set[str] = set()


def _student(name, what):
    """The notebook's own function ``name``, standing in for the withheld ``what`` (never
    while an exercise is judged, never inside itself)."""
    if JUDGING is not None:
        _refuse(what)
    fn = _user_ns().get(name)
    if not callable(fn) or name in _BUSY:
        _refuse(what)

    def call(*args, **kwargs):
        _BUSY.add(name)
        try:
            return fn(*args, **kwargs)
        except NotImplementedError:       # not written yet: the course's stays withheld
            _refuse(what)
        finally:
            _BUSY.discard(name)
    return call


def _accepted(fn, name, kwargs):
    """The keyword arguments ``fn`` takes; ``group`` is dropped where it takes none (the
    ledger of a simulated group is all it feeds), any other refused."""
    import inspect
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return kwargs
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return kwargs
    out = {}
    for key, value in kwargs.items():
        if key in params:
            out[key] = value
        elif key != "group" and value is not None:
            _refuse(f"{name}({key}=...)")
    return out


def withheld(name, spec):
    """The stand-in of a withheld course function: in a display-only cell, the notebook's
    own function ``spec`` (or the adapter ``adapter:NAME``); refused while judging."""
    if spec is None:
        return reference(name)
    if spec.startswith("adapter:"):
        adapter = globals()["_adapt_" + spec[len("adapter:"):]]

        def stub(*args, **kwargs):
            if JUDGING is not None:
                _refuse(name)
            return adapter(*args, **kwargs)
    else:
        def stub(*args, **kwargs):
            fn = _student(spec, name)
            return fn(*args, **_accepted(_user_ns().get(spec), name, kwargs))
    stub.__name__ = stub.__qualname__ = name.rsplit(".", 1)[-1]
    stub.__doc__ = f"stand-in for {name} while grading: your {spec}"
    return stub


def withheld_method(name, spec):
    """:func:`withheld` as a method (``self`` is not passed on to a student's function)."""
    plain = withheld(name, spec)
    if spec is not None and spec.startswith("adapter:"):
        return plain

    def method(self, *args, **kwargs):
        return plain(*args, **kwargs)
    method.__name__ = plain.__name__
    return method


def figure(name):
    def draw(*args, **kwargs):
        if JUDGING is not None:            # an exercise calls no figure (the check cell's rule)
            _refuse(name)
        print(f"[{name}: an interactive figure, drawn in Jupyter, not while grading]")
    draw.__name__ = draw.__qualname__ = name.rsplit(".", 1)[-1]
    return draw


def module_getattr(module):
    def __getattr__(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        import importlib
        try:                                   # a submodule (``from lesson10 import figures``)
            return importlib.import_module(f"{module}.{attr}")
        except ImportError:
            return reference(f"{module}.{attr}")
    return __getattr__


# --------------------------------------------------------------------------- the checks
class CheckFailed(AssertionError):
    """A check found a wrong answer."""


OUTCOMES: list = []

_FALLBACK_SAID: set[str] = set()


def check_stub(exercise):
    """``check_<exercise>`` of the sandbox's lesson10.checks: hands the student's function to
    the judge (the runner sets ``lesson10.checks.hook``), whose verdict the runner prints."""
    def check(student_fn, *, seed=None):
        import sys
        hook = getattr(sys.modules.get("lesson10.checks"), "hook", None)
        if hook is None:
            print(f"check_{exercise}: not judged (no grader runs this notebook)")
            return None
        OUTCOMES.append(hook(exercise, student_fn))
        return None
    check.__name__ = check.__qualname__ = f"check_{exercise}"
    return check



def summary():
    latest = {o["exercise"]: o for o in OUTCOMES}
    if not latest:
        print("no check has run yet")
    for o in latest.values():
        print(f"  {o['exercise']:<22s} {o['status']:<14s} {o['points']}/{o['max_points']}")


def fallback(student_fn, reference_fn):
    name = getattr(student_fn, "__name__", "this function")

    def call(*args, **kwargs):
        try:
            return student_fn(*args, **kwargs)
        except NotImplementedError:
            if name not in _FALLBACK_SAID:
                print(f"({name} is not written yet: the course's reference would stand in for it)")
                _FALLBACK_SAID.add(name)
            return reference_fn(*args, **kwargs)
    call.__name__ = getattr(student_fn, "__name__", "call")
    call.__wrapped__ = student_fn            # type: ignore[attr-defined]
    return call


# --------------------------------------------------------------------------- the adapters
def _adapt_group_reduce_scatter(self, xs, axis=0):
    _not_judging("_adapt_group_reduce_scatter")
    if axis != 0:
        _refuse("SimGroup.reduce_scatter(axis != 0)")
    return _student("reduce_scatter", "SimGroup.reduce_scatter")(xs)


def _adapt_group_all_gather(self, xs, axis=0):
    _not_judging("_adapt_group_all_gather")
    if axis != 0:
        _refuse("SimGroup.all_gather(axis != 0)")
    return _student("all_gather", "SimGroup.all_gather")(xs)


def _adapt_group_all_reduce(self, xs):
    _not_judging("_adapt_group_all_reduce")
    rs = _student("reduce_scatter", "SimGroup.all_reduce")
    return _student("all_gather", "SimGroup.all_reduce")(rs(xs))


def _adapt_tp_forward(partials, op, group=None):
    _not_judging("_adapt_tp_forward")
    rs = _student("reduce_scatter", "tp_forward")
    return [op(y) for y in _student("all_gather", "tp_forward")(rs(partials))]


def _adapt_comm_bytes(method, s, h, n, g=1, e=2):
    _not_judging("_adapt_comm_bytes")
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
    _not_judging("_adapt_usp_bytes")
    u, r = ulysses_size, ring_size
    inside = _student("ulysses_bytes", "usp_bytes")(s / r, h, u, g, e)
    return float(inside) + (r - 1) * 2 * (s / r) * h * e / (g * u)


def _adapt_attention(q, k, v, causal=False, q_pos=None, k_pos=None, doc_ids=None):
    _not_judging("_adapt_attention")
    if doc_ids is not None:
        _refuse("lesson10.sim.attention(doc_ids=...)")
    block = _student("block_attention", "lesson10.sim.attention")
    q_pos = _np.arange(len(q)) if q_pos is None else q_pos
    k_pos = _np.arange(len(k)) if k_pos is None else k_pos
    return block(q, k, v, q_pos, k_pos, causal)


def _adapt_shard_positions(s, n, layout="contiguous"):
    _not_judging("_adapt_shard_positions")
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
    _not_judging("_adapt_token_work")
    work = _student("causal_work", "layouts.causal_work")
    return _np.asarray(work(_adapt_shard_positions(s, n, layout)), dtype=_np.int64)


def _adapt_ring_by_documents(q_shards, k_shards, v_shards, positions, causal=True, group=None,
                              return_stats=False, doc_ids=None):
    # notebook 03: the output is attention over every K/V block; the work per round and
    # rank is your causal_work, document by document (a document mask is block diagonal)
    _not_judging("_adapt_ring_by_documents")
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
    work = _np.asarray(sum(_np.asarray(work_fn([p[docs[p] == d] for p in pos]), dtype=_np.int64)
                           for d in _np.unique(docs)), dtype=_np.int64)
    ring_time = _student("ring_time", "ring_attention(return_stats=True)")
    return out, SimpleNamespace(work=work, ring_time=int(ring_time(work)),
                                lse=[lse for _, lse in pairs], skipped=work == 0,
                                n_skipped=int((work == 0).sum()), bytes_sent=None)


def _adapt_ulysses_attention(q_shards, k_shards, v_shards, positions, causal=True, group=None,
                             attention=None, replicate_kv=False, doc_ids=None):
    _not_judging("_adapt_ulysses_attention")
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
    _not_judging("_adapt_route_topk")
    if bias is not None:
        _refuse("lesson10.sim.route_topk(bias=...)")
    if nodes is not None and max_nodes is not None:
        from lesson10.sim.nodes import node_limited_scores
        logits = node_limited_scores(_np.asarray(logits, dtype=float), k, nodes, max_nodes)
    return _student("route_topk", "lesson10.sim.route_topk")(logits, k)


def _adapt_simulate_moe(T, E, k, Ne, capacity_factor=None, skew=0.0, seed=0, h=4096, e=2,
                        bias=None, popularity=None, nodes=None, max_nodes=None):
    # notebook 05: the course's routing and drops, your moe_stats for drops, loads and bytes
    _not_judging("_adapt_simulate_moe")
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
        bytes_formula=cost.moe_a2a_bytes(k, T // Ne, h, Ne, e),
        traffic=None,                        # type: ignore[arg-type]  # no matrix in the sandbox
        popularity=popularity, **more)


def _adapt_one_hop_copies(src, dst, keep, Ne):
    # your moe_stats counts them: each copy becomes a token (k = 1) on its GPU src, sent to
    # an "expert" that is GPU dst (E = Ne); the GPUs get equal rows, padded with dropped copies
    _not_judging("_adapt_one_hop_copies")
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
    _not_judging("_adapt_keep_within_capacity")
    experts = _np.asarray(experts)
    if capacity is None:
        return _np.ones(experts.shape, dtype=bool)
    N, k = experts.shape
    cf = (capacity - 0.5) * E / (k * N) if N * k else 1.0      # ceil(cf k N / E) = capacity
    return _np.asarray(_student("capacity_keep", "keep_within_capacity")(experts, E, cf))


def _adapt_expert_capacity(N, E, k, capacity_factor=None):
    _not_judging("_adapt_expert_capacity")
    if capacity_factor is None:
        return None
    keep = _student("capacity_keep", "expert_capacity")
    return int(_np.asarray(keep(_np.zeros((N, k), dtype=int), E, capacity_factor)).sum())


def _adapt_moe_capacity(config, N):
    # MoEConfig.capacity(N), a method: the config's E, k and capacity factor
    _not_judging("_adapt_moe_capacity")
    return _adapt_expert_capacity(N, config.E, config.k, config.capacity_factor)
