"""One-line wrappers around the course's own code, one per exercise: what a student might
hand in after reading the notebook's exploration cells. Neither the check cell nor the
grader accepts any of them (tests/test_one_verdict.py): each calls a course function that
its exercise may not use (lesson10/checks/refused.py)."""
from lesson10 import cost, layouts, sim
from lesson10.sim import SimGroup


def reduce_scatter(xs):
    return SimGroup(len(xs)).reduce_scatter(xs)


def all_gather(shards):
    return SimGroup(len(shards)).all_gather(shards)


def sp_forward(partials, op, reduce_scatter=None, all_gather=None):
    return sim.sp_forward(partials, op)


def sp_bytes(s, h, t, e=2):
    return (cost.comm_bytes("sp", s, h, t, e=e),) * 2


def block_attention(q, k, v, q_pos, k_pos, causal=True):
    return sim.attention(q, k, v, causal=causal, q_pos=q_pos, k_pos=k_pos)


def merge(o1, lse1, o2, lse2):
    return sim.merge(o1, lse1, o2, lse2)


def ring_attention(q_shards, k_shards, v_shards, positions, causal=True, group=None,
                   block_attention=None, merge=None):
    return sim.ring_attention(q_shards, k_shards, v_shards, positions, causal=causal)


def zigzag_positions(s, n):
    return layouts.shard_positions(s, n, "zigzag")


def causal_work(positions):
    return layouts.causal_work(len(positions), "zigzag", s=sum(len(p) for p in positions))


def ring_time(work):
    return layouts.ring_time(work)


def seq_to_heads(shards, group=None):
    return sim.seq_to_heads(shards, group)


def heads_to_seq(shards, group=None):
    return sim.heads_to_seq(shards, group)


def ulysses_attention(q_shards, k_shards, v_shards, positions, causal=True, group=None,
                      attention=None):
    return sim.ulysses_attention(q_shards, k_shards, v_shards, positions, causal, group=group,
                                 attention=attention)


def ulysses_bytes(s, h, n, g=1, e=2):
    return cost.comm_bytes("ulysses", s, h, n, g, e)


def route_topk(logits, k):
    return sim.route_topk(logits, k)


def capacity_keep(experts, E, capacity_factor):
    return sim.keep_within_capacity(experts, E, cost.expert_capacity(
        len(experts), E, experts.shape[1], capacity_factor))


def moe_stats(experts, keep, Ne, E, h, e=2):
    return sim.moe._kept_per_source(experts, keep, E, Ne)


def switch_aux_loss(probs, experts, alpha=1e-2):
    return sim.switch_aux_loss(probs, experts, alpha)


# --------------------------------------------------------------------------- stub modules
# wrappers that reach their answer through a module the grader's sandbox ships as a stub
# (the checks' own code, spmd, figures): refused by both paths too
def merge_from_the_check(o1, lse1, o2, lse2):
    from lesson10.checks.network import Referee
    from lesson10.checks.served_ring import ServedMerge
    return ServedMerge(Referee("merge", "merge"))(o1, lse1, o2, lse2)


def block_attention_by_spmd(q, k, v, q_pos, k_pos, causal=True):
    import torch

    from lesson10.spmd import reference
    q, k, v = (torch.as_tensor(x)[None] for x in (q, k, v))         # (1, s, a, d)
    out, lse = reference.attention(q, k, v, causal=causal, q_pos=torch.as_tensor(q_pos),
                                   k_pos=torch.as_tensor(k_pos))
    return out[0], lse[0]                     # CPU tensors: the return rule converts them


def switch_aux_loss_with_a_figure(probs, experts, alpha=1e-2):
    from lesson10 import figures
    figures.draw_moe_capacity()
    raise AssertionError("the figure should have been refused")


#: (exercise, wrapper) of the wrappers above
THROUGH_STUBS = [("merge", merge_from_the_check), ("block_attention", block_attention_by_spmd),
                 ("aux_loss", switch_aux_loss_with_a_figure)]
