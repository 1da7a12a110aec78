"""Can anything a notebook's sandbox ships compute an exercise's answer? (issue 32)

Run as a script inside one notebook's stand-in (``python sandbox_reach.py BOX CASES``, with
``BOX`` first on ``sys.path``, as the grader's sandbox has it): ``CASES`` is a pickle of
``{exercise: (argument names, [(args, kwargs, answer), ...])}``, the cases a check ran, recorded around a right
answer (tests/test_sandbox_answers.py). With the stand-in judging (``_standin.JUDGING`` set,
as while an exercise is judged), every function reachable in the box -- each module's
functions, each class's methods on an instance made from the case, the stand-in's own
helpers -- is called on the first case with the exercise's arguments remapped in every way
the types allow: the arguments in any order, any of them left out, with the sizes they
carry (a list's length, an array's dimensions), small constants and the strings the
function itself compares with. A call whose result (or one of its items, values or
attributes) equals the answer, or a part of a tuple or dict answer, is replayed with the
same mapping on every other case; one that matches them all is printed as a hit (JSON).
"""
from __future__ import annotations

import importlib
import inspect
import itertools
import json
import numbers
import pickle
import pkgutil
import signal
import sys
import types
import warnings

import numpy as np

#: calls tried per function and exercise (the first case); most functions need far fewer
BUDGET = 1500
#: one call's CPU time (not wall time: a busy machine does not cut a call short; the calls
#: that give answers take milliseconds): a case's size taken as a count cannot stall the search
CALL_SECONDS = 0.25
EXTRAS = (1, 2, True, False, None)


def _arrays_equal(a, b) -> bool:
    try:
        x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    except (TypeError, ValueError, OverflowError):
        return False
    if x.shape != y.shape:
        return False
    with np.errstate(all="ignore"):
        return bool(np.allclose(x, y, rtol=1e-9, atol=1e-12, equal_nan=True))


def same(a, b) -> bool:
    """``a`` is ``b`` as the checks compare answers (numbers, arrays, lists of them)."""
    if isinstance(b, (list, tuple)):
        if isinstance(a, np.ndarray) and a.ndim == 0 or not isinstance(a, (list, tuple, np.ndarray)) \
                or len(a) != len(b):
            return False
        if all(isinstance(y, np.ndarray) for y in b) and len({np.shape(y) for y in b}) > 1:
            return all(same(x, y) for x, y in zip(a, b))
    if isinstance(b, dict):
        return isinstance(a, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in b)
    return _arrays_equal(a, b)


def _trivial(x, inputs) -> bool:
    """A value any function could give: a constant, or one of the inputs."""
    try:
        arr = np.asarray(x, dtype=float)
    except (TypeError, ValueError, OverflowError):
        return True
    if arr.size == 0 or (arr.size >= 1 and np.all(arr == arr.flat[0])
                         and (arr.size > 1 or arr.flat[0] in (0, 1, -1, 2))):
        return True
    return any(same(x, i) for i in inputs if not isinstance(i, (str, type(None))))


def targets(answer, inputs) -> list:
    """The answer and, for a tuple or dict answer, each non-trivial part of it."""
    out = [("answer", answer)]
    parts = (answer.items() if isinstance(answer, dict) else
             enumerate(answer) if isinstance(answer, tuple) else [])
    for key, part in parts:
        if not _trivial(part, inputs):
            out.append((f"part {key}", part))
    return out


def results(value) -> list:
    """What a call gave: the value, its items, dict values and attributes (one level)."""
    out = [("", value)]
    if isinstance(value, (list, tuple)) and len(value) <= 12:
        out += [(f"[{i}]", v) for i, v in enumerate(value)]
    if isinstance(value, dict):
        out += [(f"[{k!r}]", v) for k, v in list(value.items())[:20]]
    for name in getattr(type(value), "__dataclass_fields__", None) or getattr(value, "_fields", ()) or (
            vars(value) if hasattr(value, "__dict__") and not isinstance(value, type) else {}):
        try:
            out.append((f".{name}", getattr(value, name)))
        except Exception:  # noqa: BLE001
            pass
    return out


# --------------------------------------------------------------------------- sources
def sources(args, kwargs) -> list:
    """``(symbol, value)`` of everything a remapping may put in a parameter."""
    out = [(("arg", i), a) for i, a in enumerate(args)]
    out += [(("kw", k), v) for k, v in kwargs.items()]
    for i, a in enumerate(list(args) + list(kwargs.values())):
        if isinstance(a, (list, tuple)):
            out.append((("len", i), len(a)))
            if a and isinstance(a[0], np.ndarray):
                out += [(("dim0", i, j), d) for j, d in enumerate(a[0].shape)]
                out.append((("sizes", i), [len(x) for x in a]))
        elif isinstance(a, np.ndarray):
            out += [(("dim", i, j), d) for j, d in enumerate(a.shape)]
    return out


def resolve(symbol, args, kwargs):
    kind = symbol[0]
    every = list(args) + list(kwargs.values())
    if kind == "arg":
        return args[symbol[1]]
    if kind == "kw":
        return kwargs[symbol[1]]
    if kind == "len":
        return len(every[symbol[1]])
    if kind == "dim0":
        return every[symbol[1]][0].shape[symbol[2]]
    if kind == "dim":
        return every[symbol[1]].shape[symbol[2]]
    if kind == "sizes":
        return [len(x) for x in every[symbol[1]]]
    return symbol[1]                                  # ("const", value)


def strings_of(fn) -> list:
    """The identifier-like strings ``fn`` (and the module functions it names) compares with."""
    seen, out = set(), []

    def add(c):
        if isinstance(c, str) and c.isidentifier() and len(c) <= 16 and c not in seen:
            seen.add(c)
            out.append(c)

    def walk(code, depth):
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                walk(c, depth)
            else:
                add(c)
        for name in code.co_names:
            other = getattr(fn, "__globals__", {}).get(name)
            if isinstance(other, (tuple, list, set, frozenset, dict)):    # a table of names
                for c in list(other)[:50]:
                    add(c)
            elif depth and isinstance(other, types.FunctionType):
                walk(other.__code__, depth - 1)
    code = getattr(fn, "__code__", None)
    if code is not None:
        walk(code, 1)
    return out


# --------------------------------------------------------------------------- callables
def reachable(package: str = "lesson10") -> list:
    """``(name, callable or (class, method name))`` of everything the box ships."""
    root = importlib.import_module(package)
    modules = [root]
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        if ".course" in info.name:
            continue
        try:
            modules.append(importlib.import_module(info.name))
        except Exception:  # noqa: BLE001 - a stub that cannot import is nothing to call
            continue
    out, seen = [], set()
    for module in modules:
        for name, obj in sorted(vars(module).items()):
            if id(obj) in seen or getattr(obj, "__module__", "") != module.__name__:
                continue
            seen.add(id(obj))
            if isinstance(obj, types.FunctionType):
                out.append((f"{module.__name__}.{name}", obj))
            elif isinstance(obj, type) and not issubclass(obj, BaseException):
                out.append((f"{module.__name__}.{name}", obj))
                for attr, member in sorted(vars(obj).items()):
                    fn = getattr(member, "__func__", member)
                    if isinstance(fn, types.FunctionType) and attr != "__init__":
                        out.append((f"{module.__name__}.{name}.{attr}", (obj, attr)))
    return out


def _params(fn):
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    ps = [p for p in sig.parameters.values()
          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if ps and ps[0].name in ("self", "cls"):
        ps = ps[1:]
    required = [p for p in ps if p.default is p.empty]
    optional = [p for p in ps if p.default is not p.empty]
    return required, optional


def mappings(fn, srcs, strings, names=()):
    """Assignments ``(positional symbols, {keyword: symbol})`` for ``fn``: first the case's
    arguments by the names the exercise gives them, then every order of them (the most
    of the case's values first), the parameters they leave filled with extras."""
    got = _params(fn)
    if got is None or len(got[0]) > 6:
        return
    required, optional = got
    extra = [("const", v) for v in EXTRAS] + [("const", s) for s in strings]
    pool = [s for s, _ in srcs]
    said: set = set()
    for pos, kw in itertools.chain(_by_name(required, optional, pool, extra, strings, names),
                                   _every_order(required, optional, pool, extra, strings)):
        key = (pos, tuple(sorted(kw.items())))
        if key not in said:
            said.add(key)
            yield pos, kw


def _by_name(required, optional, pool, extra, strings, names):
    named = {n: ("arg", i) for i, n in enumerate(names)}
    named.update({s[1]: s for s in pool if s[0] == "kw"})
    missing = [i for i, p in enumerate(required) if p.name not in named]
    if len(missing) > 2:
        return
    kw = {p.name: named[p.name] for p in optional if p.name in named}
    for fill in itertools.product(extra, repeat=len(missing)):
        pos = [named.get(p.name) for p in required]
        for i, v in zip(missing, fill):
            pos[i] = v
        yield tuple(pos), kw
        for p in optional:
            if p.name not in kw:
                for alt in _alternatives(p, strings):
                    yield tuple(pos), {**kw, p.name: alt}


def _every_order(required, optional, pool, extra, strings):
    n = len(required)
    for k in range(n, -1, -1):                 # k slots from the case, the rest extras
        for chosen in itertools.permutations(pool, k):
            for slots in itertools.combinations(range(n), k):
                rest = [i for i in range(n) if i not in slots]
                for fill in itertools.product(extra, repeat=len(rest)) if len(rest) <= 2 else ():
                    pos: list = [None] * n
                    for i, v in zip(slots, chosen):
                        pos[i] = v
                    for i, v in zip(rest, fill):
                        pos[i] = v
                    yield tuple(pos), {}
                    if k == n:
                        for p in optional:
                            for alt in _alternatives(p, strings) + [v for v in pool if v not in chosen]:
                                yield tuple(pos), {p.name: alt}


def _alternatives(p, strings) -> list:
    """Values other than its default for an optional parameter: strings, flags, counts."""
    return [("const", v) for v in [*strings, True, False, 1, 2]
            if not (type(p.default) is type(v) and p.default == v)]


class Slow(Exception):
    """A call over its time (a size from the case taken as a count of elements, say)."""


def _alarm(signum, frame):
    raise Slow()


def call(target, pos, kw, args, kwargs, make):
    signal.setitimer(signal.ITIMER_VIRTUAL, CALL_SECONDS)
    try:
        return _call(target, pos, kw, args, kwargs, make)
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)


def _call(target, pos, kw, args, kwargs, make):
    values = [resolve(s, args, kwargs) for s in pos]
    kwv = {k: resolve(s, args, kwargs) for k, s in kw.items()}
    fn = target
    if isinstance(target, tuple):                 # a method: on an instance made from the case
        cls, attr = target
        fn = getattr(make(cls, args, kwargs), attr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            return fn(*values, **kwv)


def maker():
    """An instance of ``cls`` made from the case (its constructor's arguments remapped from
    the case's sizes, first that works), cached per class and case."""
    cache: dict = {}

    def make(cls, args, kwargs):
        key = (cls, id(args))
        if key not in cache:
            cache[key] = None
            for pos, kw in itertools.islice(mappings(cls, sources(args, kwargs), []), 200):
                try:
                    cache[key] = cls(*[resolve(s, args, kwargs) for s in pos],
                                     **{k: resolve(s, args, kwargs) for k, s in kw.items()})
                    break
                except Exception:  # noqa: BLE001
                    continue
        if cache[key] is None:
            raise TypeError("no instance")
        return cache[key]
    return make


def probe(cases: dict) -> tuple[list, int]:
    import lesson10._standin as standin
    standin.JUDGING = ("probe", "probe")
    found, calls = [], 0
    everything = reachable()
    everything += [(f"lesson10._standin.{n}", f) for n, f in sorted(vars(standin).items())
                   if isinstance(f, types.FunctionType)]
    make = maker()
    for exercise, (names, recorded) in cases.items():
        args, kwargs, answer = recorded[0]
        wanted = targets(answer, list(args) + list(kwargs.values()))
        srcs = sources(args, kwargs)
        for name, target in everything:
            fn = getattr(*target) if isinstance(target, tuple) else target
            strings = strings_of(fn)
            for pos, kw in itertools.islice(mappings(fn, srcs, strings, names), BUDGET):
                calls += 1
                try:
                    out = call(target, pos, kw, args, kwargs, make)
                except (Exception, Slow):  # noqa: BLE001 - a refusal, the wrong types, too slow
                    continue
                for where, value in results(out):
                    for what, want in wanted:
                        if _same(value, want) and _holds(target, pos, kw, where, what, recorded[1:], make):
                            found.append({"exercise": exercise, "call": name, "args": repr(pos),
                                          "kwargs": repr(kw), "result": where, "gives": what})
    return found, calls


def _pick(value, where):
    for key, v in results(value):
        if key == where:
            return v
    raise KeyError(where)


def _holds(target, pos, kw, where, what, others, make) -> bool:
    for args, kwargs, answer in others:
        want = answer if what == "answer" else answer[
            (int if isinstance(answer, tuple) else str)(what.split(" ", 1)[1])]
        try:
            got = _pick(call(target, pos, kw, args, kwargs, make), where)
        except Exception:  # noqa: BLE001
            return False
        if not _same(got, want):
            return False
    return True


def _same(a, b) -> bool:
    try:
        return same(a, b)
    except Exception:  # noqa: BLE001 - a strange result is no answer
        return False


# --------------------------------------------------------------------------- the cases
def _plain(x) -> bool:
    if x is None or isinstance(x, (str, bool, numbers.Number, np.ndarray, np.generic)):
        return True
    return isinstance(x, (list, tuple)) and all(_plain(y) for y in x)


def record_cases(right: dict, exercises=None) -> dict:
    """``{notebook: {exercise: (argument names, [(args, {}, answer), ...])}}``: every case
    each check runs, recorded around a right answer (``right[exercise]``, in the real
    package, outside any sandbox), the arguments bound to the answer's parameter names.
    Exercises whose cases hold what the check serves (a network, a kernel) are left out:
    what is served decides their answer (tests/test_checks_observed.py)."""
    import contextlib
    import io

    from lesson10 import checks
    from lesson10.checks import EXERCISES
    out: dict = {}
    for ex, fn in right.items():
        if exercises is not None and ex not in exercises:
            continue
        sig, rec = inspect.signature(fn), []

        def wrap(*a, __fn=fn, __sig=sig, __rec=rec, **k):
            got = __fn(*a, **k)
            bound = __sig.bind(*a, **k)
            bound.apply_defaults()
            __rec.append((tuple(bound.arguments.values()), {}, got))
            return got
        with contextlib.redirect_stdout(io.StringIO()):
            getattr(checks, f"check_{ex}")(wrap)
        plain = [c for c in rec if _plain(list(c[0]))]
        if plain and len(plain) == len(rec):
            out.setdefault(EXERCISES[ex].notebook, {})[ex] = (list(sig.parameters), plain)
    return out


if __name__ == "__main__":
    box, cases_file = sys.argv[1], sys.argv[2]
    sys.modules["torch"] = None       # type: ignore[assignment]  # not course code; slow to import
    signal.signal(signal.SIGVTALRM, _alarm)
    sys.path.insert(0, box)
    with open(cases_file, "rb") as f:
        cases = pickle.load(f)
    import contextlib
    import io
    with contextlib.redirect_stdout(io.StringIO()):          # what a called function prints
        found, calls = probe(cases)
    print(json.dumps({"found": found, "calls": calls}))
