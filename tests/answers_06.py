"""Answers to notebook 06's exercises, for tests/test_nb06_checks.py: the solution and the
known-wrong ones each check must reject (the ranks import this file as the student's cell)."""
import torch
import torch.distributed as dist


def ring_shift(x, group=None):
    n, r = dist.get_world_size(group), dist.get_rank(group)
    nxt = dist.get_global_rank(group, (r + 1) % n) if group is not None else (r + 1) % n
    prv = dist.get_global_rank(group, (r - 1) % n) if group is not None else (r - 1) % n
    got = torch.empty_like(x)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, nxt, group),
                                   dist.P2POp(dist.irecv, got, prv, group)])
    for req in reqs:
        req.wait()
    return got


def _posted(x, group, send_step=1, recv_step=-1, into=None, global_peers=False):
    """A batch of an isend to group rank r + send_step and an irecv from r + recv_step (into
    ``into``, or a new tensor); with ``global_peers`` the group's ranks are passed as global."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    got = torch.empty_like(x) if into is None else into
    sent = x if into is not x else x.clone()
    if global_peers:
        ops = [dist.P2POp(dist.isend, sent, (r + send_step) % n, group),
               dist.P2POp(dist.irecv, got, (r + recv_step) % n, group)]
    else:
        ops = [dist.P2POp(dist.irecv, got, group=group, group_peer=(r + recv_step) % n),
               dist.P2POp(dist.isend, sent, group=group, group_peer=(r + send_step) % n)]
    return got, dist.batch_isend_irecv(ops)


def ring_shift_group_peer(x, group=None):
    """Right too: P2POp's group_peer takes the group's own ranks."""
    got, reqs = _posted(x, group)
    for req in reqs:
        req.wait()
    return got


def ring_shift_wrong_way(x, group=None):
    got, reqs = _posted(x, group, send_step=-1, recv_step=1)
    for req in reqs:
        req.wait()
    return got


def ring_shift_no_wait(x, group=None):
    return _posted(x, group)[0]


def ring_shift_group_ranks_as_peers(x, group=None):
    got, reqs = _posted(x, group, global_peers=True)
    for req in reqs:
        req.wait()
    return got


def ring_shift_into_x(x, group=None):
    got, reqs = _posted(x, group, into=x)
    for req in reqs:
        req.wait()
    return got


def ring_shift_send_only(x, group=None):
    n, r = dist.get_world_size(group), dist.get_rank(group)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, group=group, group_peer=(r + 1) % n)])
    for req in reqs:
        req.wait()
    return x


def ring_shift_fails_on_rank_0(x, group=None):
    """Raises on one rank only: the others must not wait for it forever."""
    if dist.get_rank() == 0:
        raise ValueError("only rank 0 fails")
    return ring_shift(x, group)


def ring_shift_stub(x, group=None):
    raise NotImplementedError("your code here: replace this line")


class GatherFromSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group=None):
        ctx.group = group
        n = dist.get_world_size(group)
        parts = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, dy):
        n = dist.get_world_size(ctx.group)
        chunks = [c.contiguous() for c in dy.chunk(n, dim=1)]
        out = torch.empty_like(chunks[0])
        dist.reduce_scatter(out, chunks, group=ctx.group)
        return out, None


class GatherAllReduceBackward(GatherFromSP):
    @staticmethod
    def backward(ctx, dy):
        n, r = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        full = dy.contiguous().clone()
        dist.all_reduce(full, group=ctx.group)
        return full.chunk(n, dim=1)[r].contiguous(), None


class GatherFullGradient(GatherFromSP):
    @staticmethod
    def backward(ctx, dy):
        full = dy.contiguous().clone()
        dist.all_reduce(full, group=ctx.group)
        return full, None


class GatherNoSum(GatherFromSP):
    @staticmethod
    def backward(ctx, dy):
        n, r = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        return dy.chunk(n, dim=1)[r].contiguous(), None


class GatherWrongChunk(GatherFromSP):
    @staticmethod
    def backward(ctx, dy):
        n = dist.get_world_size(ctx.group)
        chunks = [c.contiguous() for c in dy.chunk(n, dim=1)][::-1]
        out = torch.empty_like(chunks[0])
        dist.reduce_scatter(out, chunks, group=ctx.group)
        return out, None


class GatherOneGradient(GatherFromSP):
    @staticmethod
    def backward(ctx, dy):
        return GatherFromSP.backward(ctx, dy)[0]


class GatherBatchDim(GatherFromSP):
    @staticmethod
    def forward(ctx, x, group=None):
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=0)


class GatherFailsOnRank0(GatherFromSP):
    """Raises on one rank only: the others must not wait for it forever."""
    @staticmethod
    def forward(ctx, x, group=None):
        if dist.get_rank() == 0:
            raise ValueError("only rank 0 fails")
        return GatherFromSP.forward(ctx, x, group)


class GatherStub(GatherFromSP):
    @staticmethod
    def backward(ctx, dy):
        raise NotImplementedError("your code here: replace this line")


def judge_on_ranks(jobs: list) -> list:
    """In each rank: ``[(kind, path, name)]`` -> each job's report (``kind``: "ring" or "sp"),
    so that one launch runs every answer of tests/test_nb06_checks.py."""
    from lesson10.checks.nb06_ranks import gather_ranks, ring_shift_ranks
    return [(ring_shift_ranks if kind == "ring" else gather_ranks)(path, name) for kind, path, name in jobs]


def ring_shift_blocking(x, group=None):
    """Deadlocks: every rank is in its blocking send, and no rank has reached its recv."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    got = torch.empty_like(x)
    dist.send(x, group=group, group_dst=(r + 1) % n)
    dist.recv(got, group=group, group_src=(r - 1) % n)
    return got


def ring_shift_slow(x, group=None):
    """Right, but rank 0 computes for a while (6 s) before it posts its batch: its peers wait
    in theirs meanwhile, and the check must not stop them."""
    import time
    if dist.get_rank() == 0 and x.dtype == torch.float64:
        time.sleep(6)
    n, r = dist.get_world_size(group), dist.get_rank(group)
    got = torch.empty_like(x)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x, group=group, group_peer=(r + 1) % n),
                                   dist.P2POp(dist.irecv, got, group=group, group_peer=(r - 1) % n)])
    for req in reqs:
        req.wait()
    return got
