"""What an exercise may not call of the course's code, one rule for the check cell and the grader.

:data:`WITHHELD` lists, per course notebook, the course functions an exercise of that
notebook may not use (its references, and whatever computes one of them in a line or
two); :data:`USE_INSTEAD` says per exercise what to write instead. The grader's sandbox
withholds those functions (:mod:`lesson10.course.grade.withheld`: while an exercise is
judged there, each stand-in raises ``NotAvailable`` with :func:`refusal`'s sentence). In
Jupyter, :func:`guard` gives the check cell the same rule: while a check runs the
student's function, each withheld function of that notebook refuses to be called from the
student's code (directly, or through other course code the student called), with the same
sentence; the check's own code (its references, what it serves) calls them as usual.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import sys
import sysconfig
import threading
import types
from typing import Any

from ..errors import Lesson10Error

__all__ = ["WITHHELD", "USE_INSTEAD", "NotAvailable", "guard", "refusal", "use_instead"]

#: notebook -> {qualified name as defined: the student's function, "adapter:NAME" or None}
#: (the right-hand side is what stands in for it in the grader's display-only cells)
WITHHELD: dict[str, dict[str, str | None]] = {
    "01_sequence_parallel": {
        "lesson10.sim.comm.SimGroup.reduce_scatter": "adapter:group_reduce_scatter",
        "lesson10.sim.comm.SimGroup.all_gather": "adapter:group_all_gather",
        "lesson10.sim.comm.SimGroup.all_reduce": "adapter:group_all_reduce",
        "lesson10.sim.comm.SimGroup._sum": None,
        "lesson10.sim.sp.sp_forward": "sp_forward",
        "lesson10.sim.sp.tp_forward": "adapter:tp_forward",
        "lesson10.cost.comm_bytes": "adapter:comm_bytes",
        "lesson10.cost.all_reduce_bytes": None,
        "lesson10.cost.reduce_scatter_bytes": None,
        "lesson10.cost.all_gather_bytes": None,
        "lesson10.cost.moe_a2a_bytes": None,
    },
    "02_ring_attention": {
        "lesson10.sim.attention.attention": "adapter:attention",
        "lesson10.sim.attention.merge": "merge",
        "lesson10.sim.ring.ring_attention": "ring_attention",
    },
    "03_load_balance": {
        "lesson10.layouts.shard_positions": "adapter:shard_positions",
        "lesson10.layouts._token_work": "adapter:token_work",
        "lesson10.layouts.ring_time": "ring_time",
        "lesson10.layouts.visible": None,
        "lesson10.layouts.block_plan": None,
        "lesson10.layouts.plan_pairs": None,
        "lesson10.layouts.plan_mask": None,
        "lesson10.sim.ring.ring_attention": "adapter:ring_by_documents",
    },
    "04_ulysses": {
        "lesson10.sim.ulysses.seq_to_heads": "seq_to_heads",
        "lesson10.sim.ulysses.heads_to_seq": "heads_to_seq",
        "lesson10.sim.ulysses._all_to_all_axes": None,
        "lesson10.sim.ulysses.ulysses_attention": "adapter:ulysses_attention",
        "lesson10.cost.comm_bytes": "adapter:comm_bytes",
        "lesson10.cost.usp_bytes": "adapter:usp_bytes",
        "lesson10.cost.moe_a2a_bytes": None,
    },
    "05_moe_dispatch": {
        "lesson10.sim.moe.route_topk": "adapter:route_topk",
        "lesson10.sim.capacity.keep_within_capacity": "adapter:keep_within_capacity",
        "lesson10.sim.capacity._queues": None,
        "lesson10.sim.capacity.arrival_order": None,
        "lesson10.cost.expert_capacity": "adapter:expert_capacity",
        "lesson10.sim.moe._kept_per_source": None,
        "lesson10.sim.moe.simulate_moe": "adapter:simulate_moe",
        "lesson10.sim.moe.moe_layer": None,
        "lesson10.sim.moe.moe_reference": None,
        "lesson10.sim.moe.switch_aux_loss": "switch_aux_loss",
        "lesson10.sim.nodes.one_hop_copies": "adapter:one_hop_copies",
    },
}

#: what an exercise should use instead of the course's code (said when it calls some)
USE_INSTEAD = {
    "sp_forward": "use the reduce_scatter, all_gather and op the check passes in",
    "ring_attention": "use the group, block_attention and merge the check passes in",
    "seq_to_heads": "split with NumPy and move the blocks with the group the check passes in",
    "heads_to_seq": "split with NumPy and move the blocks with the group the check passes in",
    "ulysses_attention": "use your seq_to_heads and heads_to_seq with the group, and the "
                         "attention kernel, that the check passes in",
    "causal_work": "count the visible pairs with NumPy",
}

#: the sentence of a refusal, in the check cell and in the sandbox (which gets this text)
REFUSAL = "exercise {exercise} may not call {name}; {instead}"


class NotAvailable(Lesson10Error, RuntimeError):
    """A course function an exercise may not use was called while its check ran."""


def use_instead(exercise_id: str) -> str:
    return USE_INSTEAD.get(exercise_id, "write it with NumPy and the functions you wrote")


def refusal(exercise: str, name: str, instead: str | None = None) -> str:
    """The sentence both paths say when ``exercise`` calls the withheld ``name``."""
    return REFUSAL.format(exercise=exercise, name=name,
                          instead=use_instead(exercise) if instead is None else instead)


# --------------------------------------------------------------------------- the check cell
_HERE = os.path.dirname(os.path.abspath(__file__))            # lesson10/checks
_COURSE = os.path.dirname(_HERE)                              # lesson10
_LIBRARIES = tuple({os.path.abspath(p) for p in (
    sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("purelib"),
    sysconfig.get_paths().get("platlib"), sys.prefix, sys.base_prefix) if p})
_KEY = "__lesson10_refused__"
_LOCK = threading.RLock()
_ACTIVE: dict[int, tuple] = {}        # id(function) -> (function, copy, code, defaults, kwdefaults)
_NAMES: dict[int, str] = {}           # id(function) -> its public name
_JUDGING: list[str] = []              # the exercises whose check runs now (innermost last)


def _who(filename: str) -> str:
    """``"check"``, ``"course"``, ``"library"`` or ``"student"``: whose code a frame runs."""
    path = os.path.abspath(filename) if not filename.startswith("<") else filename
    if path.startswith(_HERE + os.sep) and os.path.basename(path) != "feedback.py":
        return "check"              # feedback's fallback runs what the student hands it
    if path.startswith(_COURSE + os.sep):
        return "course"
    if filename.startswith(("<frozen", "<string>", "<lesson10")) or path.startswith(_LIBRARIES):
        return "library"
    return "student"


def _from_student(frame) -> bool:
    """Whether the call whose caller is ``frame`` comes from the student's code: the first
    frame outwards that is neither course code nor a library decides."""
    while frame is not None:
        who = _who(frame.f_code.co_filename)
        if who in ("check", "student"):
            return who == "student"
        frame = frame.f_back
    return False


def _dispatch(key: int, args, kwargs):
    entry, name = _ACTIVE.get(key), _NAMES.get(key, "a course function")
    if entry is None:                           # restored meanwhile (another thread's check)
        raise NotAvailable(f"{name} was called while its check was ending; run the cell again")
    if _JUDGING and _from_student(sys._getframe(2)):
        raise NotAvailable(refusal(_JUDGING[-1], name))
    return entry[1](*args, **kwargs)


def _resolve(qualified: str):
    """``(function, public name)`` of a qualified name of :data:`WITHHELD`, or None."""
    parts = qualified.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        obj: Any = module
        owner: Any = None
        for attr in parts[cut:]:
            owner, obj = obj, (vars(obj).get(attr) if isinstance(obj, type)
                               else getattr(obj, attr, None))
        obj = getattr(obj, "__func__", obj)            # a staticmethod
        if not isinstance(obj, types.FunctionType):
            return None
        package = sys.modules.get(module.__name__.rpartition(".")[0])
        public = qualified
        if owner is module and package is not None and getattr(package, parts[-1], None) is obj:
            public = f"{package.__name__}.{parts[-1]}"
        return obj, public
    return None


def _install(fn, public: str) -> None:
    key = id(fn)
    if key in _ACTIVE or fn.__closure__:        # a closure's code cannot be swapped
        return
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__,
                              fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    glue = compile(f"def {fn.__name__}(*args, **kwargs):\n"
                   f"    return {_KEY}({key}, args, kwargs)\n", "<lesson10 refused>", "exec")
    code = next(c for c in glue.co_consts if isinstance(c, types.CodeType))
    _ACTIVE[key] = (fn, copy, fn.__code__, fn.__defaults__, fn.__kwdefaults__)
    _NAMES[key] = public
    fn.__globals__[_KEY] = _dispatch
    fn.__code__, fn.__defaults__, fn.__kwdefaults__ = code, None, None


def _restore() -> None:
    for fn, _, code, defaults, kwdefaults in _ACTIVE.values():
        fn.__code__, fn.__defaults__, fn.__kwdefaults__ = code, defaults, kwdefaults
        fn.__globals__.pop(_KEY, None)
    _ACTIVE.clear()


@contextlib.contextmanager
def guard(exercise: str, notebook: str):
    """While the block runs (the check of ``exercise`` of ``notebook``), the course
    functions ``notebook`` withholds refuse calls from the student's code, as in the
    grader's sandbox (:data:`WITHHELD`)."""
    with _LOCK:
        outermost = not _JUDGING
        _JUDGING.append(exercise)
        if outermost:
            for qualified in WITHHELD.get(notebook, {}):
                found = _resolve(qualified)
                if found is not None:
                    _install(*found)
    try:
        yield
    finally:
        with _LOCK:
            _JUDGING.pop()
            if not _JUDGING:
                _restore()
