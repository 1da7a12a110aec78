"""Every check accepts correct answers written in different styles and rejects realistic
wrong ones, with the same verdict for every seed.

The acceptance numbers of the checks: for each of the 18 exercises at least 3 right
answers, each accepted under 20 different seeds, and at least 6 wrong answers, each
rejected under 20 different seeds (seed 0..19 passed to the check, so 20 different random
batches besides the fixed cases)."""
import numpy as np
import pytest

import answers_01_03 as a1
import answers_04_05 as a4
from lesson10 import checks
from lesson10.checks import CheckFailed

SEEDS = range(20)

RIGHT = {
    "reduce_scatter": [a1.rs_loops, a1.rs_split, a1.rs_array],
    "all_gather": [a1.ag_concat, a1.ag_loops, a1.ag_broadcast],
    "sp_forward": [a1.sp_helpers, a1.sp_inline, a1.sp_array],
    "sp_bytes": [a1.bytes_tuple, a1.bytes_array, a1.bytes_int_list],
    "block_attention": [a1.attn_einsum, a1.attn_matmul_heads, a1.attn_python],
    "merge": [a1.merge_where, a1.merge_logaddexp, a1.merge_loops],
    "ring_attention": [a1.make_ring(), a1.ring_tuple, a1.ring_three_calls,
                       a1.make_ring(mrg=a1.merge_loops, stack=True)],
    "zigzag_positions": [a1.zz_concat, a1.zz_reshape, a1.zz_lists],
    "causal_work": [a1.work_loops, a1.work_searchsorted, a1.work_python],
    "ring_time": [a1.time_numpy, a1.time_loop, a1.time_item],
    "seq_to_heads": [a4.s2h_split, a4.s2h_reshape, a4.s2h_slices],
    "heads_to_seq": [a4.h2s_split, a4.h2s_reshape, a4.h2s_slices],
    "ulysses_attention": [a4.make_ulysses(), a4.ulysses_positional, a4.ulysses_loop],
    "ulysses_bytes": [a4.ub_formula, a4.ub_integers, a4.ub_per_tensor],
    "route_topk": [a4.route_stable, a4.route_python, a4.route_lexsort],
    "capacity": [a4.cap_fraction_loops, a4.cap_decimal_cumsum, a4.cap_rounded_counter],
    "moe_stats": [a4.make_moe_stats(), a4.moe_loops, a4.moe_traffic],
    "aux_loss": [a4.aux_bincount, a4.aux_loops, a4.aux_einsum],
}

WRONG = {
    "reduce_scatter": [a1.rs_wrong_axis, a1.rs_no_sum, a1.rs_strided, a1.rs_in_place,
                       a1.rs_reversed, a1.rs_mean, a1.rs_one_array],
    "all_gather": [a1.ag_ring_order, a1.ag_wrong_axis, a1.ag_one_array, a1.ag_interleaved,
                   a1.ag_reversed, a1.ag_no_gather, a1.ag_stack, a1.ag_overwrites],
    "sp_forward": [a1.sp_op_before_sum, a1.sp_is_tp, a1.sp_no_gather, a1.sp_in_place,
                   a1.sp_per_token, a1.sp_op_per_block, a1.sp_ring_gather],
    "sp_bytes": [a1.bytes_no_fraction, a1.bytes_half_allreduce, a1.bytes_fixed_e,
                 a1.bytes_one_over_t, a1.bytes_int_division, a1.bytes_sp_two_collectives,
                 a1.bytes_only_sp, a1.bytes_default_e1],
    "block_attention": [a1.attn_no_mask, a1.attn_row_mask, a1.attn_nan_rows, a1.attn_strict,
                        a1.attn_no_shift, a1.attn_finite_mask, a1.attn_scale_d,
                        a1.attn_zeros_like, a1.attn_lse_no_max, a1.attn_default_false],
    "merge": [a1.merge_no_shift, a1.merge_no_inf_guard, a1.merge_average, a1.merge_unnormalised,
              a1.merge_lse_max, a1.merge_swapped, a1.merge_into_o1, a1.merge_lse_no_m],
    "ring_attention": [a1.make_ring(attend=a1.attn_no_mask),          # ignores the causal mask
                       a1.make_ring(attend=a1.attn_row_mask),         # row numbers, not positions
                       a1.make_ring(rounds=lambda n: 1),              # forgets the ring: no shift
                       a1.make_ring(mrg=a1.merge_average),            # averages the blocks
                       a1.make_ring(causal_override=True),            # always causal
                       a1.make_ring(rounds=lambda n: n - 1),          # one round (and shift) short
                       a1.make_ring(key_pos="mine"),                  # its own positions for the keys
                       a1.make_ring(lse0=0.0),                        # starts from lse = 0
                       a1.ring_rotates_inputs,                        # shifts the caller's lists
                       a1.make_ring(read="inputs"),                   # shifts, but reads k_shards[j]
                       a1.make_ring(read="inputs", shifts=lambda n: 0),   # never shifts
                       a1.make_ring(shifts=lambda n: n),              # a shift after the last round
                       a1.make_ring(send="own"),                      # passes on its own block
                       a1.make_ring(send="inputs"),                   # passes on k_shards[j], not what it got
                       a1.ring_gathers,                               # all blocks in one shift
                       a1.ring_all_gather,                            # a collective the ring lacks
                       a1.ring_stacked_kv],                           # K and V stacked in one array
    "zigzag_positions": [a1.zz_off_by_one, a1.zz_n_plus_r, a1.zz_late_first, a1.zz_float,
                         a1.zz_chunk_s_over_n, a1.zz_mirrored_ranks, a1.zz_flat, a1.zz_linspace],
    "causal_work": [a1.work_strict, a1.work_wrong_direction, a1.work_transposed,
                    a1.work_row_numbers, a1.work_own_block, a1.work_assumes_sorted,
                    a1.work_stack],
    "ring_time": [a1.time_busiest_rank, a1.time_wrong_axis, a1.time_mean, a1.time_ideal,
                  a1.time_int, a1.time_sorts_input, a1.time_max_times_rounds],
    "seq_to_heads": [a4.s2h_wrong_axes, a4.s2h_wrong_index, a4.s2h_strided_heads, a4.s2h_no_check,
                     a4.s2h_reversed_tokens, a4.s2h_stack, a4.s2h_array_split,
                     a4.s2h_interleaved_tokens, a4.s2h_never_calls, a4.s2h_for_show, a4.s2h_twice],
    "heads_to_seq": [a4.h2s_wrong_index, a4.h2s_is_s2h, a4.h2s_reversed_heads,
                     a4.h2s_interleaved_heads, a4.h2s_strided_tokens, a4.h2s_no_exchange,
                     a4.h2s_stack, a4.h2s_for_show],
    "ulysses_attention": [a4.make_ulysses(pos="arange"),              # row numbers, not positions
                          a4.make_ulysses(back=False),                # no way back
                          a4.make_ulysses(causal_override=True),      # always causal
                          a4.make_ulysses(tile=True),                 # np.tile of K/V heads
                          a4.make_ulysses(pos="sorted"),              # sorted positions
                          a4.make_ulysses(s2h=a4.s2h_strided_heads, h2s=a4.h2s_interleaved_heads),
                          a4.make_ulysses(causal_override=False),     # never causal
                          a4.ulysses_whole_sequence,                  # attention on all heads, all tokens
                          a4.ulysses_per_rank,                        # attention before the all-to-all
                          a4.ulysses_own_attention,                   # sends its own attention back
                          a4.ulysses_no_kernel,                       # never calls the kernel
                          a4.ulysses_local_slices,                    # head groups cut locally
                          a4.ulysses_twice,                           # two calls per head group
                          a4.ulysses_sorted_tokens],                  # rows reordered for the kernel
    "ulysses_bytes": [a4.ub_no_gqa, a4.ub_full_seq, a4.ub_no_fraction, a4.ub_one_over_n,
                      a4.ub_g_everywhere, a4.ub_fixed_e, a4.ub_kv_once, a4.ub_three,
                      a4.ub_default_g2],
    "route_topk": [a4.route_softmax_all, a4.route_smallest, a4.route_gates_not_following,
                   a4.route_sorted_by_id, a4.route_float_ids, a4.route_ties_high,
                   a4.route_no_shift, a4.route_linear_gates],
    "capacity": [a4.make_capacity(rounding=np.floor), a4.make_capacity(strict=False),
                 a4.make_capacity(token_major=False),
                 a4.make_capacity(rounding=np.ceil),                  # ceil of a float product
                 a4.make_capacity(as_int=True), a4.make_capacity(forget_k=True),
                 a4.make_capacity(reverse=True), a4.cap_no_none],
    "moe_stats": [a4.make_moe_stats(count_dropped=True), a4.make_moe_stats(count_local=True),
                  a4.make_moe_stats(combine=False), a4.make_moe_stats(load_before_drop=True),
                  a4.make_moe_stats(minlength=False), a4.make_moe_stats(gpu_of_expert="modulo"),
                  a4.make_moe_stats(gpu_of_token="modulo"), a4.make_moe_stats(drop_over_n=True),
                  a4.moe_default_e1],
    "aux_loss": [a4.aux_f_per_token, a4.aux_no_E, a4.aux_no_minlength, a4.aux_f_twice,
                 a4.aux_first_choice, a4.aux_mean_over_experts, a4.aux_default_alpha,
                 a4.aux_sum_probs],
}


def _name(fn):
    return getattr(fn, "__qualname__", str(fn)).replace(".<locals>.", ":")


def _cases(table):
    return [pytest.param(ex, i, fn, id=f"{ex}-{i}-{_name(fn)}") for ex, fns in table.items()
            for i, fn in enumerate(fns)]


def test_every_exercise_has_three_right_and_six_wrong_answers():
    assert set(RIGHT) == set(WRONG) == set(checks.EXERCISES)
    for ex in checks.EXERCISES:
        assert len(RIGHT[ex]) >= 3, ex
        assert len(WRONG[ex]) >= 6, ex


@pytest.mark.parametrize("exercise,i,fn", _cases(RIGHT))
def test_right_answer_is_accepted_for_every_seed(exercise, i, fn, capsys):
    check = getattr(checks, f"check_{exercise}")
    for seed in SEEDS:
        check(fn, seed=seed)
        assert checks.OUTCOMES[-1]["passed"] is True, (seed, checks.OUTCOMES[-1]["message"])
    assert capsys.readouterr().out.count("passed") == len(SEEDS)


@pytest.mark.parametrize("exercise,i,fn", _cases(WRONG))
def test_wrong_answer_is_rejected_for_every_seed(exercise, i, fn, capsys):
    check = getattr(checks, f"check_{exercise}")
    for seed in SEEDS:
        with pytest.raises(CheckFailed) as info, np.errstate(all="ignore"):
            check(fn, seed=seed)
        msg = str(info.value)
        assert msg.startswith(f"check_{exercise} failed"), msg
        assert len(msg.splitlines()) >= 2, msg            # where + (yours/target or hint)
        assert checks.OUTCOMES[-1]["passed"] is False
    assert "passed" not in capsys.readouterr().out


@pytest.mark.parametrize("exercise,i,fn", _cases(WRONG))
def test_the_grader_path_rejects_too(exercise, i, fn):
    """The grader calls ``body(fn, rng)`` with its own generator: the fixed cases still run."""
    body = checks.EXERCISES[exercise].body
    with pytest.raises((CheckFailed, checks.core._StudentError)), np.errstate(all="ignore"):
        body(fn, np.random.default_rng(12345))


def test_answers_use_numpy_only():
    """The grader's sandbox holds no course code: an answer may not import lesson10."""
    import ast
    from pathlib import Path
    for name in ("answers_01_03.py", "answers_04_05.py"):
        tree = ast.parse((Path(__file__).parent / name).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                assert not any(m and m.split(".")[0] == "lesson10" for m in mods), (name, node.lineno)
            assert not (isinstance(node, ast.Name) and node.id == "lesson10"), (name, node.lineno)
