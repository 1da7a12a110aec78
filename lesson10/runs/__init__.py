"""Checked runs of every method: ``python -m lesson10 run`` and ``torchrun -m lesson10.run``.

:mod:`.registry` lists the methods (their spmd and sim functions, worker, bytes formula,
layouts); :mod:`.cli` is the command; :mod:`.workers` and :mod:`.moe_checks` are the rank
workers that run one method against its one-process reference; :mod:`.results` is the
schema of what a rank reports; :mod:`.demo` is ``python -m lesson10 demo`` (the simulation).
"""
