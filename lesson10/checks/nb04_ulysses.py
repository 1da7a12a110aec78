"""Checks of notebook 04: Ulysses."""
from __future__ import annotations

import numpy as np

from . import mistakes
from .core import (
    Cases,
    CheckFailed,
    StudentError,
    close_number,
    compare_shards,
    fail_check,
    log_int,
    register_exercise,
    run_student,
)
from .nb02_ring_attention import diagnose, diagnose_plain, draw_qkv, mask_mistakes
from .network import (
    AllToAllNetwork,
    Referee,
    Send,
    ServedAttention,
    served_call,
    substitute_blocks,
    substituted,
    tokens,
)
from .parts import in_part

NB04 = "04_ulysses"


# (N_c, c tokens per rank, a heads, integer data): N_c = 1, c = 1, a/N_c = 1, c > 1 and a/N_c > 1
_FIXED_A2A = [(1, 3, 2, False), (2, 1, 2, False), (2, 2, 4, False), (3, 2, 6, False),
              (4, 1, 8, False), (2, 3, 2, True), (4, 2, 4, False)]


def _a2a_cases(rng, n_random=6):
    """(where, N_c, x, substitute): the fixed cases, then random ones; in at least two
    random cases the network delivers other values for the blocks that cross it."""
    cases = [case + (False,) for case in _FIXED_A2A]
    swapped = substituted(rng, n_random)
    for i in range(n_random):
        n = int(rng.integers(2, 5))
        cases.append((n, int(rng.integers(1, 4)), n * int(rng.integers(1, 4)), False, i in swapped))
    out = []
    for n, c, a, integer, swap in cases:
        d = int(rng.integers(1, 4))
        shape = (n * c, a, d)
        x = rng.integers(-50, 50, size=shape) if integer else rng.standard_normal(shape)
        out.append((f"N_c={n}, s={n * c}, a={a}, d={d}{', integer data' if integer else ''}"
                    + (", the network delivers other values for the blocks that cross it" if swap else ""),
                    n, x, swap))
    return out


def _is_value_error(exc) -> bool:
    """A ValueError (or a subclass); in the grader the student's exception arrives as a
    stand-in that carries only its type's name."""
    return isinstance(exc, ValueError) or type(exc).__name__ == "ValueError"


def _heads(g: int, j) -> str:
    """Heads of group j in words."""
    return f"head {j}" if g == 1 else f"heads {j * g}..{(j + 1) * g - 1}"


def _head_groups(shards, n):
    """blocks[i][j]: head group j of rank i's tokens (what rank i sends to rank j)."""
    return [np.split(np.asarray(x), n, axis=1) for x in shards]


def _head_group_send(name, shards, n, rng, swap):
    """The sequence -> heads all-to-all of one tensor (``shards[i]`` of shape (c, a, d))."""
    c, a, d = np.shape(shards[0])
    g = a // n
    expected = _head_groups(shards, n)
    delivered = substitute_blocks(rng, expected) if swap else expected
    return Send(name, expected, delivered,
                block=lambda i, j: f"{_heads(g, j)} of rank {i}'s {tokens(c)}, shape {(c, g, d)}",
                missing=(f"{name} never went through all_to_all",
                         "rank i owes every rank j one part of its shard (which heads does rank j "
                         "keep?), and all of those parts travel in one group.all_to_all"))


_S2H_CALL = "seq_to_heads(shards, group)"
_H2S_CALL = "heads_to_seq(shards, group)"


def _s2h_case(seq_to_heads, rng, where, n, x, swap) -> None:
    """One case of seq_to_heads: the served all-to-all, the call, the head shards."""
    shards = np.split(x, n, axis=0)
    referee = Referee("seq_to_heads", where)
    send = _head_group_send("the head groups", shards, n, rng, swap)
    net = AllToAllNetwork(referee, n, [send], purpose="seq_to_heads", never=(
        "your seq_to_heads never called group.all_to_all: rank j can get the head groups of "
        "the other ranks only through the network",
        "rank i sends head group j of its shard to rank j in one all_to_all; rank j keeps "
        "what it received"))
    out = served_call(referee, "seq_to_heads", seq_to_heads, ("shards",), shards, net,
                      calls=_S2H_CALL)
    net._finish()
    dlv = send.delivered
    target = [np.concatenate([np.asarray(dlv[i][j], dtype=float) for i in range(n)], axis=0)
              for j in range(n)]
    compare_shards("seq_to_heads", out, target, where=where,
                   what="head shard", axes=("token", "local head", "dim"), exact=True,
                   hint=lambda: mistakes.explain(mistakes.all_to_all_mistake(dlv, out, axis=0), (
                       "rank j returns the blocks it received from ranks 0, 1, ..., one after "
                       "the other along the token axis")))


@register_exercise("seq_to_heads", NB04, "all-to-all: sequence shards -> head shards",
                   withholds={
                       "lesson10.sim.ulysses.seq_to_heads": "seq_to_heads",
                       "lesson10.sim.ulysses._all_to_all_axes": None},
                   use_instead="split with NumPy and move the blocks with the group the check passes in")
def check_seq_to_heads(seq_to_heads, rng):
    """``seq_to_heads(shards, group) -> list``: ``shards[r]`` is ``(s/n, a, d)`` (tokens of
    rank r, every head); rank r must end with ``(s, a/n, d)``: every token, heads
    ``r a/n ..``. The check's ``group`` offers ``all_to_all(blocks)`` only and wants exactly
    one call; the answer is built from what each rank received (in some random cases the
    network delivers other values). When ``a`` is not a multiple of ``n`` it must raise a
    ValueError (not send, not return empty shards)."""
    cases, run = _a2a_cases(rng), Cases("seq_to_heads")
    for where, n, x, swap in cases:
        with run.case():        # a broken rule of the served network is that case's verdict
            _s2h_case(seq_to_heads, rng, where, n, x, swap)
    run.verdict()
    for n, a in ((4, 2), (2, 3)):
        shards = [rng.standard_normal((1, a, 2)) for _ in range(n)]
        where = f"N_c={n} ranks but a={a} heads"
        referee = Referee("seq_to_heads", where)
        net = AllToAllNetwork(referee, n, [], refuse=(
            f"{a} heads cannot be split into {n} equal groups, yet your function sent blocks to "
            f"all_to_all instead of raising an error",
            "the exercise asks for a ValueError when the heads do not split into N_c whole "
            "groups: raise it before anything is sent (np.split, for one, raises it itself)"))
        try:
            out = run_student("seq_to_heads", seq_to_heads, ("shards",), shards, net)
        except StudentError as exc:
            referee.verdict()
            cause = exc.__cause__
            if _is_value_error(cause):
                continue                   # it raised a ValueError: right
            fail_check("seq_to_heads", where, f"{a} heads cannot be split into {n} equal groups and "
                  f"your function raised {type(cause).__name__}: {cause}; the exercise asks for "
                  f"a ValueError", show=False,
                  hint="raise ValueError(...) yourself when a % n != 0 (an assert raises "
                       "AssertionError), or let np.split raise its ValueError")
        referee.verdict()
        shapes = [np.shape(o) for o in out] if isinstance(out, (list, tuple)) else np.shape(out)
        fail_check("seq_to_heads", where, f"{a} heads cannot be split into {n} equal groups, yet your "
              f"function returned (shapes {shapes}) instead of raising an error", show=False,
              hint="slicing by a // N_c heads quietly makes short or empty groups: the exercise "
                   "asks for a ValueError when a is not a multiple of N_c")
    return (f"{len(cases)} cases: one all-to-all of head groups, rank r holds all tokens of heads "
            f"r a/n .. (r+1) a/n - 1; a % n != 0 raises a ValueError")


@register_exercise("heads_to_seq", NB04, "all-to-all: head shards -> sequence shards",
                   withholds={
                       "lesson10.sim.ulysses.heads_to_seq": "heads_to_seq"},
                   use_instead="split with NumPy and move the blocks with the group the check passes in")
def check_heads_to_seq(heads_to_seq, rng):
    """``heads_to_seq(shards, group) -> list``: the inverse of ``seq_to_heads``, with exactly
    one ``group.all_to_all(blocks)``; the answer is built from what each rank received (in
    some random cases the network delivers other values)."""
    cases, run = _a2a_cases(rng), Cases("heads_to_seq")
    for where, n, x, swap in cases:
        with run.case():        # a broken rule of the served network is that case's verdict
            _h2s_case(heads_to_seq, rng, where, n, x, swap)
    run.verdict()
    return f"{len(cases)} cases: one all-to-all of token blocks; heads_to_seq undoes seq_to_heads"


def _h2s_case(heads_to_seq, rng, where, n, x, swap) -> None:
    """One case of heads_to_seq: the served all-to-all, the call, the sequence shards."""
    shards = np.split(x, n, axis=1)
    s, g, d = shards[0].shape
    c = s // n
    referee = Referee("heads_to_seq", where)
    expected = [np.split(y, n, axis=0) for y in shards]
    delivered = substitute_blocks(rng, expected) if swap else expected
    hint = ("rank j owes every rank i the tokens rank i keeps (with rank j's heads), all "
            "in one group.all_to_all; rank i lines up what arrives in head order")
    send = Send("the token blocks", expected, delivered,
                block=lambda j, i: f"tokens {i * c}..{(i + 1) * c - 1} of rank {j}'s shard "
                                   f"({_heads(g, j)}), shape {(c, g, d)}",
                missing=("the token blocks never went through all_to_all", hint))
    net = AllToAllNetwork(referee, n, [send], purpose="heads_to_seq", never=(
        "your heads_to_seq never called group.all_to_all: rank i can get its tokens' other "
        "heads only through the network", hint))
    out = served_call(referee, "heads_to_seq", heads_to_seq, ("shards",), shards, net,
                      calls=_H2S_CALL)
    net._finish()
    target = [np.concatenate([np.asarray(delivered[j][i], dtype=float) for j in range(n)], axis=1)
              for i in range(n)]
    compare_shards("heads_to_seq", out, target, where=where,
                    what="sequence shard", axes=("local token", "head", "dim"), exact=True,
                    hint=lambda: mistakes.explain(mistakes.all_to_all_mistake(
                        delivered, out, axis=1), (
                        "rank i returns the blocks it received from ranks 0, 1, ..., side by "
                        "side along the head axis (rank 0's heads first)")))


def _ulysses_cases(rng, n_random=6):
    """(layout, causal, N_c, c, a, a_kv, substitute): fixed cases, then random ones; causal
    None = not passed (the default, True); at least two random cases substitute."""
    cases: list[tuple] = [("contiguous", True, 2, 2, 4, 4), ("zigzag", True, 2, 4, 4, 2),
             ("zigzag", True, 2, 2, 8, 4), ("striped", True, 3, 2, 3, 3),
             ("contiguous", False, 4, 1, 4, 4), ("contiguous", True, 1, 4, 2, 2),
             ("zigzag", None, 4, 2, 4, 4)]
    cases = [case + (False,) for case in cases]
    swapped = substituted(rng, n_random)
    for i in range(n_random):
        n = int(rng.integers(2, 5))
        a_kv = n * int(rng.integers(1, 3))
        layout, causal = str(rng.choice(["contiguous", "zigzag", "striped"])), bool(rng.random() < 0.7)
        if i in swapped:             # both parts (non-causal, causal) get substituted cases
            causal = sorted(swapped).index(i) % 2 == 1
        cases.append((layout, causal, n, 2 * int(rng.integers(1, 3)), a_kv * int(rng.integers(1, 3)),
                      a_kv, i in swapped))
    return cases


_ULY_CALL = ("ulysses_attention(q_shards, k_shards, v_shards, positions[, causal], group=network, "
             "attention=kernel)")


def _ulysses_case(rng, referee, qs, ks, vs, swap):
    """The network and the kernel of one case: the three sequence -> heads all-to-alls, the
    served attention, and the output's heads -> sequence all-to-all."""
    n = len(qs)
    s, (c, a, d), a_kv = n * qs[0].shape[0], qs[0].shape, ks[0].shape[1]
    sends, held, real = [], {}, {}
    for name, shards in (("Q", qs), ("K", ks), ("V", vs)):
        send = _head_group_send(f"{name} (sequence -> heads)", shards, n, rng, swap)
        send.missing = (f"{name} never went through all_to_all: every rank needs the head groups of "
                        f"all ranks' tokens", "run your seq_to_heads(q_shards, group) (and on K, V) "
                        "first; rank j attends on what it received")
        sends.append(send)
        held[name] = [np.concatenate([send.delivered[i][j] for i in range(n)]) for j in range(n)]
        real[name] = [np.concatenate([send.expected[i][j] for i in range(n)]) for j in range(n)]
    offsets = [rng.standard_normal((s, a // n, d)) for _ in range(n)] if swap else None
    kernel = ServedAttention(referee, (s, a, a_kv, d), held["Q"], held["K"], held["V"],
                             real["Q"], real["K"], real["V"], offsets)
    out_offsets = [[rng.standard_normal((c, a // n, d)) for _ in range(n)] for _ in range(n)] \
        if swap else None
    sends.append(Send("the attention output (heads -> sequence)", kernel._output_blocks,
                      _delivered_output(kernel, out_offsets),
                      block=lambda j, i: f"tokens {i * c}..{(i + 1) * c - 1} of what attention "
                                         f"returned for head group {j}, shape {(c, a // n, d)}",
                      missing=("the attention output never went through all_to_all: each rank "
                               "must get back its own tokens with all heads",
                               "send what attention returned for each head group (its out, "
                               "unchanged) back through your heads_to_seq")))
    net = AllToAllNetwork(referee, n, sends, purpose="Ulysses", never=(
        "your ulysses_attention never called group.all_to_all: the head groups of the other "
        "ranks reach a rank only through the network",
        "the head groups of the other ranks reach a rank only through group.all_to_all, "
        "which your seq_to_heads and heads_to_seq use"))
    return net, kernel, out_offsets


def _delivered_output(kernel, offsets):
    """What the output all-to-all delivers: the blocks sent, each plus ``offsets[j][i]``
    where the case substitutes (None: the blocks as sent)."""
    if offsets is None:
        return kernel._output_blocks

    def delivered():
        blocks = kernel._output_blocks()
        return None if blocks is None else [[b + off for b, off in zip(row, offs)]
                                            for row, offs in zip(blocks, offsets)]
    return delivered


def _output_target(kernel, offsets, causal, pos):
    """What an honest Ulysses returns: rank i gets token block i of every head group's
    output, side by side along the head axis, plus what the output all-to-all adds."""
    outs = kernel._target(causal, pos)
    if offsets is None:
        return outs
    n = len(outs)
    return [o + np.concatenate([offsets[j][i] for j in range(n)], axis=1) for i, o in enumerate(outs)]


def _ulysses_diagnosis(out, full_in, kernel, causal_, swap, where) -> None:
    """Name the mistake when the output equals a known one."""
    from ..sim.attention import attention
    q, k, v, pos = full_in
    full = attention(q, k, v, causal=causal_)[0]
    if swap:
        diagnose_plain("ulysses_attention", out, [full[p] for p in pos], where,
                        "your output is plain attention of the inputs, not what the served "
                        "attention returned on the head groups the network delivered (here "
                        "they differ)",
                        "use the attention passed in, on what your seq_to_heads received, "
                        "and return its out through heads_to_seq unchanged")
        diagnose_plain("ulysses_attention", out, kernel._target(causal_, np.concatenate(pos)),
                        where, "your output is what attention returned, put back in order "
                        "without the output all-to-all's delivery (here it delivers other "
                        "values than were sent)",
                        "a rank gets its tokens' other heads only through the network: "
                        "return what your heads_to_seq received, unchanged")
    elif causal_:    # name the classic mistakes when they are the cause
        diagnose("ulysses_attention", out, mask_mistakes(q, k, v, pos, local_rows=False),
                  where)
    else:
        causal_out = attention(q, k, v, causal=True)[0]
        diagnose("ulysses_attention", out, {
            "causal attention, though causal=False was passed": (
                [causal_out[p] for p in pos], "pass causal on to the kernel as it was "
                                              "passed to you (the kernel's default is False)")},
                  where)


def _ulysses_run(ulysses_attention, rng, layout, causal, n, c, a, a_kv, swap) -> float:
    """One case of Ulysses attention: the served call, the rules, the output; the error."""
    from ..layouts import shard_positions
    s, d = n * c, int(rng.integers(1, 4))
    q, k, v = draw_qkv(rng, s, a, d, a_kv=a_kv, scale=1.5)
    pos = shard_positions(s, n, layout)
    causal_ = causal is not False
    where = (f"{layout} layout, causal={causal_}{' (not passed: the default)' if causal is None else ''}"
             f", N_c={n}, s={s}, a={a}, a_kv={a_kv}"
             + (", the network delivers other values and attention adds an offset" if swap else ""))
    args = ([q[p] for p in pos], [k[p] for p in pos], [v[p] for p in pos], [p.copy() for p in pos])
    referee = Referee("ulysses_attention", where)
    net, kernel, out_offsets = _ulysses_case(rng, referee, *args[:3], swap)
    if not in_part("non-causal" if causal is False else "causal"):
        return 0.0                  # another part's case (drawn all the same: one random stream)
    out = served_call(referee, "ulysses_attention", ulysses_attention,
                      ("q_shards", "k_shards", "v_shards", "positions"),
                      *args, *(() if causal is None else (causal,)), group=net, attention=kernel,
                      calls=_ULY_CALL)
    kernel._finish()
    net._finish()
    target = _output_target(kernel, out_offsets, causal_, np.concatenate(pos))
    try:
        return compare_shards(
            "ulysses_attention", out, target, where=where, what="output",
            axes=("local query", "head", "dim"),
            hint="check what you give the kernel besides the head groups: the positions of "
                 "the rows it gets, in the order they come, and the causal flag")
    except CheckFailed:
        _ulysses_diagnosis(out, (q, k, v, pos), kernel, causal_, swap, where)
        raise


@register_exercise("ulysses_attention", NB04, "Ulysses attention",
                   parts=("non-causal", "causal"),
                   uses=("seq_to_heads", "heads_to_seq"),
                   withholds={
                       "lesson10.sim.ulysses.ulysses_attention": "adapter:ulysses_attention"},
                   use_instead=("use your seq_to_heads and heads_to_seq with the group, and the "
                                "attention kernel, that the check passes in"))
def check_ulysses_attention(ulysses_attention, rng):
    """``ulysses_attention(q_shards, k_shards, v_shards, positions, causal=True, group=None,
    attention=None) -> list`` of sequence-sharded outputs; K/V may have fewer heads than Q
    (GQA, ``a_kv`` a multiple of ``n``). The check passes ``group=``, a network with
    ``all_to_all`` only, and ``attention=``, a kernel with the signature of
    ``lesson10.sim.attention`` that serves one rank's head group per call: Q, K and V each
    go through one all-to-all, attention runs once per head group ``(s, a/n, d)`` on what
    the all-to-all delivered, and its output goes back through one all-to-all. In some
    random cases the network delivers other values and the kernel adds a secret offset to
    its output: the target is what an honest Ulysses gets from them."""
    err, cases, run = 0.0, _ulysses_cases(rng), Cases("ulysses_attention")
    for case in cases:
        with run.case():        # a broken rule of the served objects is that case's verdict
            err = max(err, _ulysses_run(ulysses_attention, rng, *case))
    run.verdict()
    n_swapped = sum(case[-1] for case in cases)
    return (f"{len(cases)} cases (contiguous, zigzag and striped, causal and not, GQA, N_c in 1..4, "
            f"{n_swapped} with substituted values): four all-to-alls, attention once per head group, "
            f"output matches, max error {err:.1e}")


@register_exercise("ulysses_bytes", NB04, "bytes of Ulysses vs ring attention",
                   withholds={
                       "lesson10.cost.comm_bytes": "adapter:comm_bytes",
                       "lesson10.cost.usp_bytes": "adapter:usp_bytes",
                       "lesson10.cost.moe_a2a_bytes": None})
def check_ulysses_bytes(ulysses_bytes, rng):
    """``ulysses_bytes(s, h, n, g=1, e=2) -> float``: bytes each GPU sends per layer in the
    forward pass: four all-to-alls (Q, K, V, output); K and V have ``h/g`` columns."""
    from .. import cost
    # (s, h, N_c, g, e); None: not passed, the default (g = 1, e = 2)
    cases: list[tuple] = [(4096, 1024, 4, 4, 2), (16, 8, 1, 1, 2), (64, 32, 2, 1, 2), (64, 32, 2, 2, 1),
             (96, 48, 3, 1, 4), (131072, 4096, 8, 1, 2), (80, 16, 4, None, None), (48, 24, 3, 2, None)]
    for i in range(8):       # N_c up to 256, s up to ~2M, h up to ~64K: no table covers them
        big = i % 2 == 1
        n, g = log_int(rng, 2, 256, big), log_int(rng, 1, 16)
        cases.append((n * log_int(rng, 1, 8192, big), g * log_int(rng, 1, 4096, big), n, g,
                      int(rng.choice([1, 2, 4]))))
    run = Cases("ulysses_bytes")
    for s, h, n, g, e in cases:
        with run.case():
            _ub_case(ulysses_bytes, cost, s, h, n, g, e)
    run.verdict()
    return f"{len(cases)} sizes (N_c = 1..256, GQA, e = 1, 2, 4) match (N_c-1)/N_c (2 + 2/g) s h e / N_c"


def _ub_case(ulysses_bytes, cost, s, h, n, g, e) -> None:
    """One size of ulysses_bytes; ``g``, ``e`` None: not passed (the defaults 1 and 2)."""
    args = tuple(x for x in (s, h, n, g, e) if x is not None)
    g, e = (1 if g is None else g), (2 if e is None else e)
    out = run_student("ulysses_bytes", ulysses_bytes, (), *args)
    passed = "" if len(args) == 5 else f" ({', '.join(('g', 'e')[len(args) - 3:])} not passed)"
    close_number("ulysses_bytes", out, cost.comm_bytes("ulysses", s, h, n, g=g, e=e),
                 where=f"s={s}, h={h}, N_c={n}, g={g}, e={e}{passed}", what="bytes per GPU",
                 hint=lambda: mistakes.explain(mistakes.ulysses_bytes_mistake(
                     s, h, n, g, e, out, len(args) >= 4, len(args) >= 5), (
                     "four all-to-alls (Q, K, V, the output), each of a rank's local tensor; "
                     "how much of it leaves the rank, and how many columns has each tensor?")))
