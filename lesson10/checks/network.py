"""What an exercise may use from the course, served by its check so that the method shows:
the ring's network (:class:`RingNetwork`) with its block kernel and merge
(:class:`ServedBlockAttention`, :class:`ServedMerge`), the all-to-all network
(:class:`AllToAllNetwork`) and the attention kernel of Ulysses (:class:`ServedAttention`).

The student's function gets these objects as arguments (``group=``, ``attention=``). Each
one applies the rules of its exercise as the calls come in; the first rule broken is kept
by the case's :class:`Referee`, and the check fails with it after the call, also when the
student's code caught the :class:`RuleBroken` the object raised.

The same objects serve the check cell, where the student's function calls them directly,
and the grader's judge, where the student's code runs in another process: a network
travels there as stubs of its ``__wire_methods__`` that call back into the object here, a
kernel as a callable stub. So every bit of state stays here, and what comes in is
recognised by value (``np.array_equal``), never by identity: the other side works on
copies. Everything handed out is a fresh copy, so whatever the student's side does to it
changes nothing here.

**Substitution.** In designated cases (random ones, never the fixed edge cases) a network
delivers other values than the sender holds (fresh random K/V blocks, head groups, token
blocks) and the kernel adds a secret offset to its output. The target of such a case is
what an honest method computes from what it was served, so an honest answer never notices;
one that reads the other ranks' inputs directly, or computes what it should have been
served, gets another result.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import Lesson10Error
from .core import CheckFailed, describe_value, fail_check, failure_message
from .returns import same_process
from .served_attention import ServedAttention, plural
from .served_attention import numeric_array as _array
from .served_attention import same_values as _same
from .served_ring import ServedBlockAttention, ServedMerge

__all__ = ["RuleBroken", "Referee", "RingNetwork", "AllToAllNetwork", "Send", "ServedAttention",
           "ServedBlockAttention", "ServedMerge", "plural", "substitute_blocks", "substituted", "served_call", "tokens"]


class RuleBroken(Lesson10Error, RuntimeError):
    """Raised by a served object when the student's code breaks a rule of the exercise."""


class Referee:
    """The verdict of one case: which exercise, where (the case in words), and the first
    rule broken (``problem``, the full failure text, or None)."""

    def __init__(self, exercise: str, where: str):
        self.exercise, self.where = exercise, where
        self.problem: str | None = None
        self._pid = os.getpid()

    def guard(self, what: str = "served function") -> None:
        """Called at the start of every served call: once a rule is broken, every later
        call raises the same problem (so the code cannot carry on as if nothing happened).
        A call from another process (a pool worker) is refused (:func:`.returns.same_process`)."""
        same_process(self._pid, what)
        if self.problem is not None:
            raise RuleBroken(self.problem)

    def breach(self, what: str, hint: str):
        """Record the problem (the first one wins) and raise it into the student's code."""
        if self.problem is None:
            self.problem = failure_message(self.exercise, self.where, what, hint=hint, show=False)
        raise RuleBroken(self.problem)

    def verdict(self) -> None:
        """CheckFailed with the recorded problem, if any (called after the student's call)."""
        if self.problem is not None:
            raise CheckFailed(self.problem)

    def fail(self, what: str, hint: str):
        fail_check(self.exercise, self.where, what, show=False, hint=hint)


class _Served:
    """Base of the networks: only the names in ``__wire_methods__`` are public, as on the
    grader's side, where nothing else of the object exists; the check's own methods
    (``_finish``, ``_target``) start with an underscore."""

    __wire_methods__: tuple = ()

    _offer = ""

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        raise AttributeError(f"the check's network offers only {' and '.join(self.__wire_methods__)}"
                             f"(...), no {name!r}: {self._offer}")

    def __repr__(self) -> str:
        return f"<the check's network: {', '.join(self.__wire_methods__)} only>"


def tokens(c: int) -> str:
    """``"1 token"``, ``"3 tokens"``."""
    return plural(c, "token")


def _ordinal(i: int) -> str:
    return f"{i}{'th' if 10 <= i % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(i % 10, 'th')}"


def substituted(rng, n_random: int) -> set:
    """Which of the ``n_random`` random cases of a batch substitute: at least two, never all."""
    return set(rng.permutation(n_random)[:int(rng.integers(2, n_random))].tolist())


def substitute_blocks(rng, blocks):
    """The ``N x N`` matrix ``blocks`` with every block that crosses the network (``i != j``)
    replaced by fresh random values of the same shape; the block a rank keeps stays."""
    n = len(blocks)
    return [[blocks[i][j] if i == j else rng.standard_normal(np.shape(blocks[i][j]))
             for j in range(n)] for i in range(n)]


# --------------------------------------------------------------------------- the ring
_KINDS = ("K", "V", "positions")
_SHIFT_HINT = ("what ring_shift returns to a rank is the block it holds from then on, and the one "
               "it passes on in the next step (K, V and their positions may travel together as "
               "one tuple per rank, or in separate calls)")


def _entry(entry):
    """The arrays of one rank's entry of ring_shift, and how to box what arrives: an array
    (box None), or a tuple/list of arrays (box tuple/list)."""
    if isinstance(entry, (tuple, list)):
        arrs = [_array(x) for x in entry]
        if arrs and all(a is not None and a.ndim >= 1 for a in arrs):
            return arrs, type(entry)
    arr = _array(entry)
    return ([] if arr is None else [arr]), None


class RingNetwork(_Served):
    """The network of ``check_ring_attention``: ``ring_shift(xs)`` only, with SimGroup's
    semantics (rank r sends ``xs[r]`` to rank r + 1; ``out[r]`` is what rank r received from
    rank r - 1), where ``xs[r]`` is an array or a tuple/list of arrays.

    Rules, checked at every call: one entry per rank; every array sent is the K block, the V
    block or the positions of some rank; at most one block of each kind per rank and call
    (more is gathering); every rank sends the same kinds in a call; in step t (its t-th
    shift of that kind, from 0) rank r passes on the block it holds, that of rank
    (r - t) mod N_c, with the values it received, and only after the served block kernel
    (``_kernel``, a :class:`ServedBlockAttention`, when the case has one) ran on that block;
    at most N_c - 1 steps. After the call (:meth:`_finish`): N_c - 1 steps of K and of V.

    ``fake_k`` / ``fake_v`` (one array per rank, or None): what the network delivers in place
    of each rank's K and V block when they reach another rank (the substitution).
    """

    __wire_methods__ = ("ring_shift",)
    _offer = "a ring moves its blocks with ring_shift alone, one step at a time"

    def __init__(self, referee: Referee, k_shards, v_shards, positions, fake_k=None, fake_v=None):
        n = len(k_shards)
        self._ref, self._n = referee, n
        self._real = {"K": [np.array(x, dtype=float) for x in k_shards],
                      "V": [np.array(x, dtype=float) for x in v_shards],
                      "positions": [np.array(p) for p in positions]}
        self._deliv = {"K": self._real["K"] if fake_k is None else [np.array(x, dtype=float) for x in fake_k],
                       "V": self._real["V"] if fake_v is None else [np.array(x, dtype=float) for x in fake_v],
                       "positions": self._real["positions"]}
        self._holds = {kind: list(range(n)) for kind in _KINDS}          # whose block rank r holds
        self._value = {kind: list(self._real[kind]) for kind in _KINDS}  # the values it holds
        self._steps = {kind: [0] * n for kind in _KINDS}                 # shifts rank r made
        self._calls = 0
        self._substituted = fake_k is not None
        self._kernel = None        # the served block kernel, when the case has one (served_ring)

    def _classify(self, a):
        """(kind, rank) of the block ``a`` is, by value, or None."""
        for kind in _KINDS:
            for j in range(self._n):
                if _same(a, self._real[kind][j]) or _same(a, self._deliv[kind][j]):
                    return kind, j
        return None

    def ring_shift(self, xs):
        """``xs[r]``: what rank r sends to rank r + 1 (an array, or a tuple/list of arrays such
        as ``(k, v, k_pos)``). Returns ``out`` with ``out[r]`` what rank r received."""
        ref, n = self._ref, self._n
        ref.guard("ring_shift")
        self._calls += 1
        call = f"in call {self._calls} of ring_shift"
        if not isinstance(xs, (list, tuple)) or len(xs) != n:
            ref.breach(f"ring_shift got {describe_value(xs)}; it takes a list with one entry per rank "
                       f"(N_c = {n}): entry r is what rank r sends to rank r + 1", _SHIFT_HINT)
        sent = []
        for r, entry in enumerate(xs):
            arrs, box = _entry(entry)
            if not arrs:
                ref.breach(f"{call}, rank {r} sent {describe_value(entry)}: send arrays (the K block, "
                           f"the V block, or a tuple of them with the positions)", _SHIFT_HINT)
            found = []
            for a in arrs:
                kind = self._classify(a)
                if kind is None:
                    ref.breach(f"{call}, rank {r} sent an array of shape {a.shape} that is none of "
                               f"the K, V or positions blocks: ring_shift is for passing the K/V "
                               f"blocks (and, if you like, their positions) to the next rank",
                               "send the blocks as they arrived, not stacked, cast or sliced; what a "
                               "rank computes (its out and lse) stays on that rank")
                found.append((kind[0], kind[1], a))
            for kind in _KINDS:
                js = [j for kd, j, _ in found if kd == kind]
                if len(js) > 1:
                    ref.breach(f"{call}, rank {r} sent {len(js)} {kind} blocks at once (those of "
                               f"ranks {js}): a ring moves one block of each kind per rank and step",
                               "sending several blocks at once is gathering them (an all-gather): "
                               "a rank would hold N_c blocks and its memory would grow with N_c. "
                               "Send only the block the rank holds now")
            sent.append((found, box))
        kinds = [sorted(kd for kd, _, _ in found) for found, _ in sent]
        for r in range(n):
            if kinds[r] != kinds[0]:
                ref.breach(f"{call}, rank 0 sent {'+'.join(kinds[0])} but rank {r} sent "
                           f"{'+'.join(kinds[r])}", "in one call every rank sends the same kind of "
                           "block: every rank its K block, or every rank its (K, V, positions)")
        for r, (found, _) in enumerate(sent):
            for kind, j, a in found:
                self._rule_step(call, r, kind, j, a)
        return self._deliver(sent)

    def _rule_step(self, call, r, kind, j, a):
        """Rank r sends the ``kind`` block of rank j (array ``a``) in its next step: it must be
        the block it holds, with the values it holds, within N_c - 1 steps."""
        ref, n = self._ref, self._n
        t = self._steps[kind][r]
        if t >= n - 1:
            ref.breach(f"{call}, rank {r} sends a {kind} block for the {_ordinal(t + 1)} time, but "
                       f"N_c - 1 = {plural(n - 1, 'step')} already brought every {kind} block to every rank: "
                       f"the block it would receive now is its own, used in round 0, so it is "
                       f"never used",
                       "N_c rounds of attention need N_c - 1 shifts: no shift after the last "
                       "round")
        kernel = self._kernel
        if kernel is not None and not kernel.ready(r, t):
            ref.breach(f"{call}, step {t} of the {kind} blocks: rank {r} passes on the block of "
                       f"round {t} before attending to it (block_attention has not run on it)",
                       "each round: a rank calls the block_attention it was given on the block it "
                       "holds, merges, and only then passes the block on")
        h = self._holds[kind][r]
        if j != h:
            holds = f"rank {h}'s" + (" (its own)" if h == r else f", received in step {t - 1}")
            ref.breach(f"{call}, step {t} of the {kind} blocks: rank {r} sent the {kind} block of "
                       f"rank {j}, but the block it holds is {holds}",
                       "in step t rank r passes on the block it holds: the one it received in "
                       "step t - 1 (in step 0 its own), that of rank (r - t) mod N_c. " + _SHIFT_HINT)
        if not _same(a, self._value[kind][r]):
            name = {"K": "k_shards", "V": "v_shards", "positions": "positions"}[kind]
            ref.breach(f"{call}, step {t}: rank {r} sent the {kind} block of rank {j} as "
                       f"{name}[{j}] holds it, not the copy it received over the ring (in this "
                       f"case the network delivers other values for the blocks of other ranks)",
                       "a rank may read only its own k_shards[r] and v_shards[r]; every other "
                       "block reaches it through ring_shift. " + _SHIFT_HINT)

    def _deliver(self, sent):
        """Move every block one rank on; returns what each rank receives (fresh copies)."""
        n = self._n
        out = [None] * n
        holds = {kind: list(v) for kind, v in self._holds.items()}
        for r, (found, box) in enumerate(sent):
            dst = (r + 1) % n
            arrs = []
            for kind, j, _ in found:
                val = self._deliv[kind][j] if j != dst else self._real[kind][j]
                arrs.append(val.copy())
                holds[kind][dst] = j
                self._value[kind][dst] = val
                self._steps[kind][r] += 1
            out[dst] = arrs[0] if box is None else box(arrs)
        self._holds = holds
        return out

    def _finish(self) -> None:
        """After the call: a broken rule, or too few steps of K or V."""
        ref, n = self._ref, self._n
        ref.verdict()
        if n > 1 and self._calls == 0:
            ref.fail("your ring_attention never called group.ring_shift: the K/V blocks of the other "
                     "ranks reach a rank only through the network",
                     "the other ranks' K/V blocks reach a rank only through group.ring_shift: "
                     "how many steps does every block need to meet every rank?")
        for kind in ("K", "V"):
            m = self._steps[kind][0]
            if m < n - 1:
                missing = [(0 - t) % n for t in range(m + 1, n)]
                ref.fail(f"the {kind} blocks moved {plural(m, 'time')}, N_c - 1 = {n - 1} "
                         f"{'is' if n == 2 else 'are'} needed: rank 0 "
                         f"never received the {kind} blocks of ranks {missing}",
                         "a rank's queries must meet every K/V block, and the other ranks' blocks "
                         "reach it only through ring_shift: one shift of K and of V after every "
                         "round but the last")


# --------------------------------------------------------------------------- the all-to-all
@dataclass
class Send:
    """One all-to-all an exercise expects. ``expected[i][j]``: what rank i must send to rank
    j; ``delivered[i][j]``: what rank j gets from rank i (the same, or substituted). Either
    may be a function returning the matrix (None while it is not known yet). ``block(i, j)``
    says in words what ``blocks[i][j]`` must be; ``missing`` is the (what, hint) when the
    send never happens."""
    name: str
    expected: object
    delivered: object
    block: object
    missing: tuple = ("", "")
    done: bool = field(default=False)

    def matrix(self, which: str):
        m = getattr(self, which)
        return m() if callable(m) else m


class AllToAllNetwork(_Served):
    """The network of the Ulysses checks: ``all_to_all(blocks)`` only, with SimGroup's
    semantics (``blocks[i][j]`` goes from rank i to rank j; returns ``out`` with
    ``out[j][i]``, what rank j received from rank i).

    Every call must be one of the expected :class:`Send` s, recognised by value, each at most
    once; calls beyond their number, or blocks that are none of them, break the rule.
    ``refuse`` (what, hint): every call breaks the rule (a case that must raise instead).
    ``never`` (what, hint): the failure when the function never calls all_to_all.
    """

    __wire_methods__ = ("all_to_all",)
    _offer = "Ulysses moves its data with all_to_all alone"

    def __init__(self, referee: Referee, n: int, sends, never=("", ""), refuse=None, purpose=""):
        self._ref, self._n, self._sends = referee, n, list(sends)
        self._never, self._refuse, self._purpose = never, refuse, purpose
        self._calls = 0

    def all_to_all(self, blocks):
        """``blocks[i][j]``: the array rank i sends to rank j. Returns ``out`` with
        ``out[j][i]`` the block rank j received from rank i (fresh copies)."""
        ref, n = self._ref, self._n
        ref.guard("all_to_all")
        self._calls += 1
        if self._refuse is not None:
            ref.breach(*self._refuse)
        if not isinstance(blocks, (list, tuple)) or len(blocks) != n or any(
                not isinstance(row, (list, tuple)) or len(row) != n for row in blocks):
            ref.breach(f"all_to_all got {describe_value(blocks)}; it takes an N_c x N_c nested list "
                       f"(N_c = {n}): blocks[i][j] is the array rank i sends to rank j",
                       "blocks is a list with one entry per sending rank, each a list of N_c "
                       "arrays, one per receiving rank")
        arrs = [[_array(b) for b in row] for row in blocks]
        for i in range(n):
            for j in range(n):
                if arrs[i][j] is None:
                    ref.breach(f"all_to_all: blocks[{i}][{j}] is {describe_value(blocks[i][j])}, not an "
                               f"array of numbers", "every block is a NumPy array")
        if self._calls > len(self._sends):
            ref.breach(f"all_to_all was called {plural(self._calls, 'time')}; {self._purpose} needs "
                       f"exactly {len(self._sends)}",
                       "one all-to-all moves every block of one tensor at once: every rank sends "
                       "one block to every rank in the same call")
        for send in self._sends:
            exp = send.matrix("expected")
            if not send.done and exp is not None and self._matches(arrs, exp):
                send.done = True
                dlv = send.matrix("delivered")
                return [[np.array(dlv[i][j], dtype=float) for i in range(n)] for j in range(n)]
        self._explain(arrs)

    @staticmethod
    def _matches(arrs, exp) -> bool:
        return all(_same(a, e) for row_a, row_e in zip(arrs, exp) for a, e in zip(row_a, row_e))

    def _explain(self, arrs):
        """The blocks are none of the expected sends: say what is wrong, as precisely as the
        candidates allow."""
        ref, n = self._ref, self._n
        for send in self._sends:
            exp = send.matrix("expected")
            if send.done and exp is not None and self._matches(arrs, exp):
                ref.breach(f"{send.name} went through all_to_all a second time",
                           "one all-to-all per tensor: it moves every block of that tensor at once")
        open_ = [(send, send.matrix("expected")) for send in self._sends if not send.done]
        fits = [(send, exp) for send, exp in open_ if exp is not None and all(
            a.shape == e.shape for row_a, row_e in zip(arrs, exp) for a, e in zip(row_a, row_e))]
        if len(self._sends) == 1 or len(fits) == 1:
            send, exp = (self._sends[0], self._sends[0].matrix("expected")) if len(self._sends) == 1 \
                else fits[0]
            for i in range(n):
                for j in range(n):
                    a, e = arrs[i][j], exp[i][j]
                    if not _same(a, e):
                        got = f"has shape {a.shape}" if a.shape != e.shape else "holds other values"
                        ref.breach(f"blocks[{i}][{j}] of all_to_all call {self._calls}, what rank {i} "
                                   f"sends to rank {j}, {got}: it should be {send.block(i, j)}"
                                   + (f" ({send.name})" if len(self._sends) > 1 else ""),
                                   send.missing[1])
        i, j = (0, 1) if n > 1 else (0, 0)
        options: dict[str, list] = {}
        for send, _ in open_:
            options.setdefault(send.block(i, j), []).append(send.name.split(" (")[0])
        listed = "; ".join(f"{', '.join(names)}: {text}" for text, names in options.items())
        ref.breach(f"all_to_all call {self._calls} carries none of the blocks {self._purpose} sends "
                   f"now: its blocks[{i}][{j}] (what rank {i} sends to rank {j}, shape "
                   f"{arrs[i][j].shape}) should be, for {listed}",
                   "only four tensors cross the network, each once and through your own "
                   "seq_to_heads or heads_to_seq: Q, K and V on the way in, and what the kernel "
                   "returned on the way out")

    def _finish(self) -> None:
        """After the call: a broken rule, or an expected all-to-all that never happened."""
        ref = self._ref
        ref.verdict()
        if self._refuse is not None:
            return
        if self._calls == 0:
            ref.fail(*self._never)
        for send in self._sends:
            if not send.done:
                ref.fail(*send.missing)


# --------------------------------------------------------------------------- calling
def served_call(referee: Referee, exercise: str, fn, names, *args, calls: str = "", **kwargs):
    """Call the student's function (``core.run_student``: errors and changed inputs are reported)
    with the served objects among its arguments. A rule broken during the call wins over
    whatever the call raised or returned: it is the real cause. ``calls`` names how the
    check calls the function, for a TypeError about its arguments (a signature without the
    ``group`` argument, for example)."""
    from .core import StudentError, run_student
    try:
        return run_student(exercise, fn, names, *args, **kwargs)
    except (StudentError, CheckFailed) as exc:
        referee.verdict()
        cause = exc.__cause__
        if isinstance(exc, StudentError) and isinstance(cause, TypeError) and calls \
                and "argument" in str(cause):
            lines = [line for line in str(exc).splitlines() if not line.startswith("hint:")]
            raise StudentError("\n".join(lines + [f"hint: the check calls it as {calls}: give your "
                                                    f"function that signature"])) from cause
        raise
