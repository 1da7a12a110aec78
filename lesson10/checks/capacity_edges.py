"""The capacity ``C = ceil(CF k N / E)`` computed exactly, and the float mistakes at its edges.

The right C is exact: the factor read as the decimal it is written as (``1.1`` is 11/10).
:func:`float_capacities` gives what the float mistakes compute instead: the ceiling of the
float64 product in any order of the operations, and of ``Fraction(cf)`` (the float's binary
value). They differ from C only where the exact product is an integer and the float one
lands a hair above it (``1.1 * 360 / 6`` is ``66.00000000000001``, so its ceiling is 67), so
the capacity check takes such sizes as fixed cases. :func:`float32_traps` searches the
check's ranges, deterministically, for the sizes where only a capacity computed from
``np.float32(cf)`` lands on C + 1: ``float32(0.3)`` is 0.300000012, so ``0.3 * 50`` gives
15.0000006 and its ceiling 16. Such sizes are rare (an exact product that is an integer, a
factor that float32 rounds up), so the check takes them as cases of their own instead of
hoping that a random draw hits one.
"""
from __future__ import annotations

import functools
import math
from fractions import Fraction
from itertools import permutations

import numpy as np

#: the ranges of the capacity check's random cases (a factor of two decimals)
CF_RANGE = (0.25, 4.0)
E_RANGE = (2, 64)
K_MAX = 4
N_RANGE = (1, 300)


def float_products(cf, k, N, E) -> dict:
    """``{expression: value}``: CF k N / E evaluated in float64 in the orders a student may
    write it (each order rounds differently), the expression written with the case's numbers,
    the first in the notebook's order."""
    out: dict = {}
    terms = ((repr(float(cf)), float(cf)), (str(k), k), (str(N), N))
    for (x, a), (y, b), (z, c) in permutations(terms):
        out.update({f"{x} * {y} * {z} / {E}": a * b * c / E, f"{x} * {y} / {E} * {z}": a * b / E * c,
                    f"{x} / {E} * {y} * {z}": a / E * b * c, f"{x} * ({y} * {z} / {E})": a * (b * c / E),
                    f"{x} * ({y} / {E}) * {z}": a * (b / E) * c,
                    f"{x} * {y} * ({z} / {E})": a * b * (c / E)})
    return out


def exact_capacity(N: int, E: int, k: int, cf) -> int:
    """The right C: ``ceil(CF k N / E)`` with the factor read as the decimal it is written as."""
    return math.ceil(Fraction(repr(float(cf))) * k * N / E)


def float_mistakes(N: int, E: int, k: int, cf) -> dict:
    """``{capacity: excess}`` for every capacity other than the exact C that a float mistake
    gives: the ceiling of a float64 product (in any order) or of the exact product of the
    factor's binary value, ``Fraction(cf)``; ``excess`` (a Fraction) is how far that product
    lies above C (the first one found)."""
    C = exact_capacity(N, E, k, cf)
    products = [Fraction(v) for v in float_products(cf, k, N, E).values()]
    found: dict = {}
    for p in products + [Fraction(float(cf)) * k * N / E]:
        if math.ceil(p) != C:
            found.setdefault(math.ceil(p), p - C)
    return found


def float_capacities(N: int, E: int, k: int, cf) -> set:
    """Every C the float mistakes give (:func:`float_mistakes`), and the exact one."""
    return {exact_capacity(N, E, k, cf)} | set(float_mistakes(N, E, k, cf))


def float32_capacities(N: int, E: int, k: int, cf) -> set:
    """The capacities computed from ``np.float32(cf)``: in float32 arithmetic (NumPy keeps
    a float32 times a Python int in float32) in the usual orders, and in float64 from the
    float32 value."""
    f = np.float32(cf)
    with np.errstate(all="ignore"):
        prods = [f * k * N / E, f * (k * N) / E, k * N * f / E, f * k * N / np.float32(E)]
    return {math.ceil(float(p)) for p in prods} | {math.ceil(float(f) * k * N / E)}


@functools.lru_cache(maxsize=1)
def float32_traps() -> tuple:
    """Every ``(cf, N, E, k, C)`` in the random cases' ranges (and E = 1) where a capacity
    computed from ``np.float32(cf)`` is C + 1, a capacity no float64 mistake gives, and
    where it shows: C + 1 <= N, so an expert that every token chooses keeps one copy too many.
    Found by a search over the exact products that are integers (a float32 error of at most
    about 1e-7 relative cannot carry a product that is not an integer across one: its
    distance to the next is at least 1 / (100 E))."""
    found = []
    for c in range(round(CF_RANGE[0] * 100), round(CF_RANGE[1] * 100) + 1):
        cf = c / 100
        if Fraction(float(np.float32(cf))) <= Fraction(c, 100):
            continue                          # float32 rounds this factor down: no C + 1
        for E in range(1, E_RANGE[1] + 1):
            for k in range(1, min(E, K_MAX) + 1):
                step = 100 * E // math.gcd(100 * E, c * k)      # c k N / (100 E) an integer
                for N in range(step, N_RANGE[1] + 1, step):
                    C = c * k * N // (100 * E)
                    if C + 1 <= N and math.ceil(np.float32(cf) * k * N / E) == C + 1 and \
                            C + 1 not in float_capacities(N, E, k, cf):
                        found.append((cf, N, E, k, C))
    return tuple(found)


def fixed_float32_traps() -> list:
    """A few traps taken from :func:`float32_traps` by rule, not by chance: the lesson's
    example (0.3, 50 tokens, E = 1) and, for k = 1, 2, 3 and 4, the one with the most
    experts (then the most tokens) that the other float32 orders round up too."""
    traps = float32_traps()
    picked = [t for t in traps if t[:4] == (0.3, 50, 1, 1)]
    for k in range(1, K_MAX + 1):
        every = [t for t in traps if t[3] == k and
                 float32_capacities(t[1], t[2], k, t[0]) == {t[4] + 1}]
        if every:
            picked.append(max(every, key=lambda t: (t[2], t[1])))
    return picked
