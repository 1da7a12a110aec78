"""The lesson's size rules, written once: counts, numbers and the MoE configuration.

``cost``, ``topology``, ``sim``, ``spmd``, ``runs`` and ``bench`` check their sizes here, so
one rule gives one verdict, in the same words, wherever a size enters the package. Standard
library only (no NumPy, no torch); the grader's sandbox ships it as real code (notebook 05's
less :meth:`MoEConfig.capacity`, part of its capacity exercise's answer).

* :func:`count`: an integer ``>= lo`` (``True`` is no count, nor is ``2.0``);
* :func:`number`: a finite real number ``> lo`` (``>= lo`` with ``strict=False``);
* :class:`MoEConfig`: ``E`` experts, top-``k`` routing, a capacity factor ``CF`` and ``N_e``
  expert-parallel ranks, with the rules that bind them: ``1 <= k <= E`` (a token picks ``k``
  distinct experts), ``CF > 0`` or None (no limit: dropless), ``E`` a multiple of ``N_e``
  (each rank holds ``E/N_e`` whole experts), and the capacity ``C = ceil(CF k N / E)``.

Worked example: ``E = 8`` experts on ``N_e = 4`` ranks (2 each), ``k = 2``, ``CF = 1.25`` and
``N = 64`` tokens over all ranks (16 per rank): the ``k N = 128`` copies give each expert 16
on average, and each accepts at most ``C = ceil(1.25 * 2 * 64 / 8) = 20``::

    >>> MoEConfig(E=8, k=2, capacity_factor=1.25, N_e=4).capacity(64)
    20
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

__all__ = ["count", "number", "MoEConfig"]


def count(name: str, value, lo: int = 1) -> int:
    """``value`` as an int when it is an integer ``>= lo`` (a ``bool`` is not, nor ``2.0``);
    else a ValueError ``"{name} must be an integer >= {lo}, got {value!r}"``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
    return int(value)


def number(name: str, value, lo: float = 0.0, *, strict: bool = True) -> Any:
    """``value`` when it is a finite real number ``> lo`` (``>= lo`` if not ``strict``): an
    integer as an int and a Fraction as it is (so exact sizes stay exact), any other number
    as a float; else a ValueError naming ``name`` and the limit."""
    x = math.nan
    if not isinstance(value, bool) and isinstance(value, numbers.Real):
        try:
            x = float(value)
        except OverflowError:                    # an int beyond float: not finite
            pass
    if not math.isfinite(x) or x < lo or (strict and x == lo):
        raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} {lo:g}, "
                         f"got {value!r}")
    if isinstance(value, numbers.Integral):
        return int(value)
    return value if isinstance(value, Fraction) else x


@dataclass(frozen=True)
class MoEConfig:
    """A mixture-of-experts layer's sizes, checked: ``E`` experts, each token routed to its
    top ``k``, at most ``C = ceil(CF k N / E)`` copies per expert for a ``capacity_factor``
    ``CF`` (None: no limit, dropless), the experts spread over ``N_e`` ranks, ``E/N_e`` each
    (expert ``i`` on rank ``i // (E/N_e)``). Fields are stored as plain ints (``CF`` as a
    float); a broken rule is a ValueError that names the limit and what to use instead."""
    E: int
    k: int
    capacity_factor: float | None = None
    N_e: int = 1

    def __post_init__(self):
        E = count("E (experts)", self.E)
        k = count("k (experts per token)", self.k)
        if k > E:
            raise ValueError(f"k = {k} experts per token is more than the E = {E} experts there "
                             f"are (a token picks k distinct experts); use k <= E")
        cf = self.capacity_factor
        if cf is not None:
            try:
                cf = number("capacity_factor", cf)
            except ValueError:
                raise ValueError(f"capacity_factor must be a number > 0 (finite: the copies an "
                                 f"expert takes per k N / E), or None for no limit (dropless); "
                                 f"got {cf!r}") from None
        N_e = count("N_e (expert-parallel ranks)", self.N_e)
        if E % N_e:
            raise ValueError(f"E = {E} experts do not split over N_e = {N_e} ranks (each rank "
                             f"holds E/N_e whole experts); use E a multiple of N_e")
        for name, value in (("E", E), ("k", k), ("capacity_factor", cf), ("N_e", N_e)):
            object.__setattr__(self, name, value)

    @property
    def experts_per_rank(self) -> int:
        """``E / N_e``: the experts each rank holds."""
        return self.E // self.N_e

    def capacity(self, N: int) -> int | None:
        """``C = ceil(CF k N / E)`` copies per expert for ``N`` tokens routed together (all
        ranks), or None without a capacity factor. ``CF`` is read as the decimal it was
        written as (``1.1`` is 11/10), so ``C`` is not off by one from binary rounding."""
        N = count("N (tokens)", N, lo=0)
        if self.capacity_factor is None:
            return None
        cf = Fraction(repr(self.capacity_factor))   # stored as a float
        return math.ceil(cf * self.k * N / self.E)

    def tokens_per_rank(self, N: int) -> int:
        """``N / N_e``: the tokens each rank routes, for ``N`` tokens over all ranks."""
        N = count("N (tokens)", N, lo=0)
        if N % self.N_e:
            raise ValueError(f"N = {N} tokens do not split over N_e = {self.N_e} ranks (each "
                             f"routes N/N_e of them); use N a multiple of N_e")
        return N // self.N_e
