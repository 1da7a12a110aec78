"""A part of a multi-point exercise is earned only with the method (issue 30): every part has
cases that a constant or trivial answer fails (nothing, everything, zeros, the inputs handed
back), and a part whose inputs could be few draws its random cases from ranges too large to
tabulate: a table of every case in the part's visible ranges does not pass it.

Each part is judged as the grader judges it: the exercise's body inside
``parts.judging(part)``, which runs that part's cases only; it passes when the body returns
and at least one case of the part ran."""
import numpy as np
import pytest

from lesson10 import layouts
from lesson10.checks import EXERCISES, CheckFailed
from lesson10.checks import parts as checks_parts
from lesson10.checks.verdict import StudentError

SEEDS = (0, 1, 2, 7)


def _part_passes(exercise, part, fn, seed) -> bool:
    with checks_parts.judging(part) as state, np.errstate(all="ignore"):
        try:
            EXERCISES[exercise].body(fn, np.random.default_rng(seed))
        except (CheckFailed, StudentError):
            return False
    return state["cases"] > 0


def _zeros_like_each(xs):
    return [np.zeros(np.shape(x)) for x in xs]


def _sp_zeros(partials, op, reduce_scatter=None, all_gather=None):
    return _zeros_like_each(partials)


def _sp_inputs(partials, op, reduce_scatter=None, all_gather=None):
    return [np.array(p, dtype=float) for p in partials]


def _attn_zeros(q_shards, k_shards, v_shards, positions, causal=True, group=None, **kw):
    return _zeros_like_each(q_shards)


def _attn_values(q_shards, k_shards, v_shards, positions, causal=True, group=None, **kw):
    return [np.array(v, dtype=float) for v in v_shards]       # the values handed back


def _work_zeros(positions):
    return np.zeros((len(positions), len(positions)), dtype=int)


def _work_all_pairs(positions):           # every pair counted: no mask at all
    n = len(positions)
    return np.array([[len(positions[r]) * len(positions[(r - k) % n]) for r in range(n)]
                     for k in range(n)])


def _keep_all(experts, E, capacity_factor):
    return np.ones(np.shape(experts), dtype=bool)


def _keep_none(experts, E, capacity_factor):
    return np.zeros(np.shape(experts), dtype=bool)


def _stats_zeros(experts, keep, Ne, E, h, e=2):
    return {"drop_rate": 0.0, "bytes_per_gpu": np.zeros(Ne), "load_per_gpu": np.zeros(Ne)}


def _stats_all_kept(experts, keep, Ne, E, h, e=2):   # as if nothing were dropped or local
    n, k = np.shape(experts)
    return {"drop_rate": 0.0, "bytes_per_gpu": np.full(Ne, 2.0 * n * k * h * e / Ne),
            "load_per_gpu": np.full(Ne, n * k / Ne)}


TRIVIAL = {
    "sp_forward": [_sp_zeros, _sp_inputs],
    "ring_attention": [_attn_zeros, _attn_values],
    "ulysses_attention": [_attn_zeros, _attn_values],
    "causal_work": [_work_zeros, _work_all_pairs],
    "capacity": [_keep_all, _keep_none],
    "moe_stats": [_stats_zeros, _stats_all_kept],
}


def test_every_multi_part_exercise_has_trivial_answers_here():
    assert set(TRIVIAL) == {ex.id for ex in EXERCISES.values() if ex.parts}


@pytest.mark.parametrize("exercise,part,fn", [
    pytest.param(ex, part, fn, id=f"{ex}-{part}-{fn.__name__}")
    for ex, fns in TRIVIAL.items() for part, _ in EXERCISES[ex].parts for fn in fns])
def test_a_trivial_answer_wins_no_part(exercise, part, fn):
    for seed in SEEDS:
        assert not _part_passes(exercise, part, fn, seed), (exercise, part, fn.__name__, seed)


def test_keep_everything_wins_no_capacity_part():
    """The held-out round's case: np.ones won the old "without drops" part. Now each part has
    routings with drops and without; the right answer still wins both."""
    from answers_04_05 import cap_fraction_loops
    for part, _ in EXERCISES["capacity"].parts:
        assert _part_passes("capacity", part, cap_fraction_loops, 3)
        assert not _part_passes("capacity", part, _keep_all, 3)


def test_a_right_count_in_the_wrong_order_earns_the_count_part_only():
    from answers_04_05 import make_capacity
    by_choice = make_capacity(token_major=False)
    got = {part: _part_passes("capacity", part, by_choice, 5) for part, _ in EXERCISES["capacity"].parts}
    assert got == {"copies kept per expert": True, "which copies are dropped": False}


def _visible_table():
    """Every named layout in the ranges the check's named cases used to come from (N_c 1..12,
    1..6 tokens per chunk) and in its fixed cases: positions -> the counts."""
    table = {}
    sizes = [(lay, s, n) for lay in ("contiguous", "zigzag", "striped") for n in range(1, 13)
             for c in range(1, 7) for s in [(2 * n if lay == "zigzag" else n) * c]]
    sizes += [("contiguous", 48, 2), ("contiguous", 600, 2)]
    for lay, s, n in sizes:
        pos = layouts.shard_positions(s, n, lay)
        table[tuple(tuple(int(i) for i in p) for p in pos)] = np.array(
            [[int((pos[(r - k) % n][None, :] <= pos[r][:, None]).sum()) for r in range(n)]
             for k in range(n)])
    return table


def test_a_table_of_the_visible_named_layouts_does_not_win_the_first_part():
    table = _visible_table()

    def looked_up(positions):
        key = tuple(tuple(int(i) for i in p) for p in positions)
        return table.get(key, _work_zeros(positions))

    # the table is right wherever it has the entry: the fixed cases pass
    fixed = layouts.shard_positions(12, 3, "zigzag")
    assert np.array_equal(looked_up(fixed), table[tuple(tuple(int(i) for i in p) for p in fixed)])
    for seed in range(8):
        assert not _part_passes("causal_work", "named layouts", looked_up, seed), seed
