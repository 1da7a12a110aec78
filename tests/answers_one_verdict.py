"""Honest answers that return what the return rule converts (lesson10/checks/returns.py):
exact numbers, torch tensors, object arrays. The check cell and the grader both pass them
(tests/test_one_verdict.py)."""
import math
from decimal import Decimal
from fractions import Fraction

import numpy as np


def sp_bytes_fraction(s, h, t, e=2):          # exact: Fraction(t - 1, t)
    n = s * h * e
    return 4 * Fraction(t - 1, t) * n, 4 * Fraction(t - 1, t) * n


def ulysses_bytes_decimal(s, h, n, g=1, e=2):  # exact decimal arithmetic
    local = Decimal(s) / Decimal(n) * Decimal(h) * Decimal(e)
    return (Decimal(n) - 1) / Decimal(n) * (2 * local + 2 * local / Decimal(g))


def ulysses_bytes_object_array(s, h, n, g=1, e=2):
    return np.array([Fraction(n - 1, n) * Fraction(s, n) * h * e * (2 + Fraction(2, g))],
                    dtype=object)[0]


def block_attention_torch(q, k, v, q_pos, k_pos, causal=True):
    import torch
    q, k, v = (torch.as_tensor(np.asarray(x, dtype=np.float64)) for x in (q, k, v))
    x = torch.einsum("iad,jad->aij", q, k) / math.sqrt(q.shape[-1])
    if causal:
        seen = torch.as_tensor(np.asarray(k_pos))[None, :] <= torch.as_tensor(np.asarray(q_pos))[:, None]
        x = torch.where(seen[None], x, torch.tensor(-math.inf, dtype=x.dtype))
    lse = torch.logsumexp(x, dim=-1)                                   # (a, s_q)
    p = torch.exp(x - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))[..., None])
    out = torch.einsum("aij,jad->iad", p, v)
    return out, lse.T


def block_attention_torch_grad(q, k, v, q_pos, k_pos, causal=True):   # tensors that need grad
    out, lse = block_attention_torch(q, k, v, q_pos, k_pos, causal)
    return out.requires_grad_(), lse


def merge_torch_list(o1, lse1, o2, lse2):      # a list of two tensors
    import torch
    o1, lse1, o2, lse2 = (torch.as_tensor(np.asarray(x, dtype=np.float64)) for x in (o1, lse1, o2, lse2))
    lse = torch.logaddexp(lse1, lse2)
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    w1 = torch.where(torch.isfinite(lse1), torch.exp(lse1 - safe), torch.zeros_like(lse))
    w2 = torch.where(torch.isfinite(lse2), torch.exp(lse2 - safe), torch.zeros_like(lse))
    return [w1[..., None] * o1 + w2[..., None] * o2, lse]


#: exercise -> honest answers whose return the rule converts
CONVERTED = {
    "sp_bytes": [sp_bytes_fraction],
    "ulysses_bytes": [ulysses_bytes_decimal, ulysses_bytes_object_array],
    "block_attention": [block_attention_torch, block_attention_torch_grad],
    "merge": [merge_torch_list],
}


# --------------------------------------------------------------------------- served, from elsewhere
def _ring(q_shards, k_shards, v_shards, positions, causal, group, run_round):
    from answers_01_03 import merge_logaddexp
    n = len(q_shards)
    out = [np.zeros_like(q) for q in q_shards]
    lse = [np.full(q.shape[:2], -np.inf) for q in q_shards]
    held = list(zip(k_shards, v_shards, positions))
    for step in range(n):
        jobs = [(q_shards[r], held[r][0], held[r][1], positions[r], held[r][2], causal)
                for r in range(n)]
        for r, (ob, lb) in enumerate(run_round(jobs)):
            out[r], lse[r] = merge_logaddexp(out[r], lse[r], ob, lb)
        if step != n - 1:
            held = group.ring_shift(held)
    return out


def ring_threads(q_shards, k_shards, v_shards, positions, causal=True, group=None,
                 block_attention=None, merge=None):     # every rank's round in a thread: works
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(2) as pool:
        return _ring(q_shards, k_shards, v_shards, positions, causal, group,
                     lambda jobs: list(pool.map(lambda a: block_attention(*a), jobs)))


def ring_fork_pool(q_shards, k_shards, v_shards, positions, causal=True, group=None,
                   block_attention=None, merge=None):   # the rounds in forked workers: refused
    import multiprocessing
    with multiprocessing.get_context("fork").Pool(2) as pool:
        return _ring(q_shards, k_shards, v_shards, positions, causal, group,
                     lambda jobs: pool.starmap(block_attention, jobs))


#: exercise -> answers that call what the check served from a thread (pass) or from a
#: forked pool worker (refused with a sentence about pools)
ELSEWHERE = {"ring_attention": [ring_threads, ring_fork_pool]}


def sp_bytes_set(s, h, t, e=2):                 # a set: the return rule refuses it in both
    return {4 * (t - 1) / t * s * h * e}
