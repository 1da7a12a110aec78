"""The attention kernel a Ulysses check serves (:class:`ServedAttention`), and the two value
tests every served object applies to what comes in (:func:`same_values`,
:func:`numeric_array`). Part of :mod:`lesson10.checks.network`, which re-exports it; see
there for the rules of served objects.
"""
from __future__ import annotations

import numpy as np

__all__ = ["ServedAttention", "same_values", "numeric_array", "plural"]


def same_values(x: np.ndarray, y: np.ndarray) -> bool:
    """Equal by value: same shape and the same numbers (any real dtype)."""
    return x.dtype.kind in "biuf" and x.shape == y.shape and bool(np.array_equal(x, y))


def plural(n: int, word: str, many: str = "") -> str:
    """``"1 head"``, ``"3 heads"`` (``many``: the plural when it is not ``word + "s"``)."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def numeric_array(x):
    """``x`` as a numeric array, or None (objects, text, ragged lists)."""
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError):
        return None
    return arr if arr.dtype.kind in "biuf" else None



# --------------------------------------------------------------------------- the kernel
class ServedAttention:
    """The attention kernel of ``check_ulysses_attention``, with the signature of
    ``lesson10.sim.attention``: ``(q, k, v, causal=False, q_pos=None, k_pos=None) ->
    (out, lse)``.

    It serves only one rank's head group at a time: ``q`` must be head group j of Q as the
    all-to-all delivered it (``qh[j]``, shape ``(s, a/N_c, d)``, rows in seq_to_heads'
    stacking order), ``k`` and ``v`` the matching K/V head group (``(s, a_kv/N_c, d)``,
    GQA); each head group once, N_c calls in all (:meth:`_finish`). ``q_real`` etc. are the
    head groups as the inputs hold them (to name a substitution that was bypassed);
    ``offsets[j]`` (or None) is added to the ``out`` of head group j (the substitution).
    """

    __name__ = "attention"

    def __init__(self, referee, shapes, qh, kh, vh, q_real, k_real, v_real, offsets=None):
        self._ref = referee
        self._s, self._a, self._a_kv, self._d = shapes
        self._qh, self._kh, self._vh = qh, kh, vh
        self._real = {"q": q_real, "k": k_real, "v": v_real}
        self._offsets = offsets
        self._returned: dict[int, np.ndarray] = {}     # head group -> the out it returned

    def __repr__(self) -> str:
        return "<the check's attention kernel: one head group per call>"

    def _group_of(self, x, groups):
        return next((j for j, g in enumerate(groups) if same_values(x, g)), None)

    def __call__(self, q, k, v, causal=False, q_pos=None, k_pos=None):
        from ..sim.attention import attention
        ref = self._ref
        ref.guard("attention kernel")
        n, a, a_kv = len(self._qh), self._a, self._a_kv
        q, k, v = (numeric_array(x) for x in (q, k, v))
        if q is None or k is None or v is None:
            ref.breach("attention got something that is not an array of numbers",
                       "pass NumPy arrays q, k, v")
        j = self._group_of(q, self._qh)
        if j is None:
            self._explain_q(q)
        if j in self._returned:
            ref.breach(f"attention ran on head group {j} a second time",
                       "N_c calls, one per head group: rank j attends on its own head group once")
        for name, x, groups in (("k", k, self._kh), ("v", v, self._vh)):
            if not same_values(x, groups[j]):
                jj = self._group_of(x, groups)
                want = f"{name.upper()} head group {j}, shape {groups[j].shape}"
                if jj is not None:
                    what = f"attention got Q head group {j} with {name.upper()} head group {jj}"
                elif x.shape[1:2] == (a // n,) and a_kv < a:
                    what = (f"{name} has {plural(x.shape[1], 'head')}, as many as the query head "
                            f"group: K/V have a_kv = {a_kv} heads (GQA), so rank {j} holds {want}")
                else:
                    what = f"{name} (shape {x.shape}) is not {want} as all_to_all delivered it"
                ref.breach(what, "pass kh[j] and vh[j] as your seq_to_heads returned them, with "
                                 "qh[j]; attention maps query head i to K/V head i // g itself (no "
                                 "np.repeat or np.tile of K/V heads)")
        out, lse = attention(q, k, v, causal=causal, q_pos=q_pos, k_pos=k_pos)
        if self._offsets is not None:
            out = out + self._offsets[j]
        self._returned[j] = out.copy()
        return out, lse

    def _explain_q(self, q):
        ref, n, s, a, d = self._ref, len(self._qh), self._s, self._a, self._d
        c, g = s // n, a // n
        hint = ("after seq_to_heads rank j holds all s tokens of its head group, and that is what "
                "its one call of the kernel attends on")
        if q.shape[:2] == (s, a) and n > 1:
            ref.breach(f"attention was called on q of shape {q.shape}, all {a} heads of the whole "
                       f"sequence: in Ulysses each rank j attends only on its head group, shape "
                       f"{(s, g, d)}", hint)
        if q.shape[:2] == (c, a) and n > 1:
            ref.breach(f"attention was called on q of shape {q.shape}, one rank's {plural(c, 'token')} with all "
                       f"heads: that is attention before the all-to-all, which sees only the rank's "
                       f"own keys; rank j must attend on head group j, shape {(s, g, d)}", hint)
        if q.shape == (s, g, d):
            j = self._group_of(q, self._real["q"])
            if j is not None:
                ref.breach(f"attention got head group {j} of Q as q_shards hold it, not as all_to_all "
                           f"delivered it (in this case the network delivers other values)",
                           "rank j holds only what seq_to_heads received for it: pass qh[j] as your "
                           "seq_to_heads returned it, with the group argument")
            rows = {row.tobytes() for row in q.astype(float).reshape(s, -1)}
            for j, grp in enumerate(self._qh):
                if rows == {row.tobytes() for row in grp.reshape(s, -1)}:
                    ref.breach(f"q holds the tokens of head group {j} in another order than "
                               f"seq_to_heads stacks them",
                               "pass the head group as seq_to_heads returned it (rank 0's tokens "
                               "first) with the positions of its rows in that same order: the "
                               "mask compares positions, so the rows need no sorting")
        heads = f"heads {g} j .. {g} j + {g - 1}" if g > 1 else "head j"
        ref.breach(f"q (shape {q.shape}) is not the head group of any rank as all_to_all delivered "
                   f"it: rank j's q is {heads} of all {s} tokens, shape {(s, g, d)}", hint)

    def _output_blocks(self):
        """What rank j must send to rank i in the output all-to-all: token block i of the
        output of head group j (None until every head group has its output)."""
        n = len(self._qh)
        if len(self._returned) < n:
            return None
        c = self._s // n
        return [[self._returned[j][i * c:(i + 1) * c] for i in range(n)] for j in range(n)]

    def _finish(self) -> None:
        ref, n = self._ref, len(self._qh)
        ref.verdict()
        if len(self._returned) < n:
            done = sorted(self._returned)
            ref.fail(f"attention ran on head groups {done} only" if done else
                     "your ulysses_attention never called the attention it was given",
                     f"Ulysses attends on every head group: N_c = {plural(n, 'call')} of the "
                     f"attention passed in, one per rank, on that rank's head group")

    def _target(self, causal: bool, pos):
        """What an honest Ulysses computes here, one ``(c, a, d)`` array per rank."""
        from ..sim.attention import attention
        n = len(self._qh)
        c = self._s // n
        outs = []
        for j in range(n):
            o = attention(self._qh[j], self._kh[j], self._vh[j], causal=causal, q_pos=pos, k_pos=pos)[0]
            outs.append(o if self._offsets is None else o + self._offsets[j])
        return [np.concatenate([o[r * c:(r + 1) * c] for o in outs], axis=1) for r in range(n)]
