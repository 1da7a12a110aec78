"""The check framework: outcomes, messages, stubs, fixed seeds, the input-mutation and
type checks. Right and wrong answers per exercise: tests/test_checks_answers.py."""

import numpy as np
import pytest

import answers_01_03 as a1
import answers_04_05 as a4
from lesson10 import checks
from lesson10.checks import CheckFailed


def _check(name):
    return getattr(checks, f"check_{name}")


def _stub(*args, **kwargs):
    raise NotImplementedError("write this")


# --------------------------------------------------------------------------- the course's references
# The same checks accept lesson10's own implementations (through thin adapters: a check
# refuses a lesson10 function passed directly, since that is not the student's work).
def _references():
    from lesson10 import cost, layouts, sim

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
@pytest.mark.parametrize("name", sorted(checks.EXERCISES))
def test_stub_is_not_attempted(name, capsys):
    _check(name)(_stub)
    out = capsys.readouterr().out
    assert "not attempted" in out
    assert checks.OUTCOMES[-1]["status"] == "not attempted"
    assert checks.OUTCOMES[-1]["points"] == 0


def test_without_a_seed_every_call_sees_the_same_cases_and_a_seed_changes_them(capsys):
    def spy_on(log):
        def zigzag_positions(s, n):
            log.append((s, n))
            return a1.zz_concat(s, n)
        return zigzag_positions
    first, second, other = [], [], []
    checks.check_zigzag_positions(spy_on(first))
    checks.check_zigzag_positions(spy_on(second))
    checks.check_zigzag_positions(spy_on(other), seed=checks.core.seed_of("zigzag_positions") + 1)
    assert first == second
    assert first != other
    assert first[:6] == other[:6]                      # the fixed cases always run


def test_the_grader_rng_drives_the_random_batch():
    seen = {}
    for seed in (1, 2):
        log = []

        def ring_time(work, _log=log):
            _log.append(np.asarray(work).tolist())
            return np.asarray(work).max(axis=1).sum()
        checks.EXERCISES["ring_time"].body(ring_time, np.random.default_rng(seed))
        seen[seed] = log
    assert seen[1] != seen[2]


def test_a_wrong_answer_fails_the_same_way_every_run():
    msgs = set()
    for _ in range(3):
        with pytest.raises(CheckFailed) as info:
            checks.check_capacity(a4.make_capacity(rounding=np.ceil))
        msgs.add(str(info.value))
    assert len(msgs) == 1
    msg = msgs.pop()
    assert "capacity_factor=1.1" in msg and "C = 66" in msg and "67" in msg   # the float ceil


def test_in_place_change_of_an_input_is_named():
    with pytest.raises(CheckFailed, match=r"changed its input xs\[0\] in place"):
        checks.check_reduce_scatter(a1.rs_in_place)
    with pytest.raises(CheckFailed, match=r"changed its input partials\[0\] in place"):
        checks.check_sp_forward(a1.sp_in_place)
    with pytest.raises(CheckFailed, match=r"changed its input work in place"):
        checks.check_ring_time(a1.time_sorts_input)
    with pytest.raises(CheckFailed, match=r"changed its input o1 in place"):
        checks.check_merge(a1.merge_into_o1)
    with pytest.raises(CheckFailed, match=r"changed its input shards\[0\] in place"):
        checks.check_all_gather(a1.ag_overwrites)


def test_integer_ids_and_boolean_masks_are_checked_not_coerced():
    with pytest.raises(CheckFailed, match="integer array, got dtype float64"):
        checks.check_zigzag_positions(a1.zz_float)
    with pytest.raises(CheckFailed, match="experts must be an integer array"):
        checks.check_route_topk(a4.route_float_ids)
    with pytest.raises(CheckFailed, match="keep must be a boolean array"):
        checks.check_capacity(a4.make_capacity(as_int=True))


def test_any_pair_is_accepted_and_a_non_pair_is_explained(capsys):
    checks.check_sp_bytes(a1.bytes_array)                      # a NumPy array of two numbers
    checks.check_sp_bytes(a1.bytes_int_list)                   # a list
    assert checks.OUTCOMES[-1]["passed"]
    with pytest.raises(CheckFailed, match="return a pair"):
        checks.check_sp_bytes(a1.bytes_only_sp)


def test_route_topk_says_best_first_and_ties():
    with pytest.raises(CheckFailed, match="not best first"):
        checks.check_route_topk(a4.route_sorted_by_id)
    with pytest.raises(CheckFailed, match="a tie"):
        checks.check_route_topk(a4.route_ties_high)


def test_seq_to_heads_must_raise_when_the_heads_do_not_split(capsys):
    with pytest.raises(CheckFailed, match="instead of raising"):
        checks.check_seq_to_heads(a4.s2h_no_check)
    checks.check_seq_to_heads(a4.s2h_slices)                   # raises ValueError itself
    assert checks.OUTCOMES[-1]["passed"]


def test_summary_labels_are_the_function_names(capsys):
    checks.check_capacity(_stub)
    checks.check_aux_loss(_stub)
    capsys.readouterr()
    checks.summary()
    out = capsys.readouterr().out
    assert "capacity_keep" in out and "switch_aux_loss" in out
    for ex in checks.EXERCISES.values():
        assert ex.function, ex.id
    assert {ex.function for ex in checks.EXERCISES.values()} >= {"capacity_keep", "switch_aux_loss",
                                                                 "route_topk", "moe_stats"}


def test_failure_message_shows_yours_and_target_and_location():
    with pytest.raises(CheckFailed) as info:
        checks.check_merge(a1.merge_no_shift, seed=3)
    msg = str(info.value)
    assert "yours" in msg and "target" in msg and "hint" in msg
    assert "query" in msg and "head" in msg
    with pytest.raises(CheckFailed) as info:
        checks.check_ring_attention(a1.make_ring(attend=a1.attn_no_mask), seed=3)
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


def test_outcomes_are_recorded_for_the_summary(capsys):
    checks.check_ring_time(a1.time_numpy, seed=0)
    checks.check_zigzag_positions(_stub)
    with pytest.raises(CheckFailed):
        checks.check_causal_work(a1.work_strict, seed=0)
    rows = checks.OUTCOMES[-3:]
    assert [(r["exercise"], r["status"], r["points"]) for r in rows] == [
        ("ring_time", "passed", checks.EXERCISES["ring_time"].points),
        ("zigzag_positions", "not attempted", 0),
        ("causal_work", "failed", 0)]
    assert all(r["notebook"] == "03_load_balance" for r in rows)
    capsys.readouterr()
    checks.summary()
    out = capsys.readouterr().out
    assert "causal_work" in out and "failed" in out and "not attempted" in out


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
        return a1.ag_concat([op(x) for x in _stub(partials)])
    checks.check_sp_forward(sp)
    assert "not attempted" in capsys.readouterr().out


@pytest.mark.parametrize("order", [
    lambda cf, k, N, E: cf * k * N / E, lambda cf, k, N, E: k * N * cf / E,
    lambda cf, k, N, E: cf * N * k / E, lambda cf, k, N, E: cf * (k * N / E),
    lambda cf, k, N, E: cf * (k * N) / E, lambda cf, k, N, E: k * N / E * cf])
def test_capacity_in_floats_is_rejected_whatever_the_order_of_the_product(order):
    """Each order of the float product CF k N / E lands above an integer in one of the
    fixed cases (the exact C is computed with fractions)."""
    import math

    def capacity_keep(experts, E, capacity_factor):
        N, k = experts.shape
        if capacity_factor is None:
            return np.ones((N, k), dtype=bool)
        C = math.ceil(order(capacity_factor, k, N, E))
        seen = np.zeros(E, dtype=int)
        keep = np.zeros((N, k), dtype=bool)
        for t in range(N):
            for j in range(k):
                keep[t, j] = seen[experts[t, j]] < C
                seen[experts[t, j]] += 1
        return keep
    with pytest.raises(CheckFailed, match="exactly"):
        checks.check_capacity(capacity_keep)
