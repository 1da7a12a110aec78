"""What the SP exercise is served: the two collectives and the token-wise ``op``
(:class:`ServedSP`). Part of :mod:`lesson10.checks.network` (see there for the rules of
served objects).

``reduce_scatter(xs)`` and ``all_gather(shards)`` behave like the student's exercises 1
and 2 (lists of per-rank arrays), ``op(x)`` is a token-wise layer. Each records what it
was given. In substituted cases the collectives add a secret offset to what they
deliver, so only an answer that runs ``op`` on what ``reduce_scatter`` delivered, and
returns what ``all_gather`` delivered, gets the target; :meth:`ServedSP.problem` names
the first rule of the method an answer broke.
"""
from __future__ import annotations

import os

import numpy as np

from . import mistakes
from .returns import same_process
from .served_attention import numeric_array, plural, same_values

__all__ = ["ServedSP"]


def _layer_norm(x):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)


class _Fn:
    """A served callable with a name (what the student sees in a traceback)."""

    def __init__(self, name, fn):
        self.__name__, self._fn = name, fn
        self._pid = os.getpid()

    def __call__(self, *args, **kwargs):
        same_process(self._pid, self.__name__)          # not from a pool worker
        return self._fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<the check's {self.__name__}>"


class ServedSP:
    """The served ``reduce_scatter``, ``op`` and ``all_gather`` of one case of
    ``check_sp_forward``: ``partials`` are the t ``(s, h)`` arrays, ``scale`` the op's
    per-column scale, ``rng`` (or None) draws the offsets of a substituted case."""

    def __init__(self, partials, scale, rng=None):
        self.partials = [np.asarray(p) for p in partials]
        self.t, (self.s, self.h) = len(partials), self.partials[0].shape
        self.c = self.s // self.t
        self.scale = scale
        shape = (self.c, self.h)
        self.rs_off = None if rng is None else [rng.standard_normal(shape) for _ in range(self.t)]
        self.ag_off = None if rng is None else [rng.standard_normal((self.s, self.h))
                                                for _ in range(self.t)]
        self.rs_calls: list = []       # what reduce_scatter was given, per call
        self.op_calls: list = []       # (input, output) of every op call
        self.ag_calls: list = []
        self.delivered = self._rs(self.partials)
        self.reduce_scatter = _Fn("reduce_scatter", self._reduce_scatter)
        self.all_gather = _Fn("all_gather", self._all_gather)
        self.op = _Fn("op", self._op)

    # ------------------------------------------------------------------ the served calls
    def _rs(self, xs):
        total = np.sum([np.asarray(x) for x in xs], axis=0)
        c = total.shape[0] // len(xs)
        out = [total[i * c:(i + 1) * c] for i in range(len(xs))]
        if self.rs_off is not None and len(out) == self.t and out[0].shape == (self.c, self.h):
            out = [o + off for o, off in zip(out, self.rs_off)]
        return out

    def _arrays(self, xs, name):
        arrs = [numeric_array(x) for x in xs] if isinstance(xs, (list, tuple)) else None
        if not arrs or any(a is None or a.ndim != 2 for a in arrs):
            raise TypeError(f"{name} takes a list with one 2-D array per rank")
        return arrs

    def _reduce_scatter(self, xs):
        arrs = self._arrays(xs, "reduce_scatter")
        self.rs_calls.append(arrs)
        if len(arrs) != self.t or any(a.shape != (self.s, self.h) for a in arrs):
            raise ValueError(f"reduce_scatter takes the t = {self.t} partials, each of shape "
                             f"{(self.s, self.h)}")
        return [x.copy() for x in self._rs(arrs)]

    def _op(self, x):
        arr = np.asarray(x, dtype=float)
        y = np.tanh(_layer_norm(arr) * self.scale + 0.1)
        self.op_calls.append((np.array(x), y.copy()))
        return y

    def _all_gather(self, shards):
        arrs = self._arrays(shards, "all_gather")
        self.ag_calls.append(arrs)
        full = np.concatenate(arrs, axis=0)
        if self.ag_off is not None and full.shape == (self.s, self.h) and len(arrs) == self.t:
            return [full + off for off in self.ag_off]
        return [full.copy() for _ in arrs]

    # ------------------------------------------------------------------ what is expected
    def full(self):
        """``op`` of the all-reduced partials: what every rank holds without substitution."""
        total = np.sum([p.astype(float) for p in self.partials], axis=0)
        return np.tanh(_layer_norm(total) * self.scale + 0.1)

    def target(self):
        """What an honest SP returns here: all_gather of op on the delivered shards."""
        full = np.concatenate([self._op_value(d) for d in self.delivered])
        if self.ag_off is None:
            return [full] * self.t
        return [full + off for off in self.ag_off]

    def _op_value(self, x):
        return np.tanh(_layer_norm(np.asarray(x, dtype=float)) * self.scale + 0.1)

    def problem(self):
        """``(what, hint)`` for the first rule of SP the answer broke, or None."""
        t = self.t
        if self.rs_calls and (len(self.rs_calls) > 1 or not all(
                same_values(a, p) for a, p in zip(self.rs_calls[0], self.partials))):
            return self._rs_problem()
        shapes = self._op_shapes()
        if shapes:
            return shapes
        if not self.rs_calls:
            return ("your sp_forward never called the reduce_scatter it was given",
                    "the layer's partial sums reach a rank only through the reduce_scatter "
                    "passed in: use that argument, not a sum of your own")
        found = self._op_problem()
        if found:
            return found
        if len(self.ag_calls) != 1:
            return (f"all_gather was called {plural(len(self.ag_calls), 'time')}; SP needs it once",
                    "one all-gather, of the t outputs of op, gives every rank all s tokens")
        want = [self._op_value(d) for d in self.delivered]
        if len(self.ag_calls[0]) != t or not all(np.array_equal(a, y) for a, y in
                                                 zip(self.ag_calls[0], want)):
            return ("all_gather got other arrays than what op returned for ranks 0, 1, ... in "
                    "that order", "gather what op returned on each rank, in rank order, unchanged")
        return None

    def _rs_problem(self):
        n = len(self.rs_calls)
        if n > 1:
            return (f"reduce_scatter was called {plural(n, 'time')}; SP needs it once, on the "
                    f"partials",
                    "one reduce-scatter sums the t partials and leaves each rank its block")
        ops = [self._op_value(p) for p in self.partials]
        if all(a.shape == o.shape and np.allclose(a, o) for a, o in zip(self.rs_calls[0], ops)):
            return ("reduce_scatter got op of each partial, not the partials",
                    "op is not linear, so op(P_0) + op(P_1) is not op(P_0 + P_1): reduce first, "
                    "then run op")
        return ("reduce_scatter got other arrays than the t partials",
                "pass the partials on to reduce_scatter as you got them")

    def _op_shapes(self):
        t, c, h = self.t, self.c, self.h
        calls = [x.shape for x, _ in self.op_calls]
        if not calls:
            return ("op was never called", "each rank applies op to its own s/t tokens")
        wrong = [sh for sh in calls if len(sh) != 2 or sh[0] != c]
        if wrong:
            return (f"op was called on an array of shape {wrong[0]}; under SP each rank runs it "
                    f"on its own s/t = {plural(c, 'token')}, shape ({c}, {h})",
                    mistakes.sp_op_calls_mistake(wrong[0], t * c, c))
        return None

    def _op_problem(self):
        t = self.t
        calls = [x.shape for x, _ in self.op_calls]
        if len(calls) != t:
            return (f"op was called {plural(len(calls), 'time')}, expected once per rank ({t})",
                    "one call per rank, on that rank's shard")
        left = list(range(t))                 # ranks whose shard op has not seen yet
        for i, (x, _) in enumerate(self.op_calls):
            r = next((r for r in left if same_values(x, np.asarray(self.delivered[r]))), None)
            if r is None:
                if any(same_values(x, np.asarray(e)) for e in self.delivered):
                    return (f"op call {i} got a shard it had already been given",
                            "call op once per rank, on that rank's shard")
                return (f"op call {i} got rows that are not a shard reduce_scatter delivered"
                        + (" (here it delivers other values than a sum of your own gives)"
                           if self.rs_off is not None else ""),
                        "a rank holds only what reduce_scatter delivered to it: run op on that "
                        "shard, not on rows of a sum you formed yourself")
            left.remove(r)
        return None
