"""Right and wrong answers for notebooks 04-05 (test data for tests/test_checks_answers.py)."""
import math
from collections import Counter
from decimal import Decimal
from fractions import Fraction

import numpy as np
from answers_01_03 import attn_einsum


# --------------------------------------------------------------------------- 04 seq_to_heads
# The check passes group, a network that offers all_to_all(blocks) only (blocks[i][j] goes
# from rank i to rank j; it returns out with out[j][i] = blocks[i][j]).
def s2h_split(shards, group):
    n = len(shards)
    received = group.all_to_all([np.split(x, n, axis=1) for x in shards])
    return [np.concatenate(received[j], axis=0) for j in range(n)]


def s2h_reshape(shards, group):          # blocks by reshape, the result one stacked array
    n = len(shards)
    x = np.stack(shards)                                  # (n, c, a, d)
    _, c, a, d = x.shape
    x = x.reshape(n, c, n, a // n, d)                     # raises when n does not divide a
    received = group.all_to_all([[x[i, :, j] for j in range(n)] for i in range(n)])
    return np.stack([np.stack(received[j]).reshape(n * c, a // n, d) for j in range(n)])


def s2h_slices(shards, group=None):
    n, a = len(shards), shards[0].shape[1]
    if a % n:
        raise ValueError(f"{a} heads do not split over {n} ranks")
    g = a // n
    received = group.all_to_all([[x[:, j * g:(j + 1) * g] for j in range(n)] for x in shards])
    return [np.vstack(row) for row in received]


def s2h_wrong_axes(shards, group):       # cuts tokens, stacks heads
    n = len(shards)
    received = group.all_to_all([np.split(x, n, axis=0) for x in shards])
    return [np.concatenate(received[j], axis=1) for j in range(n)]


def s2h_wrong_index(shards, group):      # stacks received[i][j], what rank i got from j
    n = len(shards)
    received = group.all_to_all([np.split(x, n, axis=1) for x in shards])
    return [np.concatenate([received[i][j] for i in range(n)], axis=0) for j in range(n)]


def s2h_strided_heads(shards, group):    # head group j = heads j, j + n, ... (transposed reshape)
    n = len(shards)
    _, a, d = shards[0].shape
    blocks = [[x.reshape(len(x), a // n, n, d)[:, :, j] for j in range(n)] for x in shards]
    return [np.concatenate(row) for row in group.all_to_all(blocks)]


def s2h_no_check(shards, group):         # slicing: empty or short head groups when n does not divide a
    n, a = len(shards), shards[0].shape[1]
    g = a // n
    received = group.all_to_all([[x[:, j * g:(j + 1) * g] for j in range(n)] for x in shards])
    return [np.concatenate(row) for row in received]


def s2h_assert(shards, group):           # checks the heads with assert: AssertionError, not ValueError
    n, a = len(shards), shards[0].shape[1]
    assert a % n == 0, f"{a} heads over {n} ranks"
    return s2h_split(shards, group)


def s2h_reversed_tokens(shards, group):
    n = len(shards)
    received = group.all_to_all([np.split(x, n, axis=1) for x in shards])
    return [np.concatenate(received[j][::-1], axis=0) for j in range(n)]


def s2h_stack(shards, group):            # (n, c, a/n, d) per rank
    n = len(shards)
    received = group.all_to_all([np.split(x, n, axis=1) for x in shards])
    return [np.stack(received[j]) for j in range(n)]


def s2h_array_split(shards, group):      # np.array_split never complains
    n = len(shards)
    received = group.all_to_all([np.array_split(x, n, axis=1) for x in shards])
    return [np.concatenate(received[j], axis=0) for j in range(n)]


def s2h_interleaved_tokens(shards, group):   # token order c-major
    n = len(shards)
    received = group.all_to_all([np.split(x, n, axis=1) for x in shards])
    out = []
    for j in range(n):
        st = np.stack(received[j], axis=1)                 # (c, n, g, d)
        out.append(st.reshape(-1, *st.shape[2:]))
    return out


def s2h_never_calls(shards, group):      # the right result, computed without the network
    n = len(shards)
    blocks = [np.split(x, n, axis=1) for x in shards]
    return [np.concatenate([blocks[i][j] for i in range(n)], axis=0) for j in range(n)]


def s2h_for_show(shards, group):         # calls the network, then uses its own copies
    n = len(shards)
    blocks = [np.split(x, n, axis=1) for x in shards]
    group.all_to_all(blocks)
    return [np.concatenate([blocks[i][j] for i in range(n)], axis=0) for j in range(n)]


def s2h_twice(shards, group):            # one all-to-all per head group
    n = len(shards)
    out = []
    for j in range(n):
        blocks = [[x[:, :0] for _ in range(n)] for x in shards]
        for i in range(n):
            blocks[i][j] = np.split(shards[i], n, axis=1)[j]
        out.append(np.concatenate(group.all_to_all(blocks)[j]))
    return out


# --------------------------------------------------------------------------- 04 heads_to_seq
def h2s_split(shards, group):
    n = len(shards)
    received = group.all_to_all([np.split(x, n, axis=0) for x in shards])
    return [np.concatenate(received[i], axis=1) for i in range(n)]


def h2s_reshape(shards, group):
    n = len(shards)
    x = np.stack(shards)                                  # (n, s, g, d)
    _, s, g, d = x.shape
    x = x.reshape(n, n, s // n, g, d)                     # [j, i]: block i of rank j
    received = group.all_to_all([[x[j, i] for i in range(n)] for j in range(n)])
    return [np.stack(received[i], axis=1).reshape(s // n, n * g, d) for i in range(n)]


def h2s_reshape_all_heads(shards, group):    # reshapes a (s, a/N_c, d) shard as if it held all a heads
    n = len(shards)
    s, g, d = shards[0].shape
    blocks = [list(x.reshape(n, s // n, g * n, d)) for x in shards]
    received = group.all_to_all(blocks)
    return [np.concatenate(received[i], axis=1) for i in range(n)]


def h2s_slices(shards, group=None):
    n = len(shards)
    c = shards[0].shape[0] // n
    received = group.all_to_all([[x[i * c:(i + 1) * c] for i in range(n)] for x in shards])
    return [np.hstack(row) for row in received]


def h2s_wrong_index(shards, group):
    n = len(shards)
    received = group.all_to_all([np.split(x, n, axis=0) for x in shards])
    return [np.concatenate([received[j][r] for j in range(n)], axis=1) for r in range(n)]


def h2s_is_s2h(shards, group):
    return s2h_split(shards, group)


def h2s_reversed_heads(shards, group):
    n = len(shards)
    received = group.all_to_all([np.split(x, n, axis=0) for x in shards])
    return [np.concatenate(received[r][::-1], axis=1) for r in range(n)]


def h2s_interleaved_heads(shards, group):    # head order g-major
    n = len(shards)
    received = group.all_to_all([np.split(x, n, axis=0) for x in shards])
    out = []
    for r in range(n):
        st = np.stack(received[r], axis=2)                 # (c, g, n, d)
        out.append(st.reshape(st.shape[0], -1, st.shape[3]))
    return out


def h2s_strided_tokens(shards, group):   # rank i gets tokens i, i + n, ...
    n = len(shards)
    received = group.all_to_all([[x[i::n] for i in range(n)] for x in shards])
    return [np.concatenate(received[i], axis=1) for i in range(n)]


def h2s_no_exchange(shards, group):
    return [x.copy() for x in shards]


def h2s_stack(shards, group):
    n = len(shards)
    received = group.all_to_all([np.split(x, n, axis=0) for x in shards])
    return [np.stack(received[r], axis=1) for r in range(n)]


def h2s_for_show(shards, group):         # calls the network, then uses its own copies
    n = len(shards)
    blocks = [np.split(x, n, axis=0) for x in shards]
    group.all_to_all(blocks)
    return [np.concatenate([blocks[j][r] for j in range(n)], axis=1) for r in range(n)]


# --------------------------------------------------------------------------- 04 ulysses_attention
# The check passes group= (all_to_all only) and attention=, a kernel with the signature of
# lesson10.sim.attention that serves one head group per call.
def make_ulysses(s2h=s2h_split, h2s=h2s_split, pos="concat", back=True, causal_override=None,
                 tile=False):
    def ulysses_attention(q_shards, k_shards, v_shards, positions, causal=True, group=None,
                          attention=None):
        qh, kh, vh = s2h(q_shards, group), s2h(k_shards, group), s2h(v_shards, group)
        p = {"concat": lambda: np.concatenate(positions),
             "arange": lambda: np.arange(sum(map(len, positions))),
             "sorted": lambda: np.sort(np.concatenate(positions))}[pos]()
        c = causal if causal_override is None else causal_override
        out = []
        for j in range(len(q_shards)):
            k, v = kh[j], vh[j]
            if tile:                                       # K/V heads copied up to the query heads
                g = qh[j].shape[1] // k.shape[1]
                k, v = np.tile(k, (1, g, 1)), np.tile(v, (1, g, 1))
            out.append(attention(qh[j], k, v, causal=c, q_pos=p, k_pos=p)[0])
        return h2s(out, group) if back else out
    return ulysses_attention


def ulysses_positional(q_shards, k_shards, v_shards, positions, causal=True, group=None,
                       attention=None):
    """Reshape-style all-to-alls, the kernel called with positional arguments."""
    qh, kh, vh = (s2h_reshape(x, group) for x in (q_shards, k_shards, v_shards))
    pos = np.concatenate(positions)
    return h2s_reshape([attention(qh[j], kh[j], vh[j], causal, pos, pos)[0]
                        for j in range(len(q_shards))], group)


def ulysses_loop(q_shards, k_shards, v_shards, positions, causal=True, group=None, attention=None):
    heads = {name: s2h_slices(x, group) for name, x in
             (("q", q_shards), ("k", k_shards), ("v", v_shards))}
    pos = np.hstack(positions)
    outs = []
    for qj, kj, vj in zip(heads["q"], heads["k"], heads["v"]):
        o, _ = attention(qj, kj, vj, causal=causal, q_pos=pos, k_pos=pos)
        outs.append(o)
    return h2s_slices(outs, group)


def _own_attention(q, k, v, q_pos, k_pos, causal):
    """Attention computed without the served kernel (GQA by repeating K/V heads)."""
    g = q.shape[1] // k.shape[1]
    return attn_einsum(q, np.repeat(k, g, axis=1), np.repeat(v, g, axis=1), q_pos, k_pos, causal)


def ulysses_whole_sequence(q_shards, k_shards, v_shards, positions, causal=True, group=None,
                           attention=None):
    """Calls the served attention once on the whole sequence with all heads."""
    pos = np.concatenate(positions)
    out, _ = attention(np.concatenate(q_shards), np.concatenate(k_shards), np.concatenate(v_shards),
                       causal=causal, q_pos=pos, k_pos=pos)
    c = len(positions[0])
    return [out[r * c:(r + 1) * c] for r in range(len(positions))]


def ulysses_per_rank(q_shards, k_shards, v_shards, positions, causal=True, group=None,
                     attention=None):
    """Attention on each rank's own tokens with all heads (before any all-to-all); the
    keys of the other ranks are added from the inputs."""
    pos = np.concatenate(positions)
    ks, vs = np.concatenate(k_shards), np.concatenate(v_shards)
    return [attention(q, ks, vs, causal=causal, q_pos=p, k_pos=pos)[0]
            for q, p in zip(q_shards, positions)]


def ulysses_own_attention(q_shards, k_shards, v_shards, positions, causal=True, group=None,
                          attention=None):
    """Calls the kernel on every head group, but sends its own attention back."""
    qh, kh, vh = (s2h_split(x, group) for x in (q_shards, k_shards, v_shards))
    pos = np.concatenate(positions)
    for j in range(len(qh)):
        attention(qh[j], kh[j], vh[j], causal=causal, q_pos=pos, k_pos=pos)
    return h2s_split([_own_attention(qh[j], kh[j], vh[j], pos, pos, causal)[0]
                      for j in range(len(qh))], group)


def ulysses_no_kernel(q_shards, k_shards, v_shards, positions, causal=True, group=None,
                      attention=None):
    """Both all-to-alls, but attention of its own instead of the one passed in."""
    qh, kh, vh = (s2h_split(x, group) for x in (q_shards, k_shards, v_shards))
    pos = np.concatenate(positions)
    return h2s_split([_own_attention(qh[j], kh[j], vh[j], pos, pos, causal)[0]
                      for j in range(len(qh))], group)


def ulysses_local_slices(q_shards, k_shards, v_shards, positions, causal=True, group=None,
                         attention=None):
    """Cuts the head groups out of the inputs itself (no all-to-all on the way in)."""
    n = len(q_shards)
    q, k, v = (np.concatenate(x) for x in (q_shards, k_shards, v_shards))
    pos = np.concatenate(positions)
    g, gk = q.shape[1] // n, k.shape[1] // n
    outs = [attention(q[:, j * g:(j + 1) * g], k[:, j * gk:(j + 1) * gk], v[:, j * gk:(j + 1) * gk],
                      causal=causal, q_pos=pos, k_pos=pos)[0] for j in range(n)]
    return h2s_split(outs, group)


def ulysses_twice(q_shards, k_shards, v_shards, positions, causal=True, group=None, attention=None):
    """Calls attention twice per head group (once for the output, once "to check")."""
    qh, kh, vh = (s2h_split(x, group) for x in (q_shards, k_shards, v_shards))
    pos = np.concatenate(positions)
    outs = []
    for j in range(len(qh)):
        o, _ = attention(qh[j], kh[j], vh[j], causal=causal, q_pos=pos, k_pos=pos)
        o2, _ = attention(qh[j], kh[j], vh[j], causal=causal, q_pos=pos, k_pos=pos)
        outs.append((o + o2) / 2)
    return h2s_split(outs, group)


def ulysses_sorted_tokens(q_shards, k_shards, v_shards, positions, causal=True, group=None,
                          attention=None):
    """Puts each head group's tokens in global order and masks with row numbers: exact, but
    the served attention takes head groups in seq_to_heads' order only."""
    qh, kh, vh = (s2h_slices(x, group) for x in (q_shards, k_shards, v_shards))
    pos = np.concatenate(positions)
    order = np.argsort(pos)
    outs = []
    for j in range(len(q_shards)):
        o, _ = attention(qh[j][order], kh[j][order], vh[j][order], causal=causal)
        back = np.empty_like(o)
        back[order] = o
        outs.append(back)
    return h2s_slices(outs, group)


def ulysses_ignores_delivery(q_shards, k_shards, v_shards, positions, causal=True, group=None,
                             attention=None):
    """Sends the kernel's outputs through the output all-to-all, but returns its own
    rearrangement of them instead of what arrived."""
    qh, kh, vh = (s2h_split(x, group) for x in (q_shards, k_shards, v_shards))
    pos = np.concatenate(positions)
    n = len(qh)
    outs = [attention(qh[j], kh[j], vh[j], causal=causal, q_pos=pos, k_pos=pos)[0] for j in range(n)]
    h2s_split(outs, group)
    c = len(positions[0])
    return [np.concatenate([o[i * c:(i + 1) * c] for o in outs], axis=1) for i in range(n)]


# --------------------------------------------------------------------------- 04 ulysses_bytes
def ub_formula(s, h, n, g=1, e=2):
    local = s / n * h * e
    return (n - 1) / n * (2 * local + 2 * local / g)


def ub_integers(s, h, n, g=1, e=2):
    return (n - 1) * s * h * e * (2 * g + 2) / (n * n * g)


def ub_per_tensor(s, h, n, g=1, e=2):
    return sum((n - 1) / n * (s / n) * (h / div) * e for div in (1, g, g, 1))


def ub_no_gqa(s, h, n, g=1, e=2):
    return ub_formula(s, h, n, 1, e)


def ub_full_seq(s, h, n, g=1, e=2):      # forgets that a rank holds s/N_c tokens
    return ub_formula(s, h, n, g, e) * n


def ub_no_fraction(s, h, n, g=1, e=2):   # counts the block a rank keeps
    return (2 + 2 / g) * s * h * e / n


def ub_one_over_n(s, h, n, g=1, e=2):    # 1/N_c instead of (N_c-1)/N_c
    return (2 + 2 / g) * s * h * e / n / n


def ub_g_everywhere(s, h, n, g=1, e=2):  # divides all four tensors by g
    return ub_formula(s, h, n, 1, e) / g


def ub_fixed_e(s, h, n, g=1, e=2):
    return ub_formula(s, h, n, g, 2)


def ub_kv_once(s, h, n, g=1, e=2):       # K and V together counted once: 2 + 1/g
    return (n - 1) / n * (2 + 1 / g) * s * h * e / n


def ub_three(s, h, n, g=1, e=2):         # forgets the output all-to-all
    return (n - 1) / n * (1 + 2 / g) * s * h * e / n


def ub_default_g2(s, h, n, g=2, e=2):
    return ub_formula(s, h, n, g, e)


# --------------------------------------------------------------------------- 05 route_topk
def route_stable(logits, k):
    experts = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    chosen = np.take_along_axis(logits, experts, axis=1)
    z = np.exp(chosen - chosen.max(axis=1, keepdims=True))
    return experts, z / z.sum(axis=1, keepdims=True)


def route_python(logits, k):
    experts, gates = [], []
    for row in np.asarray(logits, dtype=float).tolist():
        best = sorted(range(len(row)), key=lambda j: (-row[j], j))[:k]
        m = max(row[j] for j in best)
        w = [math.exp(row[j] - m) for j in best]
        experts.append(best)
        gates.append([x / sum(w) for x in w])
    return experts, gates


def route_lexsort(logits, k):
    z = np.asarray(logits, dtype=float)
    ids = np.broadcast_to(np.arange(z.shape[1]), z.shape)
    experts = np.lexsort((ids, -z), axis=1)[:, :k]
    chosen = np.take_along_axis(z, experts, axis=1)
    m = chosen.max(axis=1, keepdims=True)
    lse = m + np.log(np.exp(chosen - m).sum(axis=1, keepdims=True))
    return experts, np.exp(chosen - lse)


def route_softmax_all(logits, k):        # gates from the softmax over all E experts
    p = np.exp(logits - logits.max(1, keepdims=True))
    p = p / p.sum(1, keepdims=True)
    experts = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    return experts, np.take_along_axis(p, experts, axis=1)


def route_smallest(logits, k):           # argsort without the minus sign
    experts = np.argsort(logits, axis=1, kind="stable")[:, :k]
    chosen = np.take_along_axis(logits, experts, axis=1)
    z = np.exp(chosen - chosen.max(axis=1, keepdims=True))
    return experts, z / z.sum(axis=1, keepdims=True)


def route_gates_not_following(logits, k):   # experts sorted by id, gates left best first
    experts, gates = route_stable(logits, k)
    return np.sort(experts, axis=1), gates


def route_sorted_by_id(logits, k):       # experts and gates reordered by id together
    experts, gates = route_stable(logits, k)
    order = np.argsort(experts, axis=1)
    return np.take_along_axis(experts, order, 1), np.take_along_axis(gates, order, 1)


def route_float_ids(logits, k):
    experts, gates = route_stable(logits, k)
    return experts.astype(float), gates


def route_ties_high(logits, k):          # reversed ascending sort: ties go to the higher id (right:
    # the lesson defines no order among exactly equal logits)
    experts = np.argsort(logits, axis=1, kind="stable")[:, ::-1][:, :k]
    chosen = np.take_along_axis(logits, experts, axis=1)
    z = np.exp(chosen - chosen.max(axis=1, keepdims=True))
    return experts, z / z.sum(axis=1, keepdims=True)


def route_default_sort(logits, k):       # the default (unstable) argsort: ties in any order
    experts = np.argsort(-logits, axis=1)[:, :k]
    chosen = np.take_along_axis(logits, experts, axis=1)
    g = np.exp(chosen - chosen[:, :1])
    return experts, g / g.sum(axis=1, keepdims=True)


def route_argpartition(logits, k):       # the k best by argpartition, then sorted, ties in any order
    z = np.asarray(logits, dtype=float)
    top = np.argpartition(-z, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(z, top, axis=1), axis=1)
    experts = np.take_along_axis(top, order, axis=1)
    chosen = np.take_along_axis(z, experts, axis=1)
    lse = chosen.max(1, keepdims=True) + np.log(np.exp(chosen - chosen.max(1, keepdims=True)).sum(1, keepdims=True))
    return experts, np.exp(chosen - lse)


def route_shift_copy(logits, k):         # stabilises on a new array: the inputs stay unchanged
    z = logits - logits.max(axis=1, keepdims=True)
    experts = np.argsort(-z, axis=1, kind="stable")[:, :k]
    g = np.exp(np.take_along_axis(z, experts, axis=1))
    return experts, g / g.sum(axis=1, keepdims=True)


def route_shift_in_place(logits, k):     # logits -= max: changes the caller's array
    logits -= logits.max(axis=1, keepdims=True)
    return route_shift_copy(logits, k)


def route_best_repeated(logits, k):      # the best expert k times
    experts = np.repeat(np.argmax(logits, axis=1)[:, None], k, axis=1)
    return experts, np.full(experts.shape, 1.0 / k)


def route_no_shift(logits, k):           # exp of the raw logits overflows at 1000
    experts = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    with np.errstate(all="ignore"):
        z = np.exp(np.take_along_axis(logits, experts, axis=1).astype(float))
        return experts, z / z.sum(axis=1, keepdims=True)


def route_linear_gates(logits, k):       # normalises the logits, not their exponentials
    experts = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    chosen = np.take_along_axis(logits, experts, axis=1).astype(float)
    with np.errstate(all="ignore"):
        return experts, chosen / chosen.sum(axis=1, keepdims=True)


# --------------------------------------------------------------------------- 05 capacity_keep
def cap_fraction_loops(experts, E, capacity_factor):
    N, k = experts.shape
    if capacity_factor is None:
        return np.ones((N, k), dtype=bool)
    C = math.ceil(Fraction(str(capacity_factor)) * k * N / E)
    seen = [0] * E
    keep = np.zeros((N, k), dtype=bool)
    for t in range(N):
        for j in range(k):
            i = int(experts[t, j])
            keep[t, j] = seen[i] < C
            seen[i] += 1
    return keep


def cap_decimal_cumsum(experts, E, capacity_factor):
    N, k = experts.shape
    if capacity_factor is None:
        return np.ones_like(experts, dtype=bool)
    C = math.ceil(Decimal(repr(capacity_factor)) * k * N / E)
    flat = experts.ravel()
    onehot = flat[:, None] == np.arange(E)[None, :]
    arrival = (np.cumsum(onehot, axis=0) - 1)[np.arange(flat.size), flat]
    return (arrival < C).reshape(N, k)


def cap_rounded_counter(experts, E, capacity_factor):
    N, k = experts.shape
    C = math.inf if capacity_factor is None else math.ceil(round(capacity_factor * k * N / E, 9))
    seen = Counter()
    out = []
    for row in experts.tolist():
        keep_row = []
        for i in row:
            keep_row.append(seen[i] < C)
            seen[i] += 1
        out.append(keep_row)
    return np.array(out, dtype=bool)


def cap_integer_percent(experts, E, capacity_factor):   # integers: the factor in hundredths
    N, k = experts.shape
    C = N * k if capacity_factor is None else -(-round(capacity_factor * 100) * k * N // (100 * E))
    order = np.argsort(experts.ravel(), kind="stable")           # each expert's copies in token order
    rank = np.empty(N * k, dtype=int)
    starts = np.searchsorted(experts.ravel()[order], experts.ravel()[order])
    rank[order] = np.arange(N * k) - starts
    return (rank < C).reshape(N, k)


def cap_float_any_order(experts, E, capacity_factor):   # the float ceiling, another order
    N, k = experts.shape
    if capacity_factor is None:
        return np.ones((N, k), dtype=bool)
    C = math.ceil(k * N / E * capacity_factor)
    flat = experts.ravel()
    keep = np.zeros(flat.size, dtype=bool)
    for i in range(E):
        where = np.flatnonzero(flat == i)
        keep[where[:C]] = True
    return keep.reshape(N, k)


def cap_binary_fraction(experts, E, capacity_factor):   # exact, but of the factor's binary value
    N, k = experts.shape
    if capacity_factor is None:
        return np.ones((N, k), dtype=bool)
    C = math.ceil(Fraction(capacity_factor) * k * N / E)
    return make_capacity()(experts, E, None) & (
        (np.cumsum(experts.ravel()[:, None] == np.arange(E), axis=0)[np.arange(N * k), experts.ravel()]
         <= C).reshape(N, k))


def make_capacity(rounding=None, strict=True, token_major=True, as_int=False, forget_k=False,
                  reverse=False):
    def capacity_keep(experts, E, capacity_factor):
        N, k = experts.shape
        if capacity_factor is None:
            return np.ones((N, k), dtype=int if as_int else bool)
        if rounding is None:
            C = math.ceil(Fraction(str(capacity_factor)) * (1 if forget_k else k) * N / E)
        else:
            C = int(rounding(capacity_factor * k * N / E))
        keep = np.zeros((N, k), dtype=int if as_int else bool)
        seen = np.zeros(E, dtype=int)
        order = [(t, j) for t in range(N) for j in range(k)] if token_major else \
                [(t, j) for j in range(k) for t in range(N)]
        for t, j in (order[::-1] if reverse else order):
            i = experts[t, j]
            keep[t, j] = (seen[i] < C) if strict else (seen[i] <= C)
            seen[i] += 1
        return keep
    return capacity_keep


def cap_no_none(experts, E, capacity_factor):    # forgets the None case
    N, k = experts.shape
    C = math.ceil(Fraction(str(capacity_factor)) * k * N / E)
    seen = np.zeros(E, dtype=int)
    keep = np.zeros((N, k), dtype=bool)
    for t in range(N):
        for j in range(k):
            keep[t, j] = seen[experts[t, j]] < C
            seen[experts[t, j]] += 1
    return keep


# --------------------------------------------------------------------------- 05 moe_stats
def make_moe_stats(count_dropped=False, count_local=False, combine=True, load_before_drop=False,
                   minlength=True, gpu_of_expert="block", gpu_of_token="block", drop_over_n=False):
    def moe_stats(experts, keep, Ne, E, h, e=2):
        N, k = experts.shape
        T = N // Ne
        tok = np.arange(N)
        src = ((tok // T) if gpu_of_token == "block" else (tok % Ne))[:, None] * np.ones(k, dtype=int)
        dst = experts // (E // Ne) if gpu_of_expert == "block" else experts % Ne
        sent = keep if not count_dropped else np.ones_like(keep)
        remote = sent & ((src != dst) if not count_local else True)
        ml = dict(minlength=Ne) if minlength else {}
        dispatch = np.bincount(src[remote], **ml) * h * e
        back = np.bincount(dst[remote], **ml) * h * e
        load = np.bincount(dst[np.ones_like(keep) if load_before_drop else keep], **ml)
        dropped = (~keep).sum()
        return {"drop_rate": dropped / (N if drop_over_n else N * k),
                "bytes_per_gpu": dispatch + (back if combine else 0), "load_per_gpu": load}
    return moe_stats


def moe_loops(experts, keep, Ne, E, h, e=2):
    N, k = experts.shape
    T, per = N // Ne, E // Ne
    sent, load, dropped = [0] * Ne, [0] * Ne, 0
    for t in range(N):
        for j in range(k):
            if not keep[t, j]:
                dropped += 1
                continue
            src, dst = t // T, int(experts[t, j]) // per
            load[dst] += 1
            if src != dst:
                sent[src] += h * e
                sent[dst] += h * e
    return {"drop_rate": dropped / (N * k), "bytes_per_gpu": sent, "load_per_gpu": load}


def moe_traffic(experts, keep, Ne, E, h, e=2):
    N, k = experts.shape
    src = np.repeat(np.arange(Ne), N // Ne)[:, None].repeat(k, axis=1)
    dst = experts // (E // Ne)
    traffic = np.zeros((Ne, Ne), dtype=int)
    np.add.at(traffic, (src[keep], dst[keep]), 1)
    local = np.diag(traffic)
    return {"drop_rate": float(1 - keep.mean()),
            "bytes_per_gpu": ((traffic.sum(1) - local) + (traffic.sum(0) - local)) * h * e,
            "load_per_gpu": traffic.sum(0)}


def moe_default_e1(experts, keep, Ne, E, h, e=1):
    return make_moe_stats()(experts, keep, Ne, E, h, e)


# --------------------------------------------------------------------------- 05 switch_aux_loss
def aux_bincount(probs, experts, alpha=1e-2):
    N, E = probs.shape
    f = np.bincount(experts.ravel(), minlength=E) / experts.size
    return alpha * E * float(f @ probs.mean(axis=0))


def aux_loops(probs, experts, alpha=1e-2):
    N, E = np.shape(probs)
    counts = np.zeros(E)
    for row in experts:
        for i in row:
            counts[i] += 1
    f = counts / counts.sum()
    P = [sum(probs[t][i] for t in range(N)) / N for i in range(E)]
    return alpha * E * sum(fi * pi for fi, pi in zip(f, P))


def aux_einsum(probs, experts, alpha=1e-2):
    N, E = probs.shape
    onehot = (experts[..., None] == np.arange(E)).astype(float)      # (N, k, E)
    f = onehot.sum(axis=(0, 1)) / (N * experts.shape[1])
    return float(alpha * E * np.einsum("i,i->", f, probs.mean(axis=0)))


def aux_f_per_token(probs, experts, alpha=1e-2):   # f_i over N tokens, not N k copies
    N, E = probs.shape
    return alpha * E * float(np.bincount(experts.ravel(), minlength=E) / N @ probs.mean(axis=0))


def aux_no_E(probs, experts, alpha=1e-2):
    return aux_bincount(probs, experts, alpha) / probs.shape[1]


def aux_no_minlength(probs, experts, alpha=1e-2):  # bincount stops at the largest id chosen
    N, E = probs.shape
    f = np.bincount(experts.ravel()) / experts.size
    return alpha * E * float(f @ probs.mean(axis=0))


def aux_f_twice(probs, experts, alpha=1e-2):       # P_i from the hard counts too
    N, E = probs.shape
    f = np.bincount(experts.ravel(), minlength=E) / experts.size
    return alpha * E * float(f @ f)


def aux_first_choice(probs, experts, alpha=1e-2):  # f from the best expert only
    N, E = probs.shape
    f = np.bincount(experts[:, 0], minlength=E) / N
    return alpha * E * float(f @ probs.mean(axis=0))


def aux_mean_over_experts(probs, experts, alpha=1e-2):
    N, E = probs.shape
    f = np.bincount(experts.ravel(), minlength=E) / experts.size
    return alpha * E * float(np.mean(f * probs.mean(axis=0)))


def aux_default_alpha(probs, experts, alpha=1e-3):
    return aux_bincount(probs, experts, alpha)


def aux_sum_probs(probs, experts, alpha=1e-2):     # P_i summed over tokens, not averaged
    N, E = probs.shape
    f = np.bincount(experts.ravel(), minlength=E) / experts.size
    return alpha * E * float(f @ probs.sum(axis=0))


# --------------------------------------------------------------------------- 05 precision and counts
def route_float32(logits, k):            # right: the gates computed in float32
    z = np.asarray(logits, dtype=np.float32)
    experts = np.argsort(-z, axis=1, kind="stable")[:, :k]
    chosen = np.take_along_axis(z, experts, axis=1)
    g = np.exp(chosen - chosen.max(axis=1, keepdims=True))
    return experts, g / g.sum(axis=1, keepdims=True)


def route_by_probs(logits, k):           # ranks by softmax probabilities: far logits tie at 0
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p = p / p.sum(axis=1, keepdims=True)
    experts = np.argsort(-p, axis=1, kind="stable")[:, :k]
    chosen = np.take_along_axis(logits, experts, axis=1)
    g = np.exp(chosen - chosen.max(axis=1, keepdims=True))
    return experts, g / g.sum(axis=1, keepdims=True)


def moe_float32(experts, keep, Ne, E, h, e=2):   # right: the drop rate in float32
    out = make_moe_stats()(experts, keep, Ne, E, h, e)
    out["drop_rate"] = np.float32(1) - keep.mean(dtype=np.float32)
    return out


def moe_float32_item(experts, keep, Ne, E, h, e=2):   # right: float32, then a Python float
    out = make_moe_stats()(experts, keep, Ne, E, h, e)
    out["drop_rate"] = (np.float32((~keep).sum()) / np.float32(keep.size)).item()
    return out


def moe_load_uint16(experts, keep, Ne, E, h, e=2):    # loads stored in uint16 wrap above 65535
    out = make_moe_stats()(experts, keep, Ne, E, h, e)
    out["load_per_gpu"] = np.asarray(out["load_per_gpu"]).astype(np.uint16)
    return out


def moe_bytes_uint8(experts, keep, Ne, E, h, e=2):    # bytes stored in uint8 wrap above 255
    out = make_moe_stats()(experts, keep, Ne, E, h, e)
    out["bytes_per_gpu"] = np.asarray(out["bytes_per_gpu"]).astype(np.uint8)
    return out


def aux_float32(probs, experts, alpha=1e-2):           # right: in float32
    N, E = probs.shape
    f = np.bincount(experts.ravel(), minlength=E).astype(np.float32) / np.float32(experts.size)
    return np.float32(alpha) * np.float32(E) * (f @ probs.astype(np.float32).mean(axis=0))


# --------------------------------------------------------------------------- issue 30: the edges
def route_mean_shift(logits, k):         # the softmax shifted by the mean of the chosen logits
    z = np.asarray(logits, dtype=float)
    experts = np.argsort(-z, axis=1, kind="stable")[:, :k]
    chosen = np.take_along_axis(z, experts, axis=1)
    with np.errstate(all="ignore"):
        w = np.exp(chosen - chosen.mean(axis=1, keepdims=True))
        return experts, w / w.sum(axis=1, keepdims=True)


def cap_float32(experts, E, capacity_factor):   # C from np.float32(capacity_factor)
    experts = np.asarray(experts)
    N, k = experts.shape
    if capacity_factor is None:
        return np.ones((N, k), dtype=bool)
    C = math.ceil(np.float32(capacity_factor) * k * N / E)
    seen, keep = np.zeros(E, dtype=int), np.zeros((N, k), dtype=bool)
    for t in range(N):
        for j in range(k):
            keep[t, j] = seen[experts[t, j]] < C
            seen[experts[t, j]] += 1
    return keep


def cap_keep_all(experts, E, capacity_factor):   # keeps every copy: right only where none drops
    return np.ones(np.shape(experts), dtype=bool)
