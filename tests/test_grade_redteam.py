"""Red team of the grader (issue 14): every class of trick and fault, several variants each.

Each case is a submission made by a small function from the course's own notebooks
(:mod:`redteam.build`, :mod:`redteam.cells`), with what it must score: 0 for the exercises a
cheat targets, full marks for honest work, and faults cost only what they break (the other
exercises, and the next students in the batch, keep their points). All cases are graded in
ONE run of ``python -m lesson10 grade -j 2`` with short limits; three small runs beside it
check the notebook's time limit and the grading without a sandbox. The limits are set for an
idle two-core machine and scaled by a calibration measured first (:mod:`redteam.clock`): a
hang is a cell that never ends, so it is cut by any limit, and honest work fits the limits
on a machine however slow or busy. The grader runs with a
temporary copy of the package (PYTHONPATH), so whatever a submission might do to "the
installed package" could only ever reach that copy, never this checkout.

Around the run the test sets up what a submission must not reach: a *canary* process
(an attack that can see it kills only it), listeners on 127.0.0.1 and on an abstract unix
socket, and a token that every file an attack writes carries in its name. Afterwards it
looks for the canary, the listeners' logs, the token on the host's disk and in its
processes, and reads the graded run's outputs (``--save-executed``): what each attack
found (``FOUND``), and what the victims saw (``REPORT victim``).

Cases marked ``needs_contract`` need the exercise contract of issue 14 (ring_attention's
``group=``, Ulysses' ``group=`` and ``attention=``, the checks' ranges too large to
tabulate); they run when the solution notebooks have it (read from their signatures), and
``LESSON10_REDTEAM_CONTRACT=0`` / ``=1`` switches them off / on.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from redteam import build as B
from redteam import cells as C
from redteam import clock

pytestmark = pytest.mark.slow   # a whole command end to end: make test-slow

NB01, NB02, NB03, NB04, NB05 = ("01_sequence_parallel", "02_ring_attention", "03_load_balance",
                                "04_ulysses", "05_moe_dispatch")
COURSE = (NB01, NB02, NB03, NB04, NB05)
SEED = 424242                       # the hidden cases' seed: fixed, so a failure replays
# cell, exercise and notebook limits (s) on the idle reference machine; scaled (redteam.clock)
LIMITS = {"cell": 8, "exercise": 4, "notebook": 120}
RUN_TIMEOUT = 420                   # the batch must finish well within this (s, scaled too)
BATCH_WALL = 300                    # ... and within this (s, scaled): the hangs cost only limits
SLOW_NOTEBOOK = 12                  # the notebook limit of the small run that must be cut (scaled)


def _new_contract() -> bool:
    env = os.environ.get("LESSON10_REDTEAM_CONTRACT")
    if env:
        return env == "1"
    return "group" in B.params(NB02, "ring_attention") and \
        "attention" in B.params(NB04, "ulysses_attention")


NEW_CONTRACT = _new_contract()
ANY = None                          # any status, as long as it scores 0


# ------------------------------------------------------------------ cases
@dataclass
class Case:
    name: str
    group: str                                   # the class of issue 14
    make: Callable                               # make(ctx) -> notebook dict or text
    notebook: str | None = NB03                  # the course notebook it is graded as
    lost: dict = field(default_factory=dict)     # exercise -> accepted statuses (ANY) at 0
    file: str | None = None                      # file name (default: <notebook>.ipynb)
    files: dict = field(default_factory=dict)    # helper files beside it
    needs_contract: bool = False
    own_grade: bool = True                       # False: only what it does to others counts
    why: str = ""

    @property
    def filename(self) -> str:
        return self.file or f"{self.notebook or NB03}.ipynb"


CASES: list[Case] = []


def case(name, group, make, **kw) -> Case:
    c = Case(name, group, make, **kw)
    assert all(x.name != name for x in CASES), name
    CASES.append(c)
    return c


def edited(nb_id: str = NB03, defs: dict | None = None, blank: bool = False, **insert) -> Callable:
    """``make``: the reduced notebook with function cells replaced (``defs``: function ->
    source) and, optionally, cells inserted (:func:`redteam.build.insert`)."""
    def make(ctx):
        nb = B.reduced(nb_id, blank=blank)
        for fn, src in (defs or {}).items():
            nb = B.replace_def(nb, fn, src(ctx) if callable(src) else src)
        for where, srcs in insert.items():
            srcs = [s(ctx) if callable(s) else s for s in (srcs if isinstance(srcs, list) else [srcs])]
            nb = B.insert(nb, *srcs, **{where: True} if where in ("after_imports", "at_end")
                          else {where.split("__")[0]: where.split("__")[1]})
        return nb
    return make


def lose(*exercises, status=ANY) -> dict:
    return {ex: status for ex in exercises}


ALL03 = ("causal_work", "ring_time", "zigzag_positions")
EXIDS = {nb: [ex.id for ex in B.exercises(nb)] for nb in COURSE}


# -- 1. course code where student code runs -----------------------------------------------
_HOWS = ["direct", "to_check", "fallback", "thread", "try_except"]


def _reference_everywhere(nb_id: str, offset: int):
    """Every exercise of ``nb_id`` that a notebook cell reaches a course reference for
    (its ``checks.fallback(fn, ref)``) answered with that reference, a different way each."""
    refs = B.fallback_references(nb_id)
    plan = {fn: _HOWS[(i + offset) % len(_HOWS)] for i, fn in enumerate(refs)}

    def make(ctx):
        nb = B.reduced(nb_id)
        for fn, how in plan.items():
            ex = B.exercise_of_function(fn)
            if how == "to_check":                      # the reference itself goes to the check
                nb = B.replace_check(nb, ex, f"checks.check_{ex}({refs[fn]})")
            else:
                nb = B.replace_def(nb, fn, C.call_reference(B.header(nb_id, fn), refs[fn], how))
        return nb
    return make, lose(*(B.exercise_of_function(fn) for fn in plan))


for _i, _nb in enumerate(COURSE):
    _make, _lost = _reference_everywhere(_nb, _i)
    case(f"reference_calls_{_nb[:2]}", "course code", _make, notebook=_nb, lost=_lost)

case("nb03_reference_calls", "course code",
     edited(defs={B.function_of(ex): C.call_reference(B.header(NB03, B.function_of(ex)),
                                                      C.NB03_REF[ex], how)
                  for ex, how in zip(ALL03, ("direct", "thread", "try_except"))}),
     # notebook 03's sandbox holds the real sim.attention (no exercise of 03 asks for it):
     # counting visible keys with its lse, round k against block (r - k) mod N_c, is the
     # student's own causal_work, as np.sum of a mask would be; the references stay out
     lost=lose("zigzag_positions", "ring_time"),
     why="zigzag_positions and ring_time through their references")
# causal_work's copy of sim.attention (real in 03's sandbox) only counts visible keys: the
# rounds are the student's own (see nb03_reference_calls); the references stay out
case("code_object_copies", "course code", edited(defs=C.code_copies()),
     lost=lose("zigzag_positions", "ring_time"))
case("patched_in_place", "course code", edited(defs=C.patches()), lost=lose(*ALL03))
case("source_from_disk_a", "course code", edited(
    defs={"ring_time": C.stolen("ring_time", "standin"),
          "zigzag_positions": C.stolen("zigzag_positions", "sitepackages"),
          "causal_work": C.stolen("causal_work", "embedded")},
    after_imports=C.finder), lost=lose(*ALL03))
case("source_from_disk_b", "course code", edited(
    defs={"ring_time": C.stolen("ring_time", "proc"),
          "zigzag_positions": C.stolen("zigzag_positions", "walk"),
          "causal_work": C.stolen("causal_work", "pyc")},
    after_imports=C.finder), lost=lose(*ALL03))
case("source_from_other_python", "course code", edited(
    defs={"ring_time": C.stolen("ring_time", "subprocess")}, after_imports=C.finder),
    lost=lose("ring_time"))
case("grade_internals_blank", "course code", edited(blank=True, after_imports=C.grade_internals()),
     lost=lose(*ALL03))
case("grade_internals_solved", "course code", edited(
    defs={"ring_time": "def ring_time(work):\n    return -1\n"},
    after_imports=C.grade_internals()), lost=lose("ring_time"))
case("check_function_replaced", "course code", edited(
    defs={"ring_time": "def ring_time(work):\n    return -1\n",
          "zigzag_positions": "def zigzag_positions(s, n):\n    return []\n"},
    before_check__ring_time="checks.check_ring_time = lambda fn, **kw: print('check_ring_time passed')",
    before_check__zigzag_positions=(
        "import sys\n_fake = lambda fn, **kw: print('check_zigzag_positions passed')\n"
        "sys.modules['lesson10.checks'].check_zigzag_positions = _fake\n"
        "checks.__dict__['check_zigzag_positions'] = _fake")),
    lost=lose("ring_time", "zigzag_positions"))

# -- 2. reaching the judge ---------------------------------------------------------------
_sig = C.signals()
case("signal_handlers", "reaching the judge", edited(
    defs={"ring_time": _sig["ring_time"], "zigzag_positions": _sig["zigzag_positions"]},
    after_imports=_sig["_handler"]), lost=lose("ring_time", "zigzag_positions"))
case("sys_monitoring", "reaching the judge", edited(defs={"ring_time": C.monitoring()}),
     lost=lose("ring_time"), why="a stub on Python < 3.12")
case("settrace_setprofile", "reaching the judge", edited(defs=C.tracing()),
     lost=lose("ring_time", "zigzag_positions"))
case("gc_and_frames", "reaching the judge", edited(defs=C.introspection()),
     lost=lose("ring_time", "zigzag_positions"))
case("array_likes", "reaching the judge", edited(defs=C.array_likes()), lost=lose(*ALL03))
case("forged_frames_in_functions", "reaching the judge", edited(
    defs={"ring_time": lambda ctx: C.forge_frames(ctx, "return"),
          "zigzag_positions": lambda ctx: C.forge_frames(ctx, "exit")}),
    lost=lose("ring_time", "zigzag_positions"))
case("forged_frames_blank", "reaching the judge", edited(
    blank=True, after_imports=lambda ctx: C.forge_frames(ctx, "cell")), lost=lose(*ALL03))
case("forged_frames_honest", "reaching the judge", edited(
    after_imports=lambda ctx: C.forge_frames(ctx, "cell")),
    why="junk on the runner's descriptors breaks at most the cell that wrote it")
case("forged_protocol_fatal", "reaching the judge", edited(
    after_check__causal_work=C.forged_protocol("fatal")),
    why="a 'fatal' in the runner's own framing, between cells: the cell is skipped, the "
        "grader does not fail")
case("forged_protocol_bad_index", "reaching the judge", edited(
    after_check__causal_work=C.forged_protocol("bad_index")),
    why="messages the judge cannot index by: the cell is skipped, the grader does not fail")
case("forged_protocol_from_the_fork", "reaching the judge", edited(
    defs={"ring_time": C.forged_protocol("fork")}), lost=lose("ring_time"),
    why="frames on a saved copy of the runner's socket, written by the judged function")

# -- 3. outputs compared, not the method -------------------------------------------------
_KEY = C.dedent("""
    import hashlib
    import numpy as np
    def _key(args):
        h = hashlib.sha256()
        def feed(x):
            if isinstance(x, (list, tuple)):
                h.update(b'[%d' % len(x))
                for y in x:
                    feed(y)
                h.update(b']')
            else:
                a = np.asarray(x)
                h.update(repr((a.shape, a.dtype.str)).encode())
                h.update(np.ascontiguousarray(a).tobytes())
        feed(list(args))
        return h.hexdigest()
    """)


def _answer_table(ex_id: str, seeds) -> dict:
    """What the check cell asks for ``ex_id`` with these seeds, and the answers (the
    solution's function, run here): what a student could note down from the notebook."""
    from lesson10.checks import EXERCISES
    ns: dict = {}
    exec(_KEY, ns)
    fn = B.solution_function(EXERCISES[ex_id].notebook, EXERCISES[ex_id].function)
    table = {}

    def recorder(*args, **kwargs):
        out = fn(*args, **kwargs)
        table[ns["_key"](args)] = np.asarray(out).tolist()
        return out
    for seed in seeds:
        EXERCISES[ex_id].body(recorder, np.random.default_rng(seed))
    return table


def _table_ring_time(seeds) -> Callable:
    def src(ctx):
        return _KEY + f"_TABLE = {_answer_table('ring_time', seeds)!r}\n" + C.dedent("""
            def ring_time(work):
                return _TABLE.get(_key([work]), -1.0)
            """)
    return src


def _default_seed(ex_id: str) -> int:
    from lesson10.checks.core import seed_of
    return seed_of(ex_id)


case("answer_table_check_seed", "method", edited(
    defs={"ring_time": _table_ring_time([_default_seed("ring_time")])}), lost=lose("ring_time"),
    why="every case the check cell asks, with its answer")
case("pinned_random_and_seed", "method", edited(
    defs={"ring_time": _table_ring_time([0])},
    after_imports=C.dedent("""
        import random
        _real_rng = np.random.default_rng
        np.random.default_rng = lambda *a, **k: _real_rng(0)
        np.random.seed(0)
        random.seed(0)
        """)), lost=lose("ring_time"))
case("seed_passed_to_check", "method", lambda ctx: B.replace_check(
    edited(defs={"ring_time": _table_ring_time([0])})(ctx), "ring_time",
    "checks.check_ring_time(ring_time, seed=0)"), lost=lose("ring_time"))
case("sp_op_on_the_whole_sequence", "method", edited(NB01, defs={"sp_forward": C.dedent("""
    def sp_forward(partials, op, **served):
        y = op(np.sum(partials, axis=0))           # plain TP: op on all s tokens
        return [y.copy() for _ in partials]
    """)}), notebook=NB01, lost=lose("sp_forward"))


def _zigzag_table(ctx) -> str:
    from lesson10.layouts import shard_positions
    table = {(2 * n * m, n): [p.tolist() for p in shard_positions(2 * n * m, n, "zigzag")]
             for n in range(1, 9) for m in range(1, 6)}
    return f"_Z = {table!r}\n" + C.dedent("""
        def zigzag_positions(s, n):
            return [np.array(p) for p in _Z[(s, n)]]
        """)


case("answer_table_small_inputs", "method", edited(defs={"zigzag_positions": _zigzag_table}),
     lost=lose("zigzag_positions"), needs_contract=True,
     why="the judge draws zigzag sizes from a range too large to tabulate")


def _body(nb_id: str, fn: str, body: str) -> Callable:
    """``make``-time source: the solution's own ``def`` line(s) (whatever the contract's
    signature) over ``body``."""
    return lambda ctx: B.header(nb_id, fn) + "\n" + "".join(
        "    " + line + "\n" for line in C.dedent(body).splitlines())


def _ring(body: str) -> Callable:
    return _body(NB02, "ring_attention", body)


case("ring_gathers_all_kv", "method", edited(NB02, defs={"ring_attention": _ring("""
    n = len(q_shards)
    K, V, P = np.concatenate(k_shards), np.concatenate(v_shards), np.concatenate(positions)
    return [block_attention(q_shards[r], K, V, positions[r], P, causal)[0] for r in range(n)]
    """)}), notebook=NB02, lost=lose("ring_attention"), needs_contract=True)
_READS_DIRECTLY = """
    n = len(q_shards)
    out = [np.zeros_like(q) for q in q_shards]
    lse = [np.full(q.shape[:2], -np.inf) for q in q_shards]
    held = list(zip(k_shards, v_shards, positions))
    for step in range(n):
        for r in range(n):
            src = (r - step) % n                     # the block it should hold: read directly
            o, l = block_attention(q_shards[r], k_shards[src], v_shards[src], positions[r],
                                   positions[src], causal)
            out[r], lse[r] = merge(out[r], lse[r], o, l)
    {shift}
    return out
    """
case("ring_reads_kv_shards_directly", "method", edited(NB02, defs={"ring_attention": _ring(
    _READS_DIRECTLY.replace("{shift}", ""))}), notebook=NB02, lost=lose("ring_attention"),
    needs_contract=True)
case("ring_shifts_but_reads_kv_shards", "method", edited(NB02, defs={"ring_attention": _ring(
    _READS_DIRECTLY.replace("{shift}", "    if step < n - 1:\n            held = group.ring_shift(held)"
                                       "          # the network used as it should be"))}),
    notebook=NB02, lost=lose("ring_attention"), needs_contract=True,
    why="it shifts by the rules but attends on k_shards[j] of other ranks")
case("ulysses_attends_the_whole_sequence", "method", edited(NB04, defs={
    "ulysses_attention": _body(NB04, "ulysses_attention", """
        q, k, v = (np.concatenate(x) for x in (q_shards, k_shards, v_shards))
        pos = np.concatenate(positions)
        out = attention(q, k, v, causal=causal, q_pos=pos, k_pos=pos)[0]
        return np.split(out, np.cumsum([len(p) for p in positions])[:-1])
        """)}),
     notebook=NB04, lost=lose("ulysses_attention"), needs_contract=True)
case("ulysses_bypasses_the_all_to_all", "method", edited(NB04, defs={
    "ulysses_attention": _body(NB04, "ulysses_attention", """
        n = len(q_shards)
        for x in (q_shards, k_shards, v_shards):
            seq_to_heads(x, group)                   # the network is called, its answer unused
        q, k, v = (np.concatenate(x) for x in (q_shards, k_shards, v_shards))
        pos = np.concatenate(positions)
        split = lambda x, j: x[:, j * x.shape[1] // n:(j + 1) * x.shape[1] // n]
        out = [attention(split(q, j), split(k, j), split(v, j), causal=causal, q_pos=pos,
                         k_pos=pos)[0] for j in range(n)]   # head groups of the right shape
        return heads_to_seq(out, group)
        """)}), notebook=NB04, lost=lose("ulysses_attention"), needs_contract=True,
     why="head groups cut from the inputs instead of taken from the all-to-all")

# -- 4. honest work keeps full marks -----------------------------------------------------
for _nb in (NB01, NB04, NB05):
    case(f"honest_{_nb[:2]}", "honest", edited(_nb), notebook=_nb,
         # the old contract's Ulysses calls lesson10.sim.attention, which the sandbox has not
         needs_contract=_nb == NB04)
case("solution_02_whole_notebook", "honest", lambda ctx: B.full(NB02), notebook=NB02,
     why="display cells, figures and exploration that calls references, as written")
case("monitor_thread", "honest", edited(after_imports=C.monitor_thread()))
case("progress_bar_thread", "honest", edited(after_imports=C.progress_thread()))
case("thread_pool_in_a_function", "honest", edited(defs={"ring_time": C.thread_pool_ring_time()}),
     why="the pool's workers are threads of the notebook")
case("helpers_rebound_later", "honest", edited(
    NB01, defs=C.helpers_nb01(), at_end=C.rebind_later()), notebook=NB01)
case("writefile_module", "honest", edited(
    defs={"ring_time": "from rt_helper import ring_time\n"},
    before_def__ring_time=("%%writefile rt_helper.py\nimport numpy as np\n\n"
                           "def ring_time(work):\n    return np.asarray(work).max(axis=1).sum()\n")))
case("helper_file_beside", "honest", edited(
    defs={"zigzag_positions": "from zz_helper import zigzag_positions\n"}),
    files={"zz_helper.py": "import numpy as np\n\n\n" + B.solution_def(NB03, "zigzag_positions")})
case("check_cells_twice", "honest", lambda ctx: B.repeat_checks(B.reduced(NB03), 2))
case("check_cells_four_times", "honest", lambda ctx: B.repeat_checks(B.reduced(NB03), 4))
case("wrong_then_right", "honest", edited(before_def__ring_time=[
    "def ring_time(work):\n    return 0\n", "checks.check_ring_time(ring_time)"]),
    why="the last judged call counts")
case("right_then_wrong", "honest", edited(after_check__ring_time=[
    "def ring_time(work):\n    return 0\n", "checks.check_ring_time(ring_time)"]),
    lost=lose("ring_time", status={"failed"}), why="the last judged call counts")
case("prints_a_lot", "honest", edited(after_imports=C.print_a_lot()))


def _figures_cell() -> str:
    return next(B.source(c) for c in B.load(NB03)["cells"]
                if c["cell_type"] == "code" and B.source(c).startswith("figures."))


case("matplotlib_inline", "honest", edited(after_imports=[
    "%matplotlib inline\n%config InlineBackend.figure_format = 'svg'",
    "fig, ax = plt.subplots()\nax.imshow(np.eye(4))\nplt.show()",
    lambda ctx: _figures_cell()]))
case("exploration_errors", "honest", edited(
    after_imports="1 / 0", before_check__ring_time="undefined_name + 1",
    after_def__zigzag_positions="def broken(:\n    pass"))
case("callables_not_functions", "honest", edited(defs={
    "ring_time": "ring_time = lambda work: np.asarray(work).max(axis=1).sum()\n",
    "zigzag_positions": "import functools\n\n" + B.solution_def(NB03, "zigzag_positions").replace(
        "def zigzag_positions(s, n):", "def _zz(s, n, *, chunks=2):") +
        "\nzigzag_positions = functools.partial(_zz, chunks=2)\n",
    "causal_work": "class _CausalWork:\n    def __call__(self, positions):\n" + "\n".join(
        "    " + line for line in B.solution_def(NB03, "causal_work").splitlines()[2:]) +
        "\n\ncausal_work = _CausalWork()\n"}))

# -- 5. one submission reaching the next --------------------------------------------------
_victims = []


def victim(after: str) -> Case:
    c = case(f"victim_after_{after}", "next submission", edited(after_imports=C.look_around),
             why="an honest student graded after an attack")
    _victims.append(c.name)
    return c


case("write_everywhere", "next submission", edited(after_imports=C.write_everywhere))
victim("write_everywhere")
case("daemon_kills_everything", "next submission",
     edited(after_imports=lambda ctx: C.daemon(ctx, "kill-all")))
case("daemon_pkill", "next submission", edited(after_imports=lambda ctx: C.daemon(ctx, "pkill")))
victim("daemons")
for _how in ("getppid", "pid1", "killpg"):
    case(f"kill_{_how}", "next submission", edited(after_imports=lambda ctx, h=_how: C.kill_parent(ctx, h)))
victim("kills")
case("fork_bomb", "next submission", edited(after_imports=C.fork_bomb()), own_grade=False,
     why="its own checks may find no process left to fork")
case("fill_the_disk", "next submission", edited(after_imports=C.fill_disk))
case("memory_in_a_cell", "next submission", edited(after_imports=C.hog_memory()))
case("memory_across_processes", "next submission", edited(after_imports=C.memory_across_processes()))
case("fill_outside_tmp", "next submission", edited(after_imports=C.fill_root))
case("memory_in_a_function", "next submission",
     edited(defs={"ring_time": C.hog_memory(in_function="ring_time")}), lost=lose("ring_time"))
case("network", "next submission", edited(after_imports=C.network))
victim("resources")

# -- 6. faults ------------------------------------------------------------------------------
case("hang_in_function_busy", "fault", edited(defs={
    "ring_time": "def ring_time(work):\n    while True:\n        pass\n"}),
    lost=lose("ring_time", status={"timed out"}))
case("hang_in_function_sleep", "fault", edited(defs={
    "causal_work": "import time\ndef causal_work(positions):\n    time.sleep(3600)\n"}),
    lost=lose("causal_work", status={"timed out"}))
case("hang_in_cell", "fault", edited(after_imports="import time\ntime.sleep(3600)"))
case("exit_in_cell", "fault", edited(after_check__ring_time="import os\nos._exit(3)"))
case("sigkill_in_function", "fault", edited(defs={"causal_work": (
    "import os, signal\ndef causal_work(positions):\n    os.kill(os.getpid(), signal.SIGKILL)\n")}),
    lost=lose("causal_work", status={"crashed"}))
case("segfault_in_function", "fault", edited(defs={"ring_time": (
    "import ctypes\ndef ring_time(work):\n    return ctypes.string_at(0)\n")}),
    lost=lose("ring_time", status={"crashed"}))
case("exit_in_function", "fault", edited(defs={"zigzag_positions": (
    "import os\ndef zigzag_positions(s, n):\n    os._exit(0)\n")}),
    lost=lose("zigzag_positions", status={"crashed"}))
case("wrong_answer", "fault", edited(defs={"ring_time": (
    "def ring_time(work):\n    return np.asarray(work).max(axis=1).sum() + 1\n")}),
    lost=lose("ring_time", status={"failed"}))
case("invalid_json", "fault", lambda ctx: '{"cells": [oops', lost=lose(*ALL03, status={"unreadable"}))
# round 4 (issue 32): a malformed, deep or huge file costs only its own points
UNREADABLE = lose(*ALL03, status={"unreadable"})
case("source_holds_a_number", "fault", lambda ctx: {**B.reduced(NB03), "cells": [
    {**c, "source": [c["source"], 3]} if i == 0 else c
    for i, c in enumerate(B.reduced(NB03)["cells"])]}, lost=UNREADABLE)
case("metadata_a_list", "fault", lambda ctx: {**B.reduced(NB03), "metadata": []},
     lost=UNREADABLE)
case("metadata_nested_deep", "fault", lambda ctx: json.dumps(B.reduced(NB03)).replace(
    '"metadata": {', '"metadata": {"deep": ' + '{"a":' * 100_000 + "1" + "}" * 100_000 + ", ", 1),
    lost=UNREADABLE)
case("kernelspec_a_string", "fault", lambda ctx: B.with_metadata(B.reduced(NB03),
                                                                 kernelspec="python3"),
     lost=UNREADABLE)
case("language_info_a_string", "fault", lambda ctx: B.with_metadata(B.reduced(NB03),
                                                                    language_info="python"),
     lost=UNREADABLE)
case("expression_200000_terms", "fault", edited(at_end="x = " + "+".join(["1"] * 200_000)),
     lost=UNREADABLE)
case("renamed_with_id", "fault", edited(), file="homework.ipynb")
case("renamed_without_id", "fault", lambda ctx: B.with_metadata(B.reduced(NB03), lesson10=None),
     notebook=None, file="homework.ipynb", lost={"(unknown notebook)": {"unknown notebook"}})
case("checks_removed", "fault", lambda ctx: B.drop_checks(B.reduced(NB03)),
     lost=lose(*ALL03, status={"check removed"}))
case("checks_removed_blank", "fault", lambda ctx: B.drop_checks(B.reduced(NB03, blank=True)),
     lost=lose(*ALL03, status={"check removed"}))
case("one_check_removed", "fault", lambda ctx: B.drop_checks(B.reduced(NB03), ["ring_time"]),
     lost=lose("ring_time", status={"check removed"}))
case("check_never_runs", "fault", lambda ctx: B.replace_check(
    B.reduced(NB03), "ring_time", "if False:\n    checks.check_ring_time(ring_time)"),
    lost=lose("ring_time", status={"not judged"}))
case("julia_kernel", "fault", lambda ctx: B.with_metadata(
    B.reduced(NB03), kernelspec={"name": "julia-1.10", "language": "julia", "display_name": "Julia"},
    language_info={"name": "julia"}), lost=lose(*ALL03, status={"not python"}))
case("another_notebooks_content", "fault", lambda ctx: B.with_metadata(
    B.reduced(NB01), lesson10={"notebook": NB03}), lost=lose(*ALL03, status={"check removed"}))
victim("faults")

ACTIVE = [c for c in CASES if NEW_CONTRACT or not c.needs_contract]
BY_NAME = {c.name: c for c in CASES}


# ------------------------------------------------------------------ the machine around the run
class Listeners:
    """TCP and UDP on 127.0.0.1 and an abstract unix socket: what reaches them is logged."""

    def __init__(self, token: str):
        self.got: list[str] = []
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(8)
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.unix_name = f"redteam-{token}"
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind("\0" + self.unix_name)
        self.unix.listen(8)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._serve, args=(s, k), daemon=True)
                        for s, k in ((self.tcp, "tcp"), (self.udp, "udp"), (self.unix, "unix"))]
        for t in self.threads:
            t.start()

    def _serve(self, sock, kind):
        sock.settimeout(0.5)
        while not self.stop.is_set():
            try:
                if kind == "udp":
                    data, _ = sock.recvfrom(4096)
                    self.got.append(f"udp: {data[:100]!r}")
                else:
                    conn, _ = sock.accept()
                    self.got.append(f"{kind}: connection")
                    conn.close()
            except (TimeoutError, OSError):
                continue

    def close(self):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=2)
        for s in (self.tcp, self.udp, self.unix):
            s.close()


def _processes_with(text: str) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read()
                with open(f"/proc/{pid}/status") as f:
                    zombie = "\nState:\tZ" in f.read()
            except OSError:
                continue
            if text.encode() in cmd and not zombie:
                out.append(int(pid))
    return out


def _site_dirs() -> list[str]:
    code = "import site, sys; print('\\n'.join(sys.path + site.getsitepackages() + [site.getusersitepackages()]))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    return [p for p in out.splitlines() if p.startswith("/")]


def _host_places(tmp: Path, ctx: C.Ctx) -> list[Path]:
    """Folders outside the sandbox an attack may have written its token into."""
    places = [Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"), Path.home(), Path("/opt"),
              B.ROOT, B.ROOT / "lesson10", tmp, Path(ctx.subs)]
    places += [Path(p) for p in ctx.host_paths] + [Path(p) / "lesson10" for p in ctx.host_paths]
    places += [Path(p) for p in ctx.site_dirs]
    places += [p for p in Path(ctx.subs).glob("*") if p.is_dir()]
    return [p for p in dict.fromkeys(places) if p.is_dir()]


def _left_behind(places, token: str) -> list[Path]:
    out = []
    for d in places:
        try:
            out += [d / f for f in os.listdir(d) if token in f]
        except OSError:
            pass
    return out


HANG = "import time\ntime.sleep(3600)"     # a cell that never ends within a test run


def _checks_after(nb: dict, src: str) -> list[str]:
    """The exercises whose check cells come after the code cell ``src``."""
    srcs = [B.source(c) for c in nb["cells"] if c["cell_type"] == "code"]
    return [ex for later in srcs[srcs.index(src) + 1:] for ex in B.checked(later)]


def _grade(paths, tmp: Path, *extra, env=None) -> subprocess.Popen:
    """Start ``python -m lesson10 grade`` on ``paths`` (the package: the copy in tmp)."""
    env = dict(env or os.environ, PYTHONPATH=str(tmp / "install"), MPLBACKEND="Agg")
    cmd = [sys.executable, "-m", "lesson10", "grade", *map(str, paths), "--json", "--seed",
           str(SEED), *extra]
    return subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _finish(proc: subprocess.Popen, timeout: float) -> dict:
    t0 = time.monotonic()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the grader did not finish in {timeout} s:\n{err[-3000:]}")
    try:
        report = json.loads(out)
    except ValueError:
        report = None
    return {"rc": proc.returncode, "report": report, "stdout": out, "stderr": err,
            "waited": time.monotonic() - t0}


def _no_bwrap_path(tmp: Path) -> str:
    """A PATH with every program of this one except bwrap."""
    shadow = tmp / "no-bwrap-bin"
    shadow.mkdir()
    for d in os.environ.get("PATH", "").split(os.pathsep):
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            if name != "bwrap" and not (shadow / name).exists():
                (shadow / name).symlink_to(Path(d) / name)
    return str(shadow)


def _outputs(saved: Path, name: str) -> list[str]:
    """The text lines of a graded notebook's outputs (``--save-executed``)."""
    lines = []
    for path in (saved / name).glob("*.ipynb"):
        nb = json.loads(path.read_text())
        for cell in nb.get("cells", []):
            for o in cell.get("outputs", []):
                text = o.get("text", "")
                lines += ("".join(text) if isinstance(text, list) else text).splitlines()
    return lines


def _ran(world, name: str) -> str:
    """Why an attack printed nothing: the feedback of its notebook."""
    return f"the attack did not run; feedback of {name}: {world['by'][name]['feedback']}"


def _reports(saved: Path, name: str, what: str) -> list[str]:
    return [line.split(" ", 2)[2] if line.count(" ") >= 2 else "" for line in _outputs(saved, name)
            if line.startswith(f"REPORT {what} ") or line == f"REPORT {what}"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Every case graded in one run (plus the small runs), with the machine around it."""
    tmp = tmp_path_factory.mktemp("redteam")
    shutil.copytree(B.ROOT / "lesson10", tmp / "install" / "lesson10",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    token = uuid.uuid4().hex[:12]
    listeners = Listeners(token)
    subs = tmp / "subs"
    ctx = C.Ctx(token=token, host_paths=[str(B.ROOT), str(tmp / "install")], subs=str(subs),
                tcp_port=listeners.tcp.getsockname()[1], udp_port=listeners.udp.getsockname()[1],
                unix_name=listeners.unix_name, site_dirs=_site_dirs())
    canary = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)", ctx.canary])
    paths, contents = {}, {}
    for c in ACTIVE:
        nb = c.make(ctx)
        paths[c.name] = B.write(subs / c.name, c.filename, nb)
        contents[c.name] = paths[c.name].read_text()
        for fname, text in c.files.items():
            (subs / c.name / fname).write_text(text)
    saved = tmp / "executed"
    runs = {}
    limits = {"unit": clock.unit(), "run": clock.scaled(RUN_TIMEOUT), "batch": clock.scaled(BATCH_WALL),
              "slow_notebook": clock.scaled(SLOW_NOTEBOOK)}
    try:
        t0 = time.monotonic()
        batch = _grade(list(paths.values()), tmp, "-j", "2", *clock.limits(**LIMITS), "--memory", "1",
                       "--save-executed", str(saved), "--csv", str(tmp / "class.csv"))
        # the notebook's own time limit: a cell after the first check that never ends, under a
        # cell limit longer than the whole run (only the notebook's limit can cut it)
        slow_nb = B.insert(B.reduced(NB03), HANG, after_check="causal_work")
        slow = B.write(tmp / "slow" / "slow", f"{NB03}.ipynb", slow_nb)
        small = {"slow": _grade([slow], tmp, "--timeout", "3600", "--timings",
                                "--notebook-timeout", str(limits["slow_notebook"]))}
        honest = B.write(tmp / "plain" / "honest", f"{NB03}.ipynb", B.reduced(NB03))
        no_bwrap = dict(os.environ, PATH=_no_bwrap_path(tmp))
        small["refused"] = _grade([honest], tmp, env=no_bwrap)
        small["unsandboxed"] = _grade([honest], tmp, "--no-sandbox", env=no_bwrap)
        runs = {k: _finish(p, limits["run"]) for k, p in small.items()}
        runs["batch"] = _finish(batch, limits["run"])
        runs["batch"]["wall"] = time.monotonic() - t0
        time.sleep(0.5)
        places = _host_places(tmp, ctx)
        left = _left_behind(places, token)
        alive = _processes_with(f"daemon-{token}")
        canary_alive = canary.poll() is None
    finally:
        canary.kill()
        canary.wait()
        listeners.close()
        for pid in _processes_with(token):        # whatever escaped: end it
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    for p in left:                                 # ... and remove what it wrote
        try:
            p.unlink()
        except OSError:
            pass
    batch = runs["batch"]
    assert batch["report"] is not None, f"no JSON report (exit {batch['rc']}):\n{batch['stderr'][-4000:]}"
    by = dict(zip(paths, batch["report"]["notebooks"]))
    for name, rep in by.items():                   # the report keeps the order it was given
        assert str(rep.get("path", rep.get("notebook"))).endswith(paths[name].name), (name, rep)
    return {"runs": runs, "limits": limits, "slow_cut": _checks_after(slow_nb, HANG), "by": by,
            "ctx": ctx, "tmp": tmp, "saved": saved, "paths": paths,
            "contents": contents, "left": left, "alive": alive, "canary_alive": canary_alive,
            "network": list(listeners.got)}


# ------------------------------------------------------------------ the verdicts
#: points a lost exercise keeps from a part it gets right (partial credit, issue 24): plain
#: TP gives SP's output (its "output" part), not op on s/t tokens
# cheats keep nothing: a method exercise's rules are enforced in every one of its parts, so
# a cheat that breaks them (TP instead of SP, say) gets no part; a case here would name
# the points a cheat keeps on purpose
PARTLY: dict[str, dict[str, int]] = {}


def _expected(c: Case) -> dict:
    """exercise -> max points for the notebook the case is graded as."""
    if c.notebook is None:
        return {"(unknown notebook)": sum(ex.points for nb in COURSE for ex in B.exercises(nb))}
    return {ex.id: ex.points for ex in B.exercises(c.notebook)}


def _diagnose(world, c: Case, rep) -> str:
    lines = [l for l in _outputs(world["saved"], c.name) if l.startswith(("REPORT", "FOUND"))]
    return (f"{c.name} ({c.group}{': ' + c.why if c.why else ''})\n"
            + json.dumps({k: rep.get(k) for k in ("points", "max_points", "feedback", "error")},
                         indent=1)[:2000]
            + "\n" + "\n".join(f"  {e['exercise']}: {e['status']} {e['points']}/{e['max_points']}"
                               f" {(e.get('message') or '')[:300]!r}" for e in rep.get("exercises", []))
            + ("\nprinted:\n  " + "\n  ".join(lines[:20]) if lines else ""))


@pytest.mark.parametrize("name", [pytest.param(c.name, marks=pytest.mark.skipif(
    c.needs_contract and not NEW_CONTRACT, reason="needs the new exercise contract (branch checks)"))
    for c in CASES])
def test_case_scores_what_it_should(world, name):
    c = BY_NAME[name]
    rep = world["by"][name]
    why = _diagnose(world, c, rep)
    assert rep["ok"] and rep.get("sandboxed") is True, why
    if not c.own_grade:
        return
    want = _expected(c)
    got = {e["exercise"]: e for e in rep["exercises"]}
    assert set(got) == set(want), why
    for ex, full in want.items():
        e = got[ex]
        assert e["max_points"] == full, why
        if ex in c.lost:
            assert e["points"] == PARTLY.get(c.name, {}).get(ex, 0) and not e["passed"], why
            assert c.lost[ex] is ANY or e["status"] in c.lost[ex], why
        else:
            assert e["passed"] and e["points"] == full and e["status"] == "passed", why
    kept = sum(PARTLY.get(c.name, {}).values())
    assert (rep["points"], rep["max_points"]) == (sum(full for ex, full in want.items()
                                                      if ex not in c.lost) + kept,
                                                  sum(want.values())), why


def test_the_batch_finishes_in_time_with_exit_status_1(world):
    batch = world["runs"]["batch"]
    broken = {name: rep["error"] for name, rep in world["by"].items() if not rep["ok"]}
    assert batch["rc"] == 1 and not broken, (batch["rc"], broken, batch["stderr"][-2000:])
    assert batch["wall"] < world["limits"]["batch"], (f"the batch took {batch['wall']:.0f} s",
                                                      world["limits"])
    assert batch["report"]["seed"] == SEED
    assert len(batch["stderr"]) < 50_000               # student output stays out of the log


def test_no_attack_found_course_code(world):
    found = {name: [l for l in _outputs(world["saved"], name) if l.startswith("FOUND")]
             for name in world["by"]}
    assert not any(found.values()), {k: v for k, v in found.items() if v}


def test_victims_see_nothing_of_the_attacks(world):
    for name in _victims:
        seen = _reports(world["saved"], name, "victim")
        assert seen == ["[]"], (name, seen)


def test_nothing_escaped_to_the_host(world):
    assert world["canary_alive"], "a submission signalled a process outside its sandbox"
    assert not world["alive"], f"daemons still running after the batch: {world['alive']}"
    assert not world["left"], f"files written outside the sandbox: {world['left']}"
    assert not world["network"], f"reached the host's loopback: {world['network']}"
    for name, text in world["contents"].items():     # the overwrite attempts changed nothing
        assert world["paths"][name].read_text() == text, name


def test_network_is_cut(world):
    net = _reports(world["saved"], "network", "network")
    assert net, _ran(world, "network")
    assert "'tcp': 'connected'" not in net[0] and "'unix': 'connected'" not in net[0], net
    assert not world["network"], world["network"]       # UDP: sent into the void, never here


def test_processes_are_limited(world):
    forks = _reports(world["saved"], "fork_bomb", "forks")
    assert forks, _ran(world, "fork_bomb")
    assert int(forks[0].split()[0]) < 300, f"no limit on processes: {forks[0]} (of 300) forked"


def test_files_and_tmp_are_capped(world):
    fill = _reports(world["saved"], "fill_the_disk", "fill")
    assert fill, _ran(world, "fill_the_disk")
    assert "no limit" not in fill[0], f"no limit on file size / tmp: {fill}"


def test_nothing_outside_tmp_is_writable(world):
    wrote = _reports(world["saved"], "write_everywhere", "wrote")
    assert wrote, _ran(world, "write_everywhere")
    places = [p for p in json.loads(wrote[0]) if not p.startswith(("/tmp", "/dev/shm"))]
    assert not places, f"a submission could write outside its capped /tmp: {places}"
    fill = _reports(world["saved"], "fill_outside_tmp", "fill_root")
    assert fill, _ran(world, "fill_outside_tmp")
    assert int(fill[0].split()[0]) <= 256, f"MiB written outside /tmp (memory-backed): {fill[0]}"


def test_memory_is_limited(world):
    mem = _reports(world["saved"], "memory_in_a_cell", "memory")
    assert mem, _ran(world, "memory_in_a_cell")
    assert "MemoryError" in mem[0], f"no memory limit per process: {mem}"
    total = _reports(world["saved"], "memory_across_processes", "memory_total")
    assert total, _ran(world, "memory_across_processes")
    assert int(total[0].split()[0]) <= 2048, f"no memory limit per sandbox: {total[0]}"


def test_skipped_cells_are_named_in_the_feedback(world):
    for name in ("hang_in_cell", "exit_in_cell", "daemon_kills_everything", "kill_killpg"):
        notes = " ".join(world["by"][name]["feedback"])
        assert "skipped" in notes, (name, notes)


def test_a_flood_of_output_keeps_the_report_small(world):
    assert len(json.dumps(world["by"]["prints_a_lot"])) < 100_000


def test_class_csv_has_a_row_per_student(world):
    rows = (world["tmp"] / "class.csv").read_text().splitlines()
    head = rows[0].split(",")
    assert head[0] == "student" and {"total", "max"} <= set(head), head
    assert {ex for nb in COURSE for ex in EXIDS[nb]} <= set(head), head
    table = {r.split(",")[0]: r.split(",") for r in rows[1:]}
    assert set(table) == set(world["by"])
    assert table["wrong_answer"][head.index("ring_time")] == "0"
    assert table["victim_after_faults"][head.index("ring_time")] == "1"


def test_notebook_time_limit_costs_only_what_it_cuts(world):
    run = world["runs"]["slow"]
    rep = run["report"]["notebooks"][0]
    got = {e["exercise"]: e for e in rep["exercises"]}
    cut = world["slow_cut"]                      # the checks after the cell that never ends
    assert cut and "causal_work" not in cut and set(cut) < set(got), (cut, rep)
    for ex, e in got.items():                    # the ones before it keep their points
        if ex in cut:
            assert e["points"] == 0 and e["status"] in ("not judged", "timed out"), rep
        else:
            assert e["passed"], rep
    # cut by the notebook's limit (the cell's is an hour), soon after it passed
    limit = world["limits"]["slow_notebook"]
    assert limit <= rep["seconds"] < limit + clock.scaled(15), (rep["seconds"], world["limits"])
    assert any("time limit" in note for note in rep["feedback"]), rep["feedback"]


def test_without_bwrap_the_grader_refuses(world):
    run = world["runs"]["refused"]
    assert run["rc"] == 2, run
    assert "sandbox" in run["stderr"] and "--no-sandbox" in run["stderr"], run["stderr"]


def test_no_sandbox_says_so(world):
    run = world["runs"]["unsandboxed"]
    assert run["rc"] in (0, 1), run["stderr"][-3000:]     # 1: the other notebooks are missing
    rep = run["report"]["notebooks"][0]
    assert rep["sandboxed"] is False and run["report"].get("sandboxed") is False
    assert any("not sandboxed" in line for line in rep["feedback"]), rep["feedback"]
    assert (rep["points"], rep["max_points"]) == (4, 4)


def test_the_attacks_are_real(tmp_path):
    """Without a sandbox the source attacks find the course's code (here, on this side)."""
    ctx = C.Ctx(token="x", host_paths=[str(B.ROOT)])
    ns = {}
    exec(C.finder(ctx), ns)
    for how, rel, name, probe in (("embedded", "layouts.py", "ring_time", C.NB03_PROBES["ring_time"]),
                                  ("sitepackages", "layouts.py", "shard_positions",
                                   C.NB03_PROBES["shard_positions"]),
                                  ("embedded", "checks/nb03_load_balance.py", "_pair_counts",
                                   C.NB03_PROBES["_pair_counts"])):
        assert ns["steal"](how, rel, name, eval(probe, ns)) is not None, (how, rel)
