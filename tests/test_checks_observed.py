"""The method exercises are observed, not only their outputs: the ring is served its block
kernel and merge (one call per rank and round, counted; the network waits for it), SP its
collectives and op (op on the delivered shards), Ulysses an output all-to-all that
substitutes. A check names a helper that fails its own check first. Fixed edge cases
(scores near +-1000) run whatever the seed."""
import answers_01_03 as a1
import answers_04_05 as a4
import numpy as np
import pytest

from lesson10 import checks
from lesson10.checks import CheckFailed, depends, nb02_ring_attention
from lesson10.checks.core import StudentError
from lesson10.checks.network import Referee, RingNetwork, RuleBroken, ServedBlockAttention, plural
from lesson10.checks.served_sp import ServedSP


def _fails(check, fn, seed=0) -> str:
    with pytest.raises(CheckFailed) as info, np.errstate(all="ignore"):
        check(fn, seed=seed)
    return str(info.value)


def _ring(n=3, c=2, a=1, d=2, seed=0):
    rng = np.random.default_rng(seed)
    qs, ks, vs = ([rng.standard_normal((c, a, d)) for _ in range(n)] for _ in range(3))
    pos = [np.arange(r * c, (r + 1) * c) for r in range(n)]
    ref = Referee("ring_attention", "a test case")
    net = RingNetwork(ref, ks, vs, pos)
    return qs, ks, vs, pos, ref, net, ServedBlockAttention(ref, net, qs)


# --------------------------------------------------------------------------- the ring
def test_ring_shift_waits_for_the_rounds_kernel_call():
    qs, ks, vs, pos, ref, net, kernel = _ring()
    with pytest.raises(RuleBroken, match="before attending to it"):
        net.ring_shift(list(zip(ks, vs, pos)))


def test_the_kernel_counts_one_call_per_rank_and_round_on_the_held_block():
    qs, ks, vs, pos, ref, net, kernel = _ring()
    held = list(zip(ks, vs, pos))
    for r in range(3):
        kernel(qs[r], *held[r][:2], pos[r], held[r][2])
    assert kernel.done == [{0}, {0}, {0}]
    with pytest.raises(RuleBroken, match="a second time in round 0"):
        kernel(qs[0], ks[0], vs[0], pos[0], pos[0])        # round 1 before the shift


def test_the_kernel_refuses_a_block_the_rank_does_not_hold():
    qs, ks, vs, pos, ref, net, kernel = _ring()
    with pytest.raises(RuleBroken, match="k is the K block of rank 1"):
        kernel(qs[0], ks[1], vs[0], pos[0], pos[1])


def test_a_fully_masked_round_may_be_skipped():
    qs, ks, vs, pos, ref, net, kernel = _ring(n=2)
    assert kernel.skippable(0, 1) and not kernel.skippable(1, 1)   # rank 0 sees no later key
    kernel(qs[0], ks[0], vs[0], pos[0], pos[0])
    kernel(qs[1], ks[1], vs[1], pos[1], pos[1])
    held = net.ring_shift(list(zip(ks, vs, pos)))
    kernel(qs[1], held[1][0], held[1][1], pos[1], held[1][2])
    kernel._finish()                                              # rank 0 skipped round 1


def test_a_kernel_call_missing_is_counted_after_the_call():
    qs, ks, vs, pos, ref, net, kernel = _ring(n=1)
    with pytest.raises(CheckFailed, match="never called the block_attention"):
        kernel._finish()


@pytest.mark.parametrize("fn,hint", [
    (a1.ring_keeps_everything, "calls the block_attention it was given on the block it holds"),
    (a1.ring_keeps_everything_calls_kernel, "is an all-gather, which the ring avoids"),
    (a1.make_ring(attend=a1.attn_einsum), "calls the block_attention it was given"),
])
@pytest.mark.parametrize("seed", [0, 7, 123])
def test_all_gather_attention_in_a_ring_disguise_is_refused(fn, hint, seed):
    msg = _fails(checks.check_ring_attention, fn, seed)
    assert hint in msg


def test_the_substituted_kernel_output_decides_the_target():
    """A ring that merges what the kernel returned passes however the offsets fall; the
    kernel's offsets change the target (so ignoring them cannot pass)."""
    rng = np.random.default_rng(3)
    cases = nb02_ring_attention._ring_cases(rng)
    assert sum(case[4] for case in cases) >= 2
    (_, args, _, referee, net, kernel) = nb02_ring_attention._ring_case(
        np.random.default_rng(5), "contiguous", True, 3, 6, True, False)
    plain, target = kernel._plain_merge(True), kernel._target(True)
    assert max(np.abs(p - t).max() for p, t in zip(plain, target)) > 1e-3


@pytest.mark.parametrize("seed", [None, 0, 99, 2**31])
def test_scores_near_1000_are_fixed_ring_cases_for_every_seed(seed):
    rng = np.random.default_rng(seed)
    assert sum(case[5] for case in nb02_ring_attention._ring_cases(rng)) >= 2
    body = checks.EXERCISES["ring_attention"].body
    with pytest.raises(CheckFailed, match="max shift"), np.errstate(all="ignore"):
        body(a1.make_ring(mrg=a1.merge_no_shift), np.random.default_rng(seed))


def test_an_old_signature_ring_is_told_the_new_one():
    def ring_attention(q_shards, k_shards, v_shards, positions, causal=True, group=None):
        return [np.zeros_like(q) for q in q_shards]
    msg = _fails(checks.check_ring_attention, ring_attention)
    assert "block_attention=kernel, merge=merge, group=network" in msg


# --------------------------------------------------------------------------- SP
def test_sp_that_sums_the_partials_itself_is_refused_for_every_seed():
    for seed in range(5):
        msg = _fails(checks.check_sp_forward, a1.sp_sums_itself_for_show, seed)
        assert "not a shard reduce_scatter delivered" in msg
        assert "reduce_scatter passed in" in _fails(checks.check_sp_forward, a1.sp_sums_itself, seed)


def test_served_sp_substitutes_and_names_op_on_other_rows():
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((4, 3)) for _ in range(2)]
    served = ServedSP(xs, np.ones(3), np.random.default_rng(1))
    shards = served.reduce_scatter(xs)
    total = xs[0] + xs[1]
    assert not np.allclose(shards[0], total[:2])           # the secret offset
    for x in (total[:2], total[2:]):
        served.op(x)
    what, hint = served.problem()
    assert "op call 0 got rows that are not a shard" in what and "delivered" in hint


# --------------------------------------------------------------------------- Ulysses
def test_ulysses_that_ignores_the_output_delivery_is_refused():
    for seed in range(5):
        msg = _fails(checks.check_ulysses_attention, a4.ulysses_ignores_delivery, seed)
        assert "return what your heads_to_seq received" in msg


# --------------------------------------------------------------------------- what a check depends on
def _notebook(seq_to_heads):
    """A notebook-like namespace: ulysses_attention calls the global seq_to_heads."""
    space = {"np": np, "seq_to_heads": seq_to_heads, "heads_to_seq": a4.h2s_split}
    exec(
        "def ulysses_attention(q_shards, k_shards, v_shards, positions, causal=True, group=None,\n"
        "                      attention=None):\n"
        "    qh, kh, vh = (seq_to_heads(x, group) for x in (q_shards, k_shards, v_shards))\n"
        "    pos = np.concatenate(positions)\n"
        "    out = [attention(qh[j], kh[j], vh[j], causal=causal, q_pos=pos, k_pos=pos)[0]\n"
        "           for j in range(len(qh))]\n"
        "    return heads_to_seq(out, group)\n", space)
    return space["ulysses_attention"]


def test_a_failing_helper_is_named_first():
    msg = _fails(checks.check_ulysses_attention, _notebook(a4.s2h_strided_heads))
    assert msg.startswith("your seq_to_heads does not pass its check yet: fix it first "
                          "(see its check cell)\n"), msg
    assert "heads_to_seq does not pass" not in msg


def test_a_helper_that_passes_is_not_named(capsys):
    checks.check_ulysses_attention(_notebook(a4.s2h_split))
    assert checks.OUTCOMES[-1]["passed"] is True


def test_the_grader_names_a_helper_from_its_verdicts():
    note = depends.note_for("ulysses_attention", {"seq_to_heads": "passed",
                                                  "heads_to_seq": "failed"})
    assert note == "your heads_to_seq does not pass its check yet: fix it first (see its check cell)\n"
    assert depends.note_for("ulysses_attention", {"seq_to_heads": "passed"}) == ""
    assert depends.note_for("ring_attention", {"seq_to_heads": "failed"}) == ""


def test_a_raising_answer_keeps_its_traceback_with_the_note():
    def seq_to_heads(shards, group=None):
        raise ValueError("broken")
    space_fn = _notebook(seq_to_heads)
    with pytest.raises(StudentError) as info:
        depends.run_body("ulysses_attention", checks.EXERCISES["ulysses_attention"].body, space_fn,
                         np.random.default_rng(0))
    assert str(info.value).startswith("your seq_to_heads does not pass its check yet")
    assert isinstance(info.value.__cause__, ValueError)


# --------------------------------------------------------------------------- messages
def test_counts_are_singular_for_one():
    assert plural(1, "array") == "1 array" and plural(3, "array") == "3 arrays"
    assert plural(1, "query", "queries") == "1 query" and plural(2, "query", "queries") == "2 queries"
    qs, ks, vs, pos, ref, net, _ = _ring(n=2)
    kernel = ServedBlockAttention(ref, net, qs, causal=False)     # no round may be skipped
    kernel(qs[0], ks[0], vs[0], pos[0], pos[0])
    with pytest.raises(CheckFailed, match=r"block_attention ran 1 time for rank 0; round \[1\] of "
                                          "N_c = 2 had no call"):
        kernel._finish()


def test_an_integer_accumulator_is_named_as_such():
    for fn in (a1.rs_int_accumulator, a1.rs_int_accumulator_cast):
        msg = _fails(checks.check_reduce_scatter, fn)
        assert "integer dtype" in msg and "hidden axis" not in msg
