"""Every check accepts correct answers written in different styles and rejects realistic
wrong ones, with the same verdict for every seed.

The acceptance numbers of the checks: for each of the 18 exercises at least 3 right
answers, each accepted under 20 different seeds, and at least 6 wrong answers, each
rejected under 20 different seeds (seed 0..19 passed to the check, so 20 different random
batches besides the fixed cases). ``make test`` runs every answer on the check's own seed (the
one a student's check cell uses) and seeds 0-1; ``make test-slow`` (a step of .ci/run) on
seeds 2-19: the same answers, so each seed's verdict is tested in CI."""
import math
import re

import answers_01_03 as a1
import answers_04_05 as a4
import numpy as np
import pytest

from lesson10 import checks
from lesson10.checks import CheckFailed

SEEDS = range(20)
#: the seeds each answer runs on: the check's own seed (None) and 0-1 in make test, 2-19 in make test-slow
SEED_SHARES = [pytest.param((None, 0, 1), id="seeds-own-0-1"),
               pytest.param(tuple(SEEDS[2:]), id="seeds-2-19", marks=pytest.mark.slow)]

RIGHT = {
    "reduce_scatter": [a1.rs_loops, a1.rs_split, a1.rs_array],
    "all_gather": [a1.ag_concat, a1.ag_loops, a1.ag_broadcast],
    "sp_forward": [a1.sp_helpers, a1.sp_inline, a1.sp_array],
    "sp_bytes": [a1.bytes_tuple, a1.bytes_array, a1.bytes_int_list],
    "block_attention": [a1.attn_einsum, a1.attn_matmul_heads, a1.attn_python, a1.attn_zeros_like,
                        a1.attn_no_convert],
    "merge": [a1.merge_where, a1.merge_logaddexp, a1.merge_loops],
    "ring_attention": [a1.make_ring(), a1.ring_tuple, a1.ring_three_calls,
                       a1.make_ring(mrg=a1.merge_loops, stack=True),   # a merge of its own
                       a1.make_ring(mrg=a1.merge_where)],
    "zigzag_positions": [a1.zz_concat, a1.zz_reshape, a1.zz_lists],
    "causal_work": [a1.work_loops, a1.work_searchsorted, a1.work_python],
    "ring_time": [a1.time_numpy, a1.time_loop, a1.time_item, a1.time_float32],
    "seq_to_heads": [a4.s2h_split, a4.s2h_reshape, a4.s2h_slices],
    "heads_to_seq": [a4.h2s_split, a4.h2s_reshape, a4.h2s_slices],
    "ulysses_attention": [a4.make_ulysses(), a4.ulysses_positional, a4.ulysses_loop],
    "ulysses_bytes": [a4.ub_formula, a4.ub_integers, a4.ub_per_tensor],
    "route_topk": [a4.route_stable, a4.route_python, a4.route_lexsort, a4.route_ties_high,
                   a4.route_default_sort, a4.route_argpartition, a4.route_shift_copy,
                   a4.route_float32],
    "capacity": [a4.cap_fraction_loops, a4.cap_decimal_cumsum, a4.cap_rounded_counter,
                 a4.cap_integer_percent],
    "moe_stats": [a4.make_moe_stats(), a4.moe_loops, a4.moe_traffic, a4.moe_float32,
                  a4.moe_float32_item],
    "aux_loss": [a4.aux_bincount, a4.aux_loops, a4.aux_einsum, a4.aux_float32],
}

WRONG = {
    "reduce_scatter": [a1.rs_wrong_axis, a1.rs_no_sum, a1.rs_strided, a1.rs_in_place,
                       a1.rs_reversed, a1.rs_mean, a1.rs_one_array, a1.rs_int_accumulator,
                       a1.rs_int_accumulator_cast, a1.rs_reduce_alias],
    "all_gather": [a1.ag_ring_order, a1.ag_wrong_axis, a1.ag_one_array, a1.ag_interleaved,
                   a1.ag_reversed, a1.ag_no_gather, a1.ag_stack, a1.ag_overwrites,
                   a1.ag_one_rank_shortcut],
    "sp_forward": [a1.sp_op_before_sum, a1.sp_is_tp, a1.sp_no_gather, a1.sp_in_place,
                   a1.sp_per_token, a1.sp_op_per_block, a1.sp_ring_gather,
                   a1.sp_sums_itself, a1.sp_sums_itself_for_show],
    "sp_bytes": [a1.bytes_no_fraction, a1.bytes_half_allreduce, a1.bytes_fixed_e,
                 a1.bytes_one_over_t, a1.bytes_int_division, a1.bytes_sp_two_collectives,
                 a1.bytes_only_sp, a1.bytes_default_e1],
    "block_attention": [a1.attn_no_mask, a1.attn_row_mask, a1.attn_nan_rows, a1.attn_strict,
                        a1.attn_no_shift, a1.attn_finite_mask, a1.attn_scale_d,
                        a1.attn_lse_no_max, a1.attn_default_false, a1.attn_no_scale,
                        a1.attn_softmax_over_queries, a1.attn_max_all_keys],
    "merge": [a1.merge_no_shift, a1.merge_no_inf_guard, a1.merge_average, a1.merge_unnormalised,
              a1.merge_lse_max, a1.merge_swapped, a1.merge_into_o1, a1.merge_lse_no_m,
              a1.merge_tie_keeps_first],
    "ring_attention": [a1.make_ring(causal_override=False),           # ignores the causal mask
                       a1.make_ring(row_mask=True),                   # row numbers, not positions
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
                       a1.ring_stacked_kv,                            # K and V stacked in one array
                       a1.ring_keeps_everything,                      # all-gather in disguise
                       a1.ring_keeps_everything_calls_kernel,         # ... that calls the kernel for show
                       a1.make_ring(mrg=a1.merge_no_shift),           # inline merge without the max shift
                       a1.make_ring(attend=a1.attn_einsum)],          # attention of its own, not the kernel
    "zigzag_positions": [a1.zz_off_by_one, a1.zz_n_plus_r, a1.zz_late_first, a1.zz_float,
                         a1.zz_chunk_s_over_n, a1.zz_mirrored_ranks, a1.zz_flat, a1.zz_linspace,
                         a1.zz_uint16, a1.zz_index_off_by_one],
    "causal_work": [a1.work_strict, a1.work_wrong_direction, a1.work_transposed,
                    a1.work_row_numbers, a1.work_own_block, a1.work_assumes_sorted,
                    a1.work_stack, a1.work_uint8, a1.work_uint16, a1.work_table, a1.work_int16,
                    a1.work_column_stack, a1.work_no_wrap],
    "ring_time": [a1.time_busiest_rank, a1.time_wrong_axis, a1.time_mean, a1.time_ideal,
                  a1.time_int, a1.time_sorts_input, a1.time_max_times_rounds, a1.time_float16,
                  a1.time_idle],
    "seq_to_heads": [a4.s2h_wrong_axes, a4.s2h_wrong_index, a4.s2h_strided_heads, a4.s2h_no_check,
                     a4.s2h_reversed_tokens, a4.s2h_stack, a4.s2h_array_split,
                     a4.s2h_interleaved_tokens, a4.s2h_never_calls, a4.s2h_for_show, a4.s2h_twice,
                     a4.s2h_assert],
    "heads_to_seq": [a4.h2s_wrong_index, a4.h2s_is_s2h, a4.h2s_reversed_heads,
                     a4.h2s_interleaved_heads, a4.h2s_strided_tokens, a4.h2s_no_exchange,
                     a4.h2s_stack, a4.h2s_for_show, a4.h2s_reshape_all_heads],
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
                          a4.ulysses_sorted_tokens,                   # rows reordered for the kernel
                          a4.ulysses_ignores_delivery],               # ignores what the output all-to-all delivers
    "ulysses_bytes": [a4.ub_no_gqa, a4.ub_full_seq, a4.ub_no_fraction, a4.ub_one_over_n,
                      a4.ub_g_everywhere, a4.ub_fixed_e, a4.ub_kv_once, a4.ub_three,
                      a4.ub_default_g2],
    "route_topk": [a4.route_softmax_all, a4.route_smallest, a4.route_gates_not_following,
                   a4.route_sorted_by_id, a4.route_float_ids, a4.route_best_repeated,
                   a4.route_no_shift, a4.route_linear_gates, a4.route_shift_in_place,
                   a4.route_by_probs, a4.route_mean_shift],
    "capacity": [a4.make_capacity(rounding=np.floor), a4.make_capacity(strict=False),
                 a4.make_capacity(token_major=False),
                 a4.make_capacity(rounding=lambda x: math.floor(x) + 1),   # floor + 1: C + 1 at integers
                 a4.make_capacity(rounding=round),                    # the nearest integer
                 a4.make_capacity(as_int=True), a4.make_capacity(forget_k=True),
                 a4.make_capacity(reverse=True), a4.cap_no_none,
                 a4.make_capacity(rounding=math.ceil, reverse=True),   # float C, last copies first
                 a4.make_capacity(rounding=math.ceil, token_major=False),    # float C, by choice
                 a4.cap_float32, a4.cap_keep_all,
                 a4.make_capacity(rounding=np.ceil),                  # ceil of the float product
                 a4.cap_float_any_order, a4.cap_binary_fraction],
    "moe_stats": [a4.make_moe_stats(count_dropped=True), a4.make_moe_stats(count_local=True),
                  a4.make_moe_stats(combine=False), a4.make_moe_stats(load_before_drop=True),
                  a4.make_moe_stats(minlength=False), a4.make_moe_stats(gpu_of_expert="modulo"),
                  a4.make_moe_stats(gpu_of_token="modulo"), a4.make_moe_stats(drop_over_n=True),
                  a4.moe_default_e1, a4.moe_load_uint16, a4.moe_bytes_uint8],
    "aux_loss": [a4.aux_f_per_token, a4.aux_no_E, a4.aux_no_minlength, a4.aux_f_twice,
                 a4.aux_first_choice, a4.aux_mean_over_experts, a4.aux_default_alpha,
                 a4.aux_sum_probs],
}


# (exercise, index in WRONG): what the failure's hint says, for every seed: the mistake the
# answer looks like (or the rule it breaks), not only the general hint of the check
HINTS = {
    ('reduce_scatter', 0): 'the hidden size (axis 1, length 3), so you likely split the wrong axis',
    ('reduce_scatter', 1): 'rank i holds only its own partial sum',
    ('reduce_scatter', 2): 'rank i holds the rows i, i + t, i + 2t, ...',
    ('reduce_scatter', 3): 'leave the inputs as they are',
    ('reduce_scatter', 4): 'rank 0 holds the last block',
    ('reduce_scatter', 5): 'your shards are averages',
    ('reduce_scatter', 6): 'each rank keeps only its own block of the summed',
    ('reduce_scatter', 7): 'the accumulator has an integer dtype',
    ('reduce_scatter', 8): 'the accumulator has an integer dtype',
    ('reduce_scatter', 9): 'aliasing: a result that is (or is a view of) an input',
    ('all_gather', 0): "rank r's tensor starts with its own shard",
    ('all_gather', 1): 'your gathered tensor has shape',
    ('all_gather', 2): 'every rank ends with its own copy of the full te',
    ('all_gather', 3): 'your tokens are interleaved',
    ('all_gather', 4): 'the shards are in reverse rank order',
    ('all_gather', 5): 'every rank returns its own shard',
    ('all_gather', 6): 'your gathered tensor has shape',
    ('all_gather', 7): 'leave the inputs as they are',
    ('all_gather', 8): 'aliasing: a result that is (or is a view of) an input',
    ('sp_forward', 0): 'op is not linear',
    ('sp_forward', 1): 'reach a rank only through the reduce_scatter',
    ('sp_forward', 2): 'one all-gather',
    ('sp_forward', 3): 'leave the inputs as they are',
    ('sp_forward', 4): 'op ran on one token at a time',
    ('sp_forward', 5): 'op is not linear',
    ('sp_forward', 6): 'one all-gather',
    ('sp_forward', 7): 'reach a rank only through the reduce_scatter',
    ('sp_forward', 8): 'a rank holds only what reduce_scatter delivered',
    ('sp_bytes', 0): 'you left out the',
    ('sp_bytes', 1): 'your TP count is half the target',
    ('sp_bytes', 2): 'your count is for 2 bytes per element',
    ('sp_bytes', 3): '1/t instead of',
    ('sp_bytes', 4): 'your count is 0',
    ('sp_bytes', 5): 'your TP + SP count is half the target',
    ('sp_bytes', 6): 'return both values, tp_bytes, sp_bytes, as a pai',
    ('sp_bytes', 7): 'e was not passed here',
    ('block_attention', 0): 'your output ignores the causal mask',
    ('block_attention', 1): 'your mask compares row numbers, not positions',
    ('block_attention', 2): 'NaN where a query sees no key in this block',
    ('block_attention', 3): "a key at the query's own position is visible",
    ('block_attention', 4): 'inf or NaN where the scores are about 1000',
    ('block_attention', 5): 'a query that sees no key got a finite lse',
    ('block_attention', 6): 'your scores are scaled by 1/d',
    ('block_attention', 7): 'your out is right but your lse misses the row ma',
    ('block_attention', 8): 'your output ignores the causal mask',
    ('block_attention', 9): 'your scores are not scaled',
    ('block_attention', 10): 'go through the formulas above',
    ('block_attention', 11): 'your row maximum includes the masked keys',
    ('merge', 0): 'your merge has no max shift',
    ('merge', 1): 'NaN where both sides saw no key',
    ('merge', 2): 'you averaged the two outputs',
    ('merge', 3): 'your weights exp',
    ('merge', 4): 'your lse is the larger of the two',
    ('merge', 5): "each weight multiplies the other side's output",
    ('merge', 6): 'leave the inputs as they are',
    ('merge', 7): 'your lse misses the m you subtracted',
    ('merge', 8): 'where lse1 == lse2 your merge keeps side 1',
    ('ring_attention', 0): 'causal=True was passed',
    ('ring_attention', 1): "a key block's positions travel with it",
    ('ring_attention', 2): 'reach a rank only through group.ring_shift',
    ('ring_attention', 3): "merge each block's",
    ('ring_attention', 4): 'pass causal on to the attention of every block',
    ('ring_attention', 5): "a rank's queries must meet every K/V block, and",
    ('ring_attention', 6): "a key block's positions travel with it",
    ('ring_attention', 7): 'the running result starts empty',
    ('ring_attention', 8): 'leave the inputs as they are',
    ('ring_attention', 9): 'a rank may use only its own k_shards[r], v_shard',
    ('ring_attention', 10): 'a rank attends only to the block it holds',
    ('ring_attention', 11): 'N_c rounds of attention need N_c - 1 shifts',
    ('ring_attention', 12): 'in step t rank r passes on the block it holds',
    ('ring_attention', 13): 'a rank may read only its own k_shards[r] and v_s',
    ('ring_attention', 14): 'sending several blocks at once is gathering them',
    ('ring_attention', 15): 'the traceback shows the line of your code that r',
    ('ring_attention', 16): 'send the blocks as they arrived, not stacked, ca',
    ('ring_attention', 17): 'calls the block_attention it was given on the block it holds',
    ('ring_attention', 18): 'Keeping the blocks to attend over them all at the end is an all-gather',
    ('ring_attention', 19): 'needs the max shift',
    ('ring_attention', 20): 'calls the block_attention it was given on the block it holds',
    ('zigzag_positions', 0): 'your late chunks are one chunk off',
    ('zigzag_positions', 1): 'rank r holds chunks r and N_c + r',
    ('zigzag_positions', 2): 'the right tokens, but the late chunk comes first',
    ('zigzag_positions', 3): 'token ids are integers',
    ('zigzag_positions', 4): 'your chunks have s/N_c tokens',
    ('zigzag_positions', 5): 'paired from the middle out',
    ('zigzag_positions', 6): 'return a Python list with one entry per rank',
    ('zigzag_positions', 7): 'token ids are integers',
    ('zigzag_positions', 8): 'your array is uint16, which holds only 0..65535',
    ('zigzag_positions', 9): 'is past the end of axis 0, whose',
    ('causal_work', 0): 'your counts leave out the diagonal',
    ('causal_work', 1): 'in round k your rank r holds the block of rank r',
    ('causal_work', 2): 'rows and columns are swapped',
    ('causal_work', 3): 'your counts compare row numbers within each bloc',
    ('causal_work', 4): 'every round counts the rank against its own block',
    ('causal_work', 5): 'your counts assume sorted ids',
    ('causal_work', 6): 'arrays of different lengths (np.array, np.stack',
    ('causal_work', 7): 'your array is uint8, which holds only 0..255',
    ('causal_work', 8): 'your array is uint16, which holds only 0..65535',
    ('causal_work', 9): 'rows are rounds, columns are ranks',
    ('causal_work', 10): 'does not fit your array\'s dtype int16, which holds only -32768..32767',
    ('causal_work', 11): 'arrays of different lengths (np.array, np.stack, np.column_stack',
    ('causal_work', 12): 'an index ran past the end of a list',
    ('ring_time', 0): "your time is the busiest rank's total work",
    ('ring_time', 1): 'your time has the rounds and the ranks the other way',
    ('ring_time', 2): 'your time is that of the average rank',
    ('ring_time', 3): 'your time is that of the average rank',
    ('ring_time', 4): 'your time is rounded down to an integer',
    ('ring_time', 5): 'leave the inputs as they are',
    ('ring_time', 6): 'your time is the busiest cell times the number o',
    ('ring_time', 7): 'compute in float64',
    ('ring_time', 8): 'your number is waiting time',
    ('seq_to_heads', 0): 'so you likely split the wrong axis; seq_to_heads cuts the heads (axis 1)',
    ('seq_to_heads', 1): 'you joined what the other ranks received from ra',
    ('seq_to_heads', 2): 'rank i owes every rank j',
    ('seq_to_heads', 3): 'the exercise asks for a ValueError when the head',
    ('seq_to_heads', 4): "rank j's blocks are in reverse order",
    ('seq_to_heads', 5): 'your shard has shape',
    ('seq_to_heads', 6): 'the exercise asks for a ValueError when the head',
    ('seq_to_heads', 7): 'your tokens are interleaved',
    ('seq_to_heads', 8): 'rank i sends head group j of its shard to rank j',
    ('seq_to_heads', 9): 'rank j returns the blocks it received from ranks',
    ('seq_to_heads', 10): 'rank i owes every rank j',
    ('seq_to_heads', 11): 'raise ValueError',
    ('heads_to_seq', 0): 'you joined what the other ranks received from ra',
    ('heads_to_seq', 1): 'so you likely split the wrong axis; heads_to_seq cuts the tokens (axis 0)',
    ('heads_to_seq', 2): "rank j's blocks are in reverse order",
    ('heads_to_seq', 3): 'your heads are interleaved',
    ('heads_to_seq', 4): 'rank j owes every rank i',
    ('heads_to_seq', 5): 'rank j owes every rank i',
    ('heads_to_seq', 6): 'rank i returns the blocks it received from ranks',
    ('heads_to_seq', 7): 'rank i returns the blocks it received from ranks',
    ('heads_to_seq', 8): 'a reshape keeps every entry',
    ('ulysses_attention', 0): 'query i may see key j only when the global posit',
    ('ulysses_attention', 1): 'send what attention returned for each head group',
    ('ulysses_attention', 2): 'pass causal on to the kernel as it was passed to',
    ('ulysses_attention', 3): 'pass kh[j] and vh[j] as your seq_to_heads return',
    ('ulysses_attention', 4): 'query i may see key j only when the global posit',
    ('ulysses_attention', 5): 'only four tensors cross the network',
    ('ulysses_attention', 6): 'causal=True was passed',
    ('ulysses_attention', 7): 'after seq_to_heads rank j holds all s tokens of',
    ('ulysses_attention', 8): 'after seq_to_heads rank j holds all s tokens of',
    ('ulysses_attention', 9): 'send what attention returned for each head group',
    ('ulysses_attention', 10): 'only four tensors cross the network',
    ('ulysses_attention', 11): 'run your seq_to_heads',
    ('ulysses_attention', 12): 'N_c calls, one per head group',
    ('ulysses_attention', 13): 'pass the head group as seq_to_heads returned it',
    ('ulysses_attention', 14): 'return what your heads_to_seq received, unchanged',
    ('ulysses_bytes', 0): 'your count ignores GQA',
    ('ulysses_bytes', 1): 'your count is N_c times too large',
    ('ulysses_bytes', 2): 'you left out (N_c-1)/N_c: an a',
    ('ulysses_bytes', 3): '1/N_c instead of',
    ('ulysses_bytes', 4): 'your count divides all four tensors by g = 4',
    ('ulysses_bytes', 5): 'your count is for 2 bytes per element',
    ('ulysses_bytes', 6): 'K and V are counted once',
    ('ulysses_bytes', 7): 'three all-to-alls',
    ('ulysses_bytes', 8): 'g was not passed here',
    ('route_topk', 0): 'your gates look like the softmax over all E logi',
    ('route_topk', 1): 'your sort is ascending',
    ('route_topk', 2): 'order the k experts from the largest logit down',
    ('route_topk', 3): 'order the k experts from the largest logit down',
    ('route_topk', 4): 'expert ids are integers',
    ('route_topk', 5): "a token's k experts are k different columns of i",
    ('route_topk', 6): 'your gates are not finite where the logits are a',
    ('route_topk', 7): 'your gates look like the chosen logits divided b',
    ('route_topk', 8): 'leave the inputs as they are',
    ('route_topk', 9): 'softmax probabilities underflow to 0',
    ('route_topk', 10): 'as a softmax shifted by the mean of the chosen logits',
    ('capacity', 0): 'your experts keep 22 copies',
    ('capacity', 1): 'your experts keep one copy more than C = 66',
    ('capacity', 2): 'your queue serves choice by choice',
    ('capacity', 3): 'your experts keep one copy more than C = 66',
    ('capacity', 4): 'your experts keep 22 copies',
    ('capacity', 5): 'a boolean array',
    ('capacity', 6): 'your capacity leaves out k',
    ('capacity', 7): 'your queue serves the last copies first',
    ('capacity', 8): 'your function used a None argument',
    ('capacity', 9): 'your queue serves the last copies first',
    ('capacity', 10): 'your queue serves choice by choice',
    ('capacity', 11): 'computed from float32(',
    ('capacity', 12): 'you keep every copy',
    ('capacity', 13): 'but computed from the float 1.1 it comes out 66 + 1.4e-14 and rounds up',
    ('capacity', 14): 'but computed from the float 1.1 it comes out 55 + 7.1e-15 and rounds up',
    ('capacity', 15): 'but computed from the float 1.1 it comes out 66 + ',
    ('moe_stats', 0): 'your bytes count the dropped copies',
    ('moe_stats', 1): 'your bytes count the copies whose expert is on t',
    ('moe_stats', 2): 'your bytes count the dispatch only',
    ('moe_stats', 3): 'your load counts the dropped copies too',
    ('moe_stats', 4): 'np.bincount returns only largest id + 1 counts',
    ('moe_stats', 5): 'you put expert i on GPU i mod Ne',
    ('moe_stats', 6): 'your bytes put token t on GPU t mod Ne',
    ('moe_stats', 7): 'your drop rate divides by the N tokens',
    ('moe_stats', 8): 'e was not passed here',
    ('moe_stats', 9): 'your array is uint16, which holds only 0..65535',
    ('moe_stats', 10): 'your array is uint8, which holds only 0..255',
    ('aux_loss', 0): 'your f_i counts copies per token',
    ('aux_loss', 1): 'your loss has no factor E',
    ('aux_loss', 2): 'if one of them counts something per expert or GPU, np.bincount returns',
    ('aux_loss', 3): 'your P_i are the hard fractions f_i',
    ('aux_loss', 4): "your f_i count only each token's first choice",
    ('aux_loss', 5): 'your loss has no factor E',
    ('aux_loss', 6): 'alpha was not passed here',
    ('aux_loss', 7): 'your P_i sum the probabilities over the tokens',
}


def _name(fn):
    return getattr(fn, "__qualname__", str(fn)).replace(".<locals>.", ":")


def _cases(table):
    return [pytest.param(ex, i, fn, id=f"{ex}-{i}-{_name(fn)}") for ex, fns in table.items()
            for i, fn in enumerate(fns)]


def test_every_exercise_has_three_right_and_six_wrong_answers():
    assert set(RIGHT) == set(WRONG) == set(checks.EXERCISES)
    assert set(HINTS) == {(ex, i) for ex, fns in WRONG.items() for i in range(len(fns))}
    for ex in checks.EXERCISES:
        assert len(RIGHT[ex]) >= 3, ex
        assert len(WRONG[ex]) >= 6, ex


@pytest.mark.parametrize("seeds", SEED_SHARES)
@pytest.mark.parametrize("exercise,i,fn", _cases(RIGHT))
def test_right_answer_is_accepted_for_every_seed(exercise, i, fn, seeds, capsys):
    check = getattr(checks, f"check_{exercise}")
    for seed in seeds:
        check(fn, seed=seed)
        assert checks.OUTCOMES[-1]["passed"] is True, (seed, checks.OUTCOMES[-1]["message"])
    assert capsys.readouterr().out.count("passed") == len(seeds)


@pytest.mark.parametrize("seeds", SEED_SHARES)
@pytest.mark.parametrize("exercise,i,fn", _cases(WRONG))
def test_wrong_answer_is_rejected_for_every_seed(exercise, i, fn, seeds, capsys):
    check = getattr(checks, f"check_{exercise}")
    for seed in seeds:
        with pytest.raises(CheckFailed) as info, np.errstate(all="ignore"):
            check(fn, seed=seed)
        msg = str(info.value)
        assert msg.startswith(f"check_{exercise} failed"), msg
        assert len(msg.splitlines()) >= 2, msg            # where + (yours/target or hint)
        hint = next(line for line in msg.splitlines() if line.startswith("hint: "))
        assert HINTS[exercise, i] in hint, (seed, msg)
        assert checks.OUTCOMES[-1]["passed"] is False
    assert "passed" not in capsys.readouterr().out


@pytest.mark.parametrize("exercise,i,fn", _cases(WRONG))
def test_the_grader_path_rejects_too(exercise, i, fn):
    """The grader calls ``body(fn, rng)`` with its own generator: the fixed cases still run."""
    body = checks.EXERCISES[exercise].body
    with pytest.raises((CheckFailed, checks.core.StudentError)), np.errstate(all="ignore"):
        body(fn, np.random.default_rng(12345))


_CODE = re.compile(r"\bnp\.\w+\(|\bmath\.\w+\(|Fraction\(|\w+ = \w+\(|\breturn \w+\(|\[:, :k\]|axis=\d")


@pytest.mark.parametrize("exercise", sorted(WRONG))
def test_no_hint_spells_out_the_answer(exercise):
    """The hints name the mistake and the rule, in words: no solution code (a NumPy call,
    an assignment, a slice) in the hint of any wrong answer's failure."""
    for i, fn in enumerate(WRONG[exercise]):
        with pytest.raises(CheckFailed) as info, np.errstate(all="ignore"):
            getattr(checks, f"check_{exercise}")(fn, seed=0)
        for line in str(info.value).splitlines():
            if line.startswith("hint:"):
                assert not _CODE.search(line), (exercise, i, line)


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
