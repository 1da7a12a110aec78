"""Every check accepts a correct answer, rejects realistic wrong ones with a message,
reports a stub as "not attempted", and records its outcome."""
import json

import numpy as np
import pytest

from lesson10 import checks
from lesson10.checks import CheckFailed


# --------------------------------------------------------------------------- right answers
# Written here independently of the notebooks, in plain NumPy.
def reduce_scatter(xs):
    total = np.sum(xs, axis=0)
    return list(np.split(total, len(xs), axis=0))


def all_gather(shards):
    full = np.concatenate(shards, axis=0)
    return [full.copy() for _ in shards]


def sp_forward(partials, op):
    return all_gather([op(x) for x in reduce_scatter(partials)])


def sp_bytes(s, h, t, e=2):
    n = s * h * e
    return 2 * (2 * (t - 1) / t * n), 4 * ((t - 1) / t * n)


def block_attention(q, k, v, q_pos, k_pos, causal=True):
    x = np.einsum("iad,jad->aij", q, k) / np.sqrt(q.shape[-1])
    if causal:
        x = np.where(np.asarray(k_pos)[None, None, :] <= np.asarray(q_pos)[None, :, None], x, -np.inf)
    m = x.max(-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(x - m)
    l = p.sum(-1)
    lse = np.where(l > 0, np.log(np.where(l > 0, l, 1)) + m[..., 0], -np.inf)
    out = np.einsum("aij,jad->iad", p / np.where(l > 0, l, 1)[..., None], v)
    return out, lse.T


def merge(o1, l1, o2, l2):
    m = np.maximum(l1, l2)
    m = np.where(np.isfinite(m), m, 0.0)
    w1, w2 = np.exp(l1 - m), np.exp(l2 - m)
    tot = w1 + w2
    safe = np.where(tot > 0, tot, 1.0)
    lse = np.where(tot > 0, m + np.log(safe), -np.inf)
    return (w1 / safe)[..., None] * o1 + (w2 / safe)[..., None] * o2, lse


def make_ring(attend=block_attention, mrg=merge, rounds=None, source=lambda r, k, n: (r - k) % n):
    def ring_attention(qs, ks, vs, positions, causal=True):
        n = len(qs)
        outs = []
        for r in range(n):
            o = np.zeros_like(qs[r])
            lse = np.full(qs[r].shape[:2], -np.inf)
            for k in range(n if rounds is None else rounds):
                j = source(r, k, n)
                ob, lb = attend(qs[r], ks[j], vs[j], positions[r], positions[j], causal)
                o, lse = mrg(o, lse, ob, lb)
            outs.append(o)
        return outs
    return ring_attention


ring_attention = make_ring()


def zigzag_positions(s, n):
    m = s // (2 * n)
    return [np.r_[np.arange(r * m, (r + 1) * m), np.arange((2 * n - 1 - r) * m, (2 * n - r) * m)]
            for r in range(n)]


def causal_work(positions):
    n = len(positions)
    return np.array([[(positions[(r - k) % n][None, :] <= positions[r][:, None]).sum()
                      for r in range(n)] for k in range(n)])


def ring_time(work):
    return np.asarray(work).max(axis=1).sum()


def seq_to_heads(shards):
    n = len(shards)
    blocks = [np.split(x, n, axis=1) for x in shards]
    return [np.concatenate([blocks[i][j] for i in range(n)], axis=0) for j in range(n)]


def heads_to_seq(shards):
    n = len(shards)
    blocks = [np.split(x, n, axis=0) for x in shards]
    return [np.concatenate([blocks[j][r] for j in range(n)], axis=1) for r in range(n)]


def _gqa_attention(q, k, v, q_pos, k_pos, causal):
    g = q.shape[1] // k.shape[1]
    return block_attention(q, np.repeat(k, g, axis=1), np.repeat(v, g, axis=1), q_pos, k_pos, causal)


def make_ulysses(use_positions=True, back=True):
    def ulysses_attention(qs, ks, vs, positions, causal=True):
        qh, kh, vh = seq_to_heads(qs), seq_to_heads(ks), seq_to_heads(vs)
        pos = np.concatenate(positions) if use_positions else np.arange(sum(map(len, positions)))
        out = [_gqa_attention(qh[j], kh[j], vh[j], pos, pos, causal)[0] for j in range(len(qs))]
        return heads_to_seq(out) if back else out
    return ulysses_attention


ulysses_attention = make_ulysses()


def ulysses_bytes(s, h, n, g=1, e=2):
    local = s / n * h * e
    return (n - 1) / n * (2 * local + 2 * local / g)


RIGHT = {
    "reduce_scatter": reduce_scatter, "all_gather": all_gather, "sp_forward": sp_forward,
    "sp_bytes": sp_bytes, "block_attention": block_attention, "merge": merge,
    "ring_attention": ring_attention, "zigzag_positions": zigzag_positions,
    "causal_work": causal_work, "ring_time": ring_time, "seq_to_heads": seq_to_heads,
    "heads_to_seq": heads_to_seq, "ulysses_attention": ulysses_attention,
    "ulysses_bytes": ulysses_bytes,
}


# --------------------------------------------------------------------------- wrong answers
def _rs_wrong_axis(xs):                       # splits the hidden axis instead of the tokens
    return list(np.split(np.sum(xs, axis=0), len(xs), axis=1))


def _rs_no_sum(xs):                           # keeps its own partial, forgets the other ranks
    t = len(xs)
    c = xs[0].shape[0] // t
    return [x[r * c:(r + 1) * c] for r, x in enumerate(xs)]


def _ag_ring_order(shards):                   # starts with its own shard
    n = len(shards)
    return [np.concatenate(shards[r:] + shards[:r], axis=0) for r in range(n)]


def _ag_wrong_axis(shards):
    full = np.concatenate(shards, axis=1)
    return [full.copy() for _ in shards]


def _sp_op_before_sum(partials, op):          # runs the op on each partial, then reduces
    return all_gather(reduce_scatter([op(x) for x in partials]))


def _sp_is_tp(partials, op):                  # all-reduce, then op on all s tokens
    full = op(np.sum(partials, axis=0))
    return [full.copy() for _ in partials]


def _bytes_no_fraction(s, h, t, e=2):
    return 4 * s * h * e, 4 * s * h * e


def _bytes_half_allreduce(s, h, t, e=2):      # an all-reduce counted like a reduce-scatter
    n = s * h * e
    return 2 * (t - 1) / t * n, 4 * (t - 1) / t * n


def _bytes_no_e(s, h, t, e=2):                # counts elements, not bytes
    return sp_bytes(s, h, t, e=1)


def _ag_one_array(shards):                    # the gathered tensor, but not one per rank
    return np.concatenate(shards, axis=0)


def _sp_no_gather(partials, op):              # stops after the token-wise op
    return [op(x) for x in reduce_scatter(partials)]


def _attn_no_mask(q, k, v, q_pos, k_pos, causal=True):
    return block_attention(q, k, v, q_pos, k_pos, False)


def _attn_row_index_mask(q, k, v, q_pos, k_pos, causal=True):   # compares row numbers
    return block_attention(q, k, v, np.arange(len(q)), np.arange(len(k)), causal)


def _attn_nan_rows(q, k, v, q_pos, k_pos, causal=True):          # softmax of an all -inf row
    x = np.einsum("iad,jad->aij", q, k) / np.sqrt(q.shape[-1])
    if causal:
        x = np.where(np.asarray(k_pos)[None, None, :] <= np.asarray(q_pos)[None, :, None], x, -np.inf)
    m = x.max(-1, keepdims=True)
    p = np.exp(x - m)
    l = p.sum(-1)
    return np.einsum("aij,jad->iad", p / l[..., None], v), (np.log(l) + m[..., 0]).T


def _attn_strict_mask(q, k, v, q_pos, k_pos, causal=True):     # key < query: drops the diagonal
    if not causal:
        return block_attention(q, k, v, q_pos, k_pos, False)
    return block_attention(q, k, v, np.asarray(q_pos) - 0.5, k_pos, True)


def _merge_no_shift(o1, l1, o2, l2):          # overflows for large lse
    with np.errstate(all="ignore"):
        lse = np.log(np.exp(l1) + np.exp(l2))
        return (np.exp(l1 - lse)[..., None] * o1 + np.exp(l2 - lse)[..., None] * o2), lse


def _merge_no_inf_guard(o1, l1, o2, l2):      # max shift, but -inf - (-inf) = NaN
    with np.errstate(all="ignore"):
        m = np.maximum(l1, l2)
        lse = m + np.log(np.exp(l1 - m) + np.exp(l2 - m))
        return (np.exp(l1 - lse)[..., None] * o1 + np.exp(l2 - lse)[..., None] * o2), lse


def _merge_average(o1, l1, o2, l2):
    return (o1 + o2) / 2, np.maximum(l1, l2)


def _zz_off_by_one(s, n):                     # late chunk 2n - r instead of 2n - 1 - r
    m = s // (2 * n)
    return [np.r_[np.arange(r * m, (r + 1) * m),
                  np.arange(((2 * n - r) % (2 * n)) * m, ((2 * n - r) % (2 * n) + 1) * m)]
            for r in range(n)]


def _zz_n_plus_r(s, n):                       # chunks r and n + r
    m = s // (2 * n)
    return [np.r_[np.arange(r * m, (r + 1) * m), np.arange((n + r) * m, (n + r + 1) * m)]
            for r in range(n)]


def _zz_late_chunk_first(s, n):               # right chunks, late one first: not sorted
    return [np.roll(p, -(len(p) // 2)) for p in zigzag_positions(s, n)]


def _work_strict(positions):                  # forgets the diagonal (key == query)
    n = len(positions)
    return np.array([[(positions[(r - k) % n][None, :] < positions[r][:, None]).sum()
                      for r in range(n)] for k in range(n)])


def _work_wrong_direction(positions):         # round k holds the K/V of rank r + k
    n = len(positions)
    return np.array([[(positions[(r + k) % n][None, :] <= positions[r][:, None]).sum()
                      for r in range(n)] for k in range(n)])


def _work_transposed(positions):
    return causal_work(positions).T


def _time_busiest_rank(work):                 # the busiest rank's total
    return np.asarray(work).sum(axis=0).max()


def _time_wrong_axis(work):
    return np.asarray(work).max(axis=0).sum()


def _s2h_wrong_axes(shards):                  # cuts tokens, stacks heads
    n = len(shards)
    blocks = [np.split(x, n, axis=0) for x in shards]
    return [np.concatenate([blocks[i][j] for i in range(n)], axis=1) for j in range(n)]


def _s2h_wrong_index(shards):                 # rank j stacks its own head groups
    n = len(shards)
    blocks = [np.split(x, n, axis=1) for x in shards]
    return [np.concatenate([blocks[j][i] for i in range(n)], axis=0) for j in range(n)]


def _h2s_wrong_index(shards):
    n = len(shards)
    blocks = [np.split(x, n, axis=0) for x in shards]
    return [np.concatenate([blocks[r][j] for j in range(n)], axis=1) for r in range(n)]


def _h2s_is_s2h(shards):
    return seq_to_heads(shards)


def _ulysses_bytes_no_gqa(s, h, n, g=1, e=2):
    return ulysses_bytes(s, h, n, 1, e)


def _ulysses_bytes_full_seq(s, h, n, g=1, e=2):   # forgets that a rank holds s/N_c tokens
    return ulysses_bytes(s, h, n, g, e) * n


WRONG = {
    "reduce_scatter": [_rs_wrong_axis, _rs_no_sum],
    "all_gather": [_ag_ring_order, _ag_wrong_axis, _ag_one_array],
    "sp_forward": [_sp_op_before_sum, _sp_is_tp, _sp_no_gather],
    "sp_bytes": [_bytes_no_fraction, _bytes_half_allreduce, _bytes_no_e],
    "block_attention": [_attn_no_mask, _attn_row_index_mask, _attn_nan_rows, _attn_strict_mask],
    "merge": [_merge_no_shift, _merge_no_inf_guard, _merge_average],
    "ring_attention": [make_ring(attend=_attn_no_mask),            # ignores the causal mask
                       make_ring(attend=_attn_row_index_mask),     # local positions
                       make_ring(rounds=1),                        # forgets the ring
                       make_ring(mrg=_merge_average)],
    "zigzag_positions": [_zz_off_by_one, _zz_n_plus_r, _zz_late_chunk_first],
    "causal_work": [_work_strict, _work_wrong_direction, _work_transposed],
    "ring_time": [_time_busiest_rank, _time_wrong_axis],
    "seq_to_heads": [_s2h_wrong_axes, _s2h_wrong_index],
    "heads_to_seq": [_h2s_wrong_index, _h2s_is_s2h],
    "ulysses_attention": [make_ulysses(use_positions=False), make_ulysses(back=False)],
    "ulysses_bytes": [_ulysses_bytes_no_gqa, _ulysses_bytes_full_seq],
}


def _check(name):
    return getattr(checks, f"check_{name}")


def _stub(*args, **kwargs):
    raise NotImplementedError("write this")


# --------------------------------------------------------------------------- 05 MoE
def route_topk(logits, k):
    experts = np.argsort(-logits, axis=1)[:, :k]
    chosen = np.take_along_axis(logits, experts, axis=1)
    z = np.exp(chosen - chosen.max(axis=1, keepdims=True))
    return experts, z / z.sum(axis=1, keepdims=True)


def make_capacity(rounding=np.ceil, strict=True, token_major=True):
    def capacity_keep(experts, E, capacity_factor):
        N, k = experts.shape
        if capacity_factor is None:
            return np.ones((N, k), dtype=bool)
        C = int(rounding(capacity_factor * k * N / E))
        keep = np.zeros((N, k), dtype=bool)
        seen = np.zeros(E, dtype=int)
        order = [(t, j) for t in range(N) for j in range(k)] if token_major else \
                [(t, j) for j in range(k) for t in range(N)]
        for t, j in order:
            i = experts[t, j]
            if (seen[i] < C) if strict else (seen[i] <= C):
                keep[t, j] = True
            seen[i] += 1
        return keep
    return capacity_keep


def make_moe_stats(count_dropped=False, count_local=False, combine=True, load_before_drop=False):
    def moe_stats(experts, keep, Ne, E, h, e=2):
        N, k = experts.shape
        T = N // Ne
        src = np.repeat(np.arange(Ne), T)[:, None] * np.ones(k, dtype=int)
        dst = experts // (E // Ne)
        sent = keep if not count_dropped else np.ones_like(keep)
        remote = sent & ((src != dst) if not count_local else True)
        dispatch = np.bincount(src[remote], minlength=Ne) * h * e
        back = np.bincount(dst[remote], minlength=Ne) * h * e
        load = np.bincount(dst[np.ones_like(keep) if load_before_drop else keep], minlength=Ne)
        return {"drop_rate": 1 - keep.mean(), "bytes_per_gpu": dispatch + (back if combine else 0),
                "load_per_gpu": load}
    return moe_stats


def switch_aux_loss(probs, experts, alpha=1e-2):
    T, E = probs.shape
    f = np.bincount(experts.ravel(), minlength=E) / experts.size
    return alpha * E * float(f @ probs.mean(axis=0))


def _route_softmax_all(logits, k):            # gates from the softmax over all E experts
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    experts = np.argsort(-logits, axis=1)[:, :k]
    return experts, np.take_along_axis(p, experts, axis=1)


def _route_smallest(logits, k):               # argsort without the minus sign
    experts = np.argsort(logits, axis=1)[:, :k]
    chosen = np.take_along_axis(logits, experts, axis=1)
    z = np.exp(chosen - chosen.max(axis=1, keepdims=True))
    return experts, z / z.sum(axis=1, keepdims=True)


def _route_gates_not_following(logits, k):    # experts sorted by id, gates left best first
    experts = np.sort(np.argsort(-logits, axis=1)[:, :k], axis=1)
    chosen = np.sort(logits, axis=1)[:, ::-1][:, :k]
    z = np.exp(chosen - chosen.max(axis=1, keepdims=True))
    return experts, z / z.sum(axis=1, keepdims=True)


def _aux_f_per_token(probs, experts, alpha=1e-2):   # f_i over T tokens, not T k copies
    T, E = probs.shape
    f = np.bincount(experts.ravel(), minlength=E) / T
    return alpha * E * float(f @ probs.mean(axis=0))


def _aux_no_E(probs, experts, alpha=1e-2):
    return switch_aux_loss(probs, experts, alpha) / probs.shape[1]


RIGHT.update({"route_topk": route_topk, "capacity": make_capacity(), "moe_stats": make_moe_stats(),
              "aux_loss": switch_aux_loss})
WRONG.update({
    "route_topk": [_route_softmax_all, _route_smallest, _route_gates_not_following],
    "capacity": [make_capacity(rounding=np.floor), make_capacity(strict=False),
                 make_capacity(token_major=False)],
    "moe_stats": [make_moe_stats(count_dropped=True), make_moe_stats(count_local=True),
                  make_moe_stats(combine=False), make_moe_stats(load_before_drop=True)],
    "aux_loss": [_aux_f_per_token, _aux_no_E],
})


# --------------------------------------------------------------------------- the course's references
# The same checks accept lesson10's own implementations (through thin adapters: a check
# refuses a lesson10 function passed directly, since that is not the student's work).
def _references():
    from lesson10 import cost, layouts, sim

    def causal_work_ref(positions):
        n, s = len(positions), sum(len(p) for p in positions)
        for layout in layouts.LAYOUTS:
            if all(np.array_equal(a, b) for a, b in zip(positions, layouts.shard_positions(s, n, layout))):
                return layouts.causal_work(n, layout, s=s)
        raise AssertionError("unknown layout")

    return {
        "reduce_scatter": lambda xs: sim.SimGroup(len(xs)).reduce_scatter(xs),
        "all_gather": lambda xs: sim.SimGroup(len(xs)).all_gather(xs),
        "sp_forward": lambda p, op: sim.sp_forward(p, op),
        "sp_bytes": lambda s, h, t, e=2: (2 * cost.all_reduce_bytes(s * h * e, t),
                                          cost.comm_bytes("sp", s, h, t, e=e)),
        "block_attention": lambda q, k, v, qp, kp, causal=True: sim.attention(q, k, v, causal, qp, kp),
        "merge": lambda *a: sim.merge(*a),
        "ring_attention": lambda *a, **kw: sim.ring_attention(*a, **kw),
        "zigzag_positions": lambda s, n: layouts.shard_positions(s, n, "zigzag"),
        "causal_work": causal_work_ref,
        "ring_time": lambda w: layouts.ring_time(w),
        "seq_to_heads": lambda xs: sim.seq_to_heads(xs),
        "heads_to_seq": lambda xs: sim.heads_to_seq(xs),
        "ulysses_attention": lambda *a, **kw: sim.ulysses_attention(*a, **kw),
        "ulysses_bytes": lambda s, h, n, g=1, e=2: cost.comm_bytes("ulysses", s, h, n, g=g, e=e),
        "route_topk": lambda logits, k: sim.route_topk(logits, k),
        "capacity": lambda ex, E, cf: sim.capacity_keep(ex, E, sim.expert_capacity(len(ex), E, ex.shape[1], cf)),
        "aux_loss": lambda p, ex, alpha=1e-2: sim.switch_aux_loss(p, ex, alpha),
    }


@pytest.mark.parametrize("name", sorted(_references()))
def test_course_reference_passes(name, capsys):
    _check(name)(_references()[name], seed=7)
    assert checks.OUTCOMES[-1]["passed"] is True


# --------------------------------------------------------------------------- tests
def test_every_exercise_has_a_check_a_right_answer_and_two_wrong_ones():
    for name in checks.EXERCISES:
        assert callable(_check(name)), name
        assert name in RIGHT, f"no right answer for {name} in this test file"
        assert len(WRONG.get(name, [])) >= 2, f"fewer than two wrong answers for {name}"


@pytest.mark.parametrize("name", sorted(RIGHT))
@pytest.mark.parametrize("seed", [0, 1])
def test_right_answer_passes(name, seed, capsys):
    before = len(checks.OUTCOMES)
    _check(name)(RIGHT[name], seed=seed)
    line = capsys.readouterr().out
    assert "passed" in line and name in line
    assert checks.OUTCOMES[-1]["exercise"] == name
    assert checks.OUTCOMES[-1]["passed"] is True
    assert checks.OUTCOMES[-1]["points"] == checks.EXERCISES[name].points > 0
    assert len(checks.OUTCOMES) == before + 1


@pytest.mark.parametrize("name,wrong", [(n, w) for n, ws in WRONG.items() for w in ws],
                         ids=lambda x: getattr(x, "__name__", str(x)))
def test_wrong_answer_is_rejected(name, wrong, capsys):
    for seed in (0, 1, 2):
        with pytest.raises(CheckFailed) as info, np.errstate(all="ignore"):
            _check(name)(wrong, seed=seed)
        msg = str(info.value)
        assert f"check_{name} failed" in msg
        assert len(msg.splitlines()) >= 2          # where + (yours/target or hint)
        assert checks.OUTCOMES[-1] == {**checks.OUTCOMES[-1], "exercise": name, "passed": False,
                                       "points": 0, "status": "failed"}
    assert "passed" not in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(RIGHT))
def test_stub_is_not_attempted(name, capsys):
    _check(name)(_stub)
    out = capsys.readouterr().out
    assert "not attempted" in out
    assert checks.OUTCOMES[-1]["status"] == "not attempted"
    assert checks.OUTCOMES[-1]["points"] == 0


def test_failure_message_shows_yours_and_target_and_location():
    with pytest.raises(CheckFailed) as info:
        checks.check_merge(_merge_no_shift, seed=3)
    msg = str(info.value)
    assert "yours" in msg and "target" in msg and "hint" in msg
    assert "query" in msg and "head" in msg
    with pytest.raises(CheckFailed) as info:
        checks.check_ring_attention(make_ring(attend=_attn_no_mask), seed=3)
    assert "without the causal mask" in str(info.value) and "causal=True" in str(info.value)


def test_student_exception_becomes_check_failed():
    def broken(xs):
        return xs[99]
    with pytest.raises(CheckFailed, match="IndexError"):
        checks.check_reduce_scatter(broken, seed=0)


def test_reference_function_is_not_accepted_as_an_answer():
    from lesson10.sim.attention import merge as reference
    with pytest.raises(CheckFailed, match="reference"):
        checks.check_merge(reference)


def test_passing_a_result_instead_of_a_function_is_a_clear_error():
    with pytest.raises(TypeError, match="function itself"):
        checks.check_ring_time(3.0)


def test_outcomes_go_to_the_grade_file(tmp_path, monkeypatch, capsys):
    path = tmp_path / "grades.jsonl"
    monkeypatch.setenv(checks.GRADE_FILE_ENV, str(path))
    checks.check_ring_time(ring_time, seed=0)
    checks.check_zigzag_positions(_stub)
    with pytest.raises(CheckFailed):
        checks.check_causal_work(_work_strict, seed=0)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["exercise"], r["status"], r["points"]) for r in rows] == [
        ("ring_time", "passed", checks.EXERCISES["ring_time"].points),
        ("zigzag_positions", "not attempted", 0),
        ("causal_work", "failed", 0)]
    assert all(r["notebook"] == "03_load_balance" for r in rows)


def test_fresh_cases_each_call(capsys):
    seen = []

    def spy(s, n):
        seen.append((s, n))
        return zigzag_positions(s, n)
    checks.check_zigzag_positions(spy)
    first = list(seen)
    seen.clear()
    checks.check_zigzag_positions(spy)
    # unseeded: new random sizes every call (5 of the 6 cases are random, 28 choices each:
    # two calls agree with probability 28**-5, about 6e-8)
    assert first != seen


def test_fallback_uses_the_reference_only_while_the_stub_is_there(capsys, monkeypatch):
    monkeypatch.setattr(checks.core, "_FALLBACK_SAID", set())     # as in a fresh kernel
    calls = []

    def mine(x):
        raise NotImplementedError

    def ref(x):
        calls.append(x)
        return -x
    f = checks.fallback(mine, ref)
    assert f(2) == -2 and f(3) == -3 and calls == [2, 3]
    out = capsys.readouterr().out
    assert out.count("not written yet") == 1 and "mine" in out     # said once, by name

    def written(x):
        return x + 1
    assert checks.fallback(written, ref)(2) == 3 and calls == [2, 3]


def test_a_stub_inside_the_function_counts_as_not_attempted(capsys):
    def sp(partials, op):            # the student wrote sp_forward on top of a stubbed helper
        return all_gather([op(x) for x in _stub(partials)])
    checks.check_sp_forward(sp)
    assert "not attempted" in capsys.readouterr().out
