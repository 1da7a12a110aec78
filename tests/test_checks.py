"""The check framework: outcomes, messages, stubs, fixed seeds, the input-mutation and
type checks. Right and wrong answers per exercise: tests/test_checks_answers.py."""

import contextlib
import io
import math

import answers_01_03 as a1
import answers_04_05 as a4
import numpy as np
import pytest

from lesson10 import checks, layouts, sim
from lesson10.checks import CheckFailed


def _check(name):
    return getattr(checks, f"check_{name}")


def _stub(*args, **kwargs):
    raise NotImplementedError("write this")


# --------------------------------------------------------------------------- the course's references
# The same checks accept lesson10's own implementations (through thin adapters: a check
# refuses a lesson10 function passed directly, since that is not the student's work).
def _sp_reference(partials, op, reduce_scatter, all_gather):
    """The course's sp_forward, on a group whose collectives are the ones the check serves."""
    from lesson10 import sim

    class Served(sim.SimGroup):
        def reduce_scatter(self, xs, axis=0):
            return reduce_scatter(xs)

        def all_gather(self, xs, axis=0):
            return all_gather(xs)
    return sim.sp_forward(partials, op, group=Served(len(partials)))


def _ring_reference(*args, block_attention, merge, **kwargs):
    """The course's ring_attention, with the kernel and the merge the check serves."""
    from unittest import mock

    from lesson10 import sim
    from lesson10.sim import ring

    def attend(q, k, v, causal, q_pos, k_pos, doc_ids=None):
        return block_attention(q, k, v, q_pos, k_pos, causal)
    with mock.patch.object(ring, "attention", attend), mock.patch.object(ring, "merge", merge):
        return sim.ring_attention(*args, **kwargs)


def _references():
    from lesson10 import cost, layouts, sim

    return {
        "reduce_scatter": lambda xs: sim.SimGroup(len(xs)).reduce_scatter(xs),
        "all_gather": lambda xs: sim.SimGroup(len(xs)).all_gather(xs),
        "sp_forward": _sp_reference,
        "sp_bytes": lambda s, h, t, e=2: (2 * cost.all_reduce_bytes(s * h * e, t),
                                          cost.comm_bytes("sp", s, h, t, e=e)),
        "block_attention": lambda q, k, v, qp, kp, causal=True: sim.attention(q, k, v, causal, qp, kp),
        "merge": lambda *a: sim.merge(*a),
        "ring_attention": _ring_reference,
        "zigzag_positions": lambda s, n: layouts.shard_positions(s, n, "zigzag"),
        "ring_time": lambda w: layouts.ring_time(w),
        "seq_to_heads": lambda xs, group: sim.seq_to_heads(xs, group),
        "heads_to_seq": lambda xs, group: sim.heads_to_seq(xs, group),
        "ulysses_attention": lambda *a, **kw: sim.ulysses_attention(*a, **kw),
        "ulysses_bytes": lambda s, h, n, g=1, e=2: cost.comm_bytes("ulysses", s, h, n, g=g, e=e),
        "route_topk": lambda logits, k: sim.route_topk(logits, k),
        "capacity": lambda ex, E, cf: sim.keep_within_capacity(ex, E, sim.expert_capacity(len(ex), E, ex.shape[1], cf)),

        "aux_loss": lambda p, ex, alpha=1e-2: sim.switch_aux_loss(p, ex, alpha),
    }


@pytest.fixture()
def course_code_allowed(monkeypatch):
    """The course's own code as the answer: the check cell refuses it in a student's
    function (lesson10/checks/refused.py), so these tests lift that rule."""
    from lesson10.checks import refused
    monkeypatch.setattr(refused, "WITHHELD", {})


@pytest.mark.usefixtures("course_code_allowed")
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
            checks.check_capacity(a4.make_capacity(rounding=np.floor))
        msgs.add(str(info.value))
    assert len(msgs) == 1
    msg = msgs.pop()
    assert "capacity_factor=0.75, so C = 23" in msg and "yours : 22" in msg
    assert "rounded down" in msg                                # the hint names the mistake
    with pytest.raises(CheckFailed, match=r"capacity_factor=1\.1, so C = 66\)"):
        checks.check_capacity(a4.make_capacity(rounding=lambda x: math.floor(round(x, 6)) - 1))


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


def test_route_topk_says_best_first_and_accepts_any_order_of_ties(capsys):
    with pytest.raises(CheckFailed, match="not best first"):
        checks.check_route_topk(a4.route_sorted_by_id)
    with pytest.raises(CheckFailed, match="chose an expert twice"):
        checks.check_route_topk(a4.route_best_repeated)
    for answer in (a4.route_ties_high, a4.route_default_sort, a4.route_stable):
        checks.check_route_topk(answer)
        assert checks.OUTCOMES[-1]["passed"]


def test_seq_to_heads_must_raise_when_the_heads_do_not_split(capsys):
    with pytest.raises(CheckFailed, match="instead of raising"):
        checks.check_seq_to_heads(a4.s2h_no_check)
    checks.check_seq_to_heads(a4.s2h_slices)                   # raises ValueError itself
    assert checks.OUTCOMES[-1]["passed"]
    with pytest.raises(CheckFailed, match="raised AssertionError.*asks for a ValueError"):
        checks.check_seq_to_heads(a4.s2h_assert)


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
        checks.check_ring_attention(a1.make_ring(causal_override=False), seed=3)
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
    monkeypatch.setattr(checks.feedback, "_SAID", set())          # as in a fresh kernel
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


def test_fallback_stands_in_for_a_function_its_check_judged_wrong(capsys, monkeypatch):
    """A function whose latest check failed is replaced by the reference, and the cell says
    why; once a new version passes, the student's own function runs again."""
    monkeypatch.setattr(checks.feedback, "_SAID", set())
    monkeypatch.setenv("LESSON10_STRICT_CHECKS", "0")            # shown, as in a notebook
    checks.check_ring_time(a1.time_mean)
    out = capsys.readouterr().out
    assert out.startswith("check_ring_time failed") and "hint:" in out
    use = checks.fallback(a1.time_mean, lambda w: "reference")
    assert use(np.ones((2, 2))) == "reference" and use(np.ones((2, 2))) == "reference"
    out = capsys.readouterr().out
    assert out.count("did not pass check_ring_time") == 1 and "time_mean" in out
    checks.check_ring_time(a1.time_numpy)                      # another function passes
    assert checks.fallback(a1.time_numpy, lambda w: "reference")(np.ones((2, 2))) == 2.0
    assert checks.fallback(a1.time_loop, lambda w: "reference")(np.ones((2, 2))) == 2.0   # never judged


def test_a_failed_check_is_shown_not_raised_in_a_notebook(capsys, monkeypatch):
    monkeypatch.setenv("LESSON10_STRICT_CHECKS", "0")
    assert checks.check_merge(a1.merge_no_shift) is None
    out = capsys.readouterr().out
    assert out.startswith("check_merge failed") and "yours" in out and "hint:" in out
    assert "Traceback" not in out and "lesson10" not in out
    assert checks.OUTCOMES[-1]["status"] == "failed"
    checks.check_ring_time(3.0)                                # a value, not a function
    assert "takes your function itself" in capsys.readouterr().out


def test_the_kernel_decides_when_no_variable_is_set(monkeypatch):
    from lesson10.checks import feedback
    monkeypatch.delenv("LESSON10_STRICT_CHECKS", raising=False)
    assert feedback.raising()                                  # pytest: no IPython shell
    monkeypatch.setattr(feedback, "_shell", lambda: object())
    assert not feedback.raising()                              # a kernel: shown
    monkeypatch.setenv("LESSON10_STRICT_CHECKS", "1")
    assert feedback.raising()                                  # the solutions under nbval


def test_an_exception_of_the_students_code_shows_their_frames_only(capsys, monkeypatch):
    monkeypatch.setenv("LESSON10_STRICT_CHECKS", "0")

    def reduce_scatter(xs):
        return helper(xs)

    def helper(xs):
        return xs[99]                                          # the line that raises
    checks.check_reduce_scatter(reduce_scatter)
    out = capsys.readouterr().out
    assert out.startswith("check_reduce_scatter failed: reduce_scatter raised IndexError")
    assert "Traceback of your code" in out and "return xs[99]" in out and "in helper" in out
    assert "lesson10" not in out                                # no frame of the checks
    assert out.index("Traceback") < out.index("hint:")


def test_a_raised_check_failed_renders_as_its_text_in_ipython():
    with pytest.raises(CheckFailed) as info:
        checks.check_merge(a1.merge_no_shift)
    assert info.value._render_traceback_() == str(info.value).splitlines()


def test_a_stub_inside_the_function_counts_as_not_attempted(capsys):
    def sp(partials, op, reduce_scatter=None, all_gather=None):   # on top of a stubbed helper
        return all_gather([op(x) for x in _stub(partials)])
    checks.check_sp_forward(sp)
    assert "not attempted" in capsys.readouterr().out


_ORDERS = [lambda cf, k, N, E: cf * k * N / E, lambda cf, k, N, E: k * N * cf / E,
           lambda cf, k, N, E: cf * N * k / E, lambda cf, k, N, E: cf * (k * N / E),
           lambda cf, k, N, E: cf * (k * N) / E, lambda cf, k, N, E: k * N / E * cf,
           lambda cf, k, N, E: cf * k * (N / E), lambda cf, k, N, E: N * cf / E * k]


def _capacity_with(C_of):

    def capacity_keep(experts, E, capacity_factor):
        N, k = experts.shape
        if capacity_factor is None:
            return np.ones((N, k), dtype=bool)
        C = C_of(capacity_factor, k, N, E)
        seen = np.zeros(E, dtype=int)
        keep = np.zeros((N, k), dtype=bool)
        for t in range(N):
            for j in range(k):
                keep[t, j] = seen[experts[t, j]] < C
                seen[experts[t, j]] += 1
        return keep
    return capacity_keep


@pytest.mark.parametrize("order", _ORDERS)
def test_capacity_in_floats_is_rejected_whatever_the_order_of_the_product(order):
    """The notebook's rule: compute C exactly. math.ceil(CF k N / E) in floats fails, in
    every order: a fixed case lands a hair above an integer (1.1 * 360 / 6 is
    66.00000000000001, C = 66), and the hint names the float rounding."""
    import math
    with pytest.raises(CheckFailed, match="computed from the float 1.1 it comes out"):
        checks.check_capacity(_capacity_with(lambda cf, k, N, E: math.ceil(order(cf, k, N, E))))


def test_capacity_one_more_than_c_is_rejected_at_every_exact_integer():
    """floor(x) + 1 equals the ceiling wherever x = CF k N / E is not an integer; at the
    integer products (the float traps and CF 1.5, 1.25, 1.0 alike) it keeps C + 1, and the
    hint names < C, not the float rounding (it fails where the floats are exact too)."""
    import math
    with pytest.raises(CheckFailed, match="one copy more than C = 66: a copy is kept while fewer"):
        checks.check_capacity(_capacity_with(lambda cf, k, N, E: math.floor(cf * k * N / E) + 1))


# --------------------------------------------------------------------------- served objects
# The ring's network, the all-to-all network and the Ulysses kernel make the method
# observable; each rule rejects a wrong answer with a message that names it.
def _ring_catching(q_shards, k_shards, v_shards, positions, causal=True, group=None, **served):
    """Shifts once too often, catches the network's complaint and carries on."""
    ring = a1.make_ring(shifts=lambda n: n)
    try:
        return ring(q_shards, k_shards, v_shards, positions, causal, group, **served)
    except Exception:  # noqa: BLE001 - the wrong answer swallows whatever the network raises
        return a1.make_ring(read="inputs", shifts=lambda n: 0)(q_shards, k_shards, v_shards,
                                                               positions, causal, **served)


def _ring_short_list(q_shards, k_shards, v_shards, positions, causal=True, group=None, **served):
    group.ring_shift(k_shards[:-1])                   # forgets the last rank
    return a1.make_ring()(q_shards, k_shards, v_shards, positions, causal, group, **served)


@pytest.mark.parametrize("answer,pattern", [
    (a1.make_ring(read="inputs", shifts=lambda n: 0), "k is the K block of rank 3; rank 0 holds "
                                                      "the K block of rank 0 now"),
    (a1.make_ring(rounds=lambda n: n - 1), r"moved 2 times, N_c - 1 = 3 are needed: rank 0 "
                                           r"never received the K blocks of ranks \[1\]"),
    (a1.make_ring(shifts=lambda n: n), "for the 4th time.*never used"),
    (_ring_catching, "for the 4th time.*never used"),
    (a1.make_ring(send="own"), "sent the K block of rank 0, but the block it holds is rank 3's"),
    (a1.make_ring(send="inputs"), r"as k_shards\[\d\] holds it, not the copy it received"),
    (a1.make_ring(read="inputs"), r"as k_shards\[3\] holds it, not the copy the ring delivered"),
    (a1.ring_gathers, "sent 4 K blocks at once.*gathering"),
    (a1.ring_stacked_kv, "none of the K, V or positions blocks"),
    (a1.ring_all_gather, "offers only ring_shift"),
    (_ring_short_list, "one entry per rank"),
])
def test_ring_rules(answer, pattern):
    with pytest.raises(CheckFailed, match="(?s)" + pattern):
        checks.check_ring_attention(answer)


def _s2h_catching(shards, group):
    """Sends its blocks twice and ignores the complaint."""
    out = a4.s2h_split(shards, group)
    try:
        group.all_to_all([np.split(x, len(shards), axis=1) for x in shards])
    except Exception:  # noqa: BLE001 - the wrong answer swallows whatever the network raises
        pass
    return out


@pytest.mark.parametrize("exercise,answer,pattern", [
    ("seq_to_heads", a4.s2h_never_calls, "never called group.all_to_all"),
    ("seq_to_heads", a4.s2h_twice, r"blocks\[0\]\[1\] of all_to_all call 1.*has shape"),
    ("seq_to_heads", _s2h_catching, "all_to_all was called 2 times; seq_to_heads needs exactly 1"),
    ("seq_to_heads", a4.s2h_strided_heads, r"holds other values: it should be heads"),
    ("seq_to_heads", a4.s2h_for_show, "network delivers other values.*head shard differs"),
    ("seq_to_heads", a4.s2h_no_check, "sent blocks to all_to_all instead of raising"),
    ("heads_to_seq", a4.h2s_no_exchange, "never called group.all_to_all"),
    ("heads_to_seq", a4.h2s_strided_tokens, r"it should be tokens 0\.\.1 of rank 0's shard"),
    ("heads_to_seq", a4.h2s_for_show, "network delivers other values.*sequence shard differs"),
])
def test_all_to_all_rules(exercise, answer, pattern):
    with pytest.raises(CheckFailed, match="(?s)" + pattern):
        getattr(checks, f"check_{exercise}")(answer)


@pytest.mark.parametrize("answer,pattern", [
    (a4.ulysses_whole_sequence, "all 4 heads of the whole sequence"),
    (a4.ulysses_per_rank, "one rank's 2 tokens with all heads"),
    (a4.ulysses_own_attention, r"all_to_all call 4.*holds other values.*what attention returned"),
    (a4.ulysses_no_kernel, "what attention returned"),
    (a4.ulysses_local_slices, "Q never went through all_to_all"),
    (a4.ulysses_twice, "head group 0 a second time"),
    (a4.ulysses_sorted_tokens, "in another order than seq_to_heads stacks them"),
    (a4.make_ulysses(tile=True), "K/V have a_kv = 2 heads \\(GQA\\)"),
    (a4.make_ulysses(back=False), "output never went through all_to_all"),
    (a4.make_ulysses(s2h=a4.s2h_strided_heads), "carries none of the blocks Ulysses sends"),
])
def test_ulysses_rules(answer, pattern):
    with pytest.raises(CheckFailed, match="(?s)" + pattern):
        checks.check_ulysses_attention(answer)


def test_a_kernel_that_is_never_called_is_named():
    def uly(q_shards, k_shards, v_shards, positions, causal=True, group=None, attention=None):
        qh = [a4.s2h_split(x, group) for x in (q_shards, k_shards, v_shards)]
        pos = np.concatenate(positions)
        return a4.h2s_split([a4._own_attention(*(t[j] for t in qh), pos, pos, causal)[0]
                             for j in range(len(q_shards))], group)
    body = checks.EXERCISES["ulysses_attention"].body
    with pytest.raises(CheckFailed, match="what attention returned|never called the attention"):
        body(uly, np.random.default_rng(0))


def test_locally_cut_head_groups_fail_where_the_network_substitutes():
    """Without substitution, head groups cut from the inputs look like the delivered ones;
    with it the kernel sees the difference and says why."""
    from lesson10.checks import network
    from lesson10.checks.nb04_ulysses import _ulysses_case
    rng = np.random.default_rng(1)
    qs, ks, vs = ([rng.standard_normal((2, 4, 3)) for _ in range(2)] for _ in range(3))
    referee = network.Referee("ulysses_attention", "a case")
    net, kernel, _ = _ulysses_case(rng, referee, qs, ks, vs, swap=True)
    with pytest.raises(CheckFailed, match="as q_shards hold it, not as all_to_all delivered it"):
        network.served_call(referee, "ulysses_attention", a4.ulysses_local_slices, (), qs, ks, vs,
                            [np.arange(2), np.arange(2, 4)], group=net, attention=kernel)


def test_every_random_batch_substitutes_and_the_fixed_cases_never_do():
    from lesson10.checks.nb02_ring_attention import _ring_cases
    from lesson10.checks.nb04_ulysses import _a2a_cases, _ulysses_cases
    for seed in range(20):
        for cases, fixed, flag in ((_ring_cases(np.random.default_rng(seed)), 9, 4),
                                   (_ulysses_cases(np.random.default_rng(seed)), 7, -1),
                                   (_a2a_cases(np.random.default_rng(seed)), 7, -1)):
            flags = [case[flag] for case in cases]
            assert not any(flags[:fixed])
            assert 2 <= sum(flags[fixed:]) < len(flags) - fixed
    for _layout, _causal, n, _s, swap, _ in _ring_cases(np.random.default_rng(3)):
        assert n >= 3 or not swap                     # a substituted block is passed on


def test_served_networks_offer_only_their_wire_methods():
    from lesson10.checks import network
    ref = network.Referee("ring_attention", "here")
    net = network.RingNetwork(ref, [np.ones((1, 1, 1))] * 2, [np.zeros((1, 1, 1))] * 2,
                              [np.arange(1), np.arange(1, 2)])
    assert network.RingNetwork.__wire_methods__ == ("ring_shift",)
    assert network.AllToAllNetwork.__wire_methods__ == ("all_to_all",)
    with pytest.raises(AttributeError, match="offers only ring_shift"):
        _ = net.bytes_sent
    assert [m for m in dir(net) if not m.startswith("_")] == ["ring_shift"]
    assert "network" in repr(net)


def test_the_simulator_group_works_in_a_students_own_cells():
    """A student passes group=SimGroup(n): tuple entries travel, bytes are counted."""
    from lesson10 import layouts, sim
    rng = np.random.default_rng(0)
    n, s, a, d = 4, 8, 2, 3
    q, k, v = (rng.standard_normal((s, a, d)) for _ in range(3))
    pos = layouts.shard_positions(s, n, "zigzag")
    group = sim.SimGroup(n)
    out = a1.ring_tuple([q[p] for p in pos], [k[p] for p in pos], [v[p] for p in pos], pos,
                        group=group)
    full = sim.attention(q, k, v, causal=True)[0]
    assert max(np.abs(o - full[p]).max() for o, p in zip(out, pos)) < 1e-12
    c = s // n
    assert group.bytes_sent.tolist() == [(n - 1) * (2 * c * a * d + c) * 2] * n   # K, V, positions
    g2 = sim.SimGroup(n)
    with pytest.raises(ValueError):                    # 2 heads over 4 ranks
        a4.s2h_slices([q[p] for p in pos], g2)
    x = rng.standard_normal((s, 2 * n, d))
    heads = a4.s2h_split(np.split(x, n), g2)
    assert [np.shape(h) for h in heads] == [(s, 2, d)] * n
    back = a4.h2s_split(heads, g2)
    assert all(np.array_equal(b, y) for b, y in zip(back, np.split(x, n)))


# --------------------------------------------------------------------------- the grader's wire
def _copy(x):
    """A deep copy of plain data, as the wire delivers it (subclasses become base types)."""
    if isinstance(x, np.ndarray):
        return np.array(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_copy(y) for y in x)
    if isinstance(x, dict):
        return {k: _copy(y) for k, y in x.items()}
    return x


class _Stub:
    """What the student's side gets for a network: stubs of its wire methods, nothing else."""

    def __init__(self, obj):
        for name in type(obj).__wire_methods__:
            method = getattr(obj, name)
            setattr(self, name, lambda *a, _m=method, **kw: _copy(_m(*_copy(a), **_copy(kw))))


def _over_the_wire(fn):
    """``fn`` called as the judge calls it: copies of the arguments, networks as stubs,
    callables as call-backs with copied arguments; changes to the arguments are copied back."""
    def side(x):
        if hasattr(type(x), "__wire_methods__"):
            return _Stub(x)
        if callable(x):
            return lambda *a, _f=x, **kw: _copy(_f(*_copy(a), **_copy(kw)))
        return _copy(x)

    def proxy(*args, **kwargs):
        theirs = [side(a) for a in args]
        out = fn(*theirs, **{k: side(v) for k, v in kwargs.items()})
        for mine, back in zip(args, theirs):
            if isinstance(mine, list) and isinstance(back, list):
                mine[:] = back
            elif isinstance(mine, np.ndarray) and isinstance(back, np.ndarray) and mine.shape == back.shape:
                mine[...] = back
        return _copy(out)
    return proxy


@pytest.mark.parametrize("exercise", ["ring_attention", "seq_to_heads", "heads_to_seq",
                                      "ulysses_attention"])
def test_the_verdict_is_the_same_through_the_wire(exercise):
    from test_checks_answers import RIGHT, WRONG
    body = checks.EXERCISES[exercise].body
    for fn, right in [(f, True) for f in RIGHT[exercise]] + [(f, False) for f in WRONG[exercise]]:
        verdicts = []
        for call in (fn, _over_the_wire(fn)):
            try:
                with np.errstate(all="ignore"):
                    body(call, np.random.default_rng(5))
                verdicts.append(True)
            except (CheckFailed, checks.core.StudentError):
                verdicts.append(False)
        assert verdicts == [right, right], (exercise, getattr(fn, "__qualname__", fn))


# --------------------------------------------------------------------------- ranges
def _inputs(exercise, seeds=range(20), fixed=0):
    """The arguments the random batches of ``exercise`` pass, over ``seeds`` (after the
    ``fixed`` fixed cases of each batch)."""
    seen = []
    for seed in seeds:
        body = checks.EXERCISES[exercise].body
        calls = []

        def record(*args, _calls=calls):
            _calls.append(args)
            return _answer[exercise](*args)
        body(record, np.random.default_rng(seed))
        seen += calls[fixed:]
    return seen


_answer = {"zigzag_positions": a1.zz_concat, "sp_bytes": a1.bytes_tuple,
           "ulysses_bytes": a4.ub_formula, "capacity": a4.cap_fraction_loops,
           "causal_work": a1.work_loops}


def test_few_input_exercises_draw_from_ranges_too_large_to_tabulate():
    for seed in range(20):                      # every batch holds large cases
        zz = _inputs("zigzag_positions", [seed], fixed=8)
        assert sum(n >= 8 and s // (2 * n) >= 45 for s, n in zz) >= 3, zz
        sp = _inputs("sp_bytes", [seed], fixed=7)
        assert sum(t >= 32 and s >= 90 * t for s, _, t, _ in sp) >= 4, sp
        ub = _inputs("ulysses_bytes", [seed], fixed=8)
        assert sum(n >= 16 and s >= 90 * n for s, _, n, _, _ in ub) >= 4, ub
    zz = _inputs("zigzag_positions", fixed=8)
    assert len(set(zz)) >= 0.9 * len(zz) and max(n for _, n in zz) >= 48
    cf = {args[2] for args in _inputs("capacity", fixed=9)}
    assert len(cf) >= 60                                           # not a short list of factors
    ids = [args[0] for args in _inputs("causal_work", seeds=[0], fixed=9)]
    shuffled = [p for p in ids if not all(np.array_equal(np.sort(x), x) for x in p)]
    assert len(shuffled) >= 3                                      # random ids in every batch


def test_an_old_signature_without_the_network_is_explained():
    def ring_attention(q_shards, k_shards, v_shards, positions, causal=True):
        return q_shards

    def seq_to_heads(shards):
        return shards
    with pytest.raises(CheckFailed, match=r"hint: the check calls it as ring_attention\(.*group=network\)"):
        checks.check_ring_attention(ring_attention)
    with pytest.raises(CheckFailed, match=r"hint: the check calls it as seq_to_heads\(shards, group\)"):
        checks.check_seq_to_heads(seq_to_heads)


# --------------------------------------------------------------------------- bad input
# (each case was found misbehaving before its validation was added)

def _right_then(transform, right):
    def student(*args, **kwargs):
        return transform(right(*args, **kwargs))
    return student


def _run_check(name, fn):
    with contextlib.redirect_stdout(io.StringIO()):
        getattr(checks, "check_" + name)(fn, seed=1)


@pytest.mark.parametrize("name,ref", [
    ("reduce_scatter", lambda xs: sim.SimGroup(len(xs)).reduce_scatter(xs)),
    ("merge", lambda *a: sim.merge(*a)),
    ("zigzag_positions", lambda s, n: layouts.shard_positions(s, n, "zigzag")),
])
@pytest.mark.usefixtures("course_code_allowed")
def test_checks_reject_complex_and_text_arrays(name, ref):
    """A complex answer used to pass (its imaginary part was dropped), text was parsed."""
    def to(kind):
        def conv(r):
            if isinstance(r, (list, tuple)):
                return type(r)(conv(x) for x in r)
            return np.asarray(r) + 1j if kind == "complex" else np.asarray(r).astype(str)
        return conv
    _run_check(name, ref)                                   # the right answer passes
    for kind, msg in (("complex", "complex numbers"), ("text", "text")):
        with pytest.raises(CheckFailed, match=msg):
            _run_check(name, _right_then(to(kind), ref))


@pytest.mark.usefixtures("course_code_allowed")
def test_checks_reject_complex_and_text_numbers():
    from lesson10 import cost
    right = lambda s, h, n, g=1, e=2: cost.comm_bytes("ulysses", s, h, n, g=g, e=e)
    _run_check("ulysses_bytes", right)
    for wrong, msg in ((lambda *a: right(*a) + 1j, "complex"),
                       (lambda *a: np.complex128(right(*a)), "complex"),
                       (lambda *a: np.asarray(right(*a)).astype(str), "text"),
                       (lambda *a: repr(right(*a)), "text")):
        with pytest.raises(CheckFailed, match=msg):
            _run_check("ulysses_bytes", wrong)
