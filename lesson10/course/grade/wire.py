"""The judge <-> worker wire: plain data only, never pickled code.

A value is encoded as a JSON tree plus a list of raw byte blobs. Allowed values:
``None``, ``bool``, ``int``, ``float``, ``str``, NumPy arrays and scalars of a plain
numeric, boolean or text dtype (object and structured arrays are refused), and
``list`` / ``tuple`` / ``dict`` of those (nested at most :data:`MAX_DEPTH` deep).
Subclasses (of ``list``, ``float``, ``np.ndarray`` ...) arrive as the plain base type,
so nothing the sender defines runs in the receiver. On the judge's side a Python
callable may be sent too: it travels as a number, and the sandbox gets a stub that asks
the judge to call it. So may an object whose class names the methods it offers in
``__wire_methods__`` (the network a check serves to a ring, say): it arrives as an
object holding only stubs of those methods, its state stays with the judge.

This file runs on both sides: the judge imports it as ``lesson10.course.grade.wire``, and the
sandbox gets a copy of it (``_lesson10_wire``), since no course package is there.

The messages themselves, one table: :data:`PROTOCOL`. Framing over a pipe: an 8-byte
big-endian length, the JSON header (``{"msg": ...,
"blobs": [len, ...]}``), then the blobs. A message over :data:`MAX_BYTES` is refused.
"""
from __future__ import annotations

import json
import os
import select
import struct
import time

import numpy as np

MAX_DEPTH = 32
MAX_BYTES = 64 * 2**20
MAX_HEADER = 8 * 2**20        # the JSON part (the arrays travel as raw blobs)
MAX_BLOBS = 100_000           # raw blobs in one message
_DTYPE_KINDS = "biufcUS"     # bool, int, uint, float, complex, text, bytes


#: Every message of the protocol, by its ``"op"``: (who sends it, on which pipe, what it
#: means). The main pipe runs judge <-> the notebook's process (the runner); a channel runs
#: judge <-> the fork judged for one exercise. A message a side does not expect where it
#: arrives is refused there: out of turn, the fault of the cell running (or that ran last).
PROTOCOL = {
    # main pipe: start
    "hello": ("runner", "main", "the runner started (its pid and Python)"),
    "setup": ("judge", "main", "the cells to run, the helper files, the exercise time limit"),
    "ready": ("runner", "main", "set up; the cells run next"),
    # main pipe: the cells
    "cell": ("runner", "main", "cell `index` starts"),
    "done": ("runner", "main", "cell `index` ended: its outputs and error"),
    "check": ("runner", "main", "the running cell called check_<exercise>(fn)"),
    "judge": ("judge", "main", "fork and serve fn on channel `channel` within `timeout` s"),
    "checked": ("runner", "main", "the fork judged on the channel ended (its exit status)"),
    "verdict": ("judge", "main", "the check's verdict: print `text`, return the outcome"),
    "finished": ("runner", "main", "every cell ran"),
    "fatal": ("runner", "main", "the runner itself failed (not a cell's own error): `message`"),
    # main pipe: the end
    "exit": ("judge", "main", "the run is over: say bye"),
    "bye": ("runner", "main", "going (the judge reads its CPU time, then closes)"),
    # a channel: one exercise judged
    "call": ("judge", "channel", "call the student's function on `args`"),
    "callback": ("fork", "channel", "the function called a callable the check passed in"),
    "return": ("judge", "channel", "that callable's value"),
    "raise": ("judge", "channel", "that callable raised `type`: `message`"),
    "result": ("fork", "channel", "the function's value, and what it did to its arguments"),
    "error": ("fork", "channel", "the function raised `type`: `message`"),
    "end": ("judge", "channel", "no more calls: the fork may go"),
}


class WireError(ValueError):
    """A value that cannot travel (wrong type, too large, malformed)."""


class Timeout(Exception):
    """The other side did not answer before the deadline."""


class Closed(Exception):
    """The other side closed the pipe (it exited or was killed)."""


# --------------------------------------------------------------------------- values
def encode(value, callables: list | None = None):
    """``(tree, blobs)`` for ``value``; ``callables`` (a list) accepts functions, which
    are appended to it and sent as their index."""
    blobs: list[bytes] = []
    tree = _enc(value, blobs, callables, 0)
    return tree, blobs


def _array(a: np.ndarray, blobs) -> dict:
    if a.dtype.kind not in _DTYPE_KINDS or a.dtype.fields is not None:
        raise WireError(f"an array of dtype {a.dtype} cannot be sent (only numbers, booleans "
                        f"and text; object arrays are refused)")
    blobs.append(np.ascontiguousarray(a).tobytes())
    return {"dtype": a.dtype.str, "shape": list(a.shape), "blob": len(blobs) - 1}


_NOT_LEAF = object()


def _enc_leaf(x, blobs):
    """A None, number, string or NumPy value as sent; ``_NOT_LEAF`` for anything else."""
    if x is None or type(x) in (bool, str):
        return x
    if isinstance(x, np.generic):
        return {"$": "scalar", **_array(np.asarray(x), blobs)}
    if isinstance(x, np.ndarray):
        return {"$": "array", **_array(np.asarray(x), blobs)}
    if isinstance(x, bool):
        return bool(x)
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return {"$": "float", "v": repr(float(x))}      # keeps nan / inf exactly
    if isinstance(x, str):
        return str(x)
    if isinstance(x, complex):
        return {"$": "scalar", **_array(np.asarray(x, dtype=complex), blobs)}
    return _NOT_LEAF


def _enc_callable(x, callables):
    """A served object, an object with ``__wire_methods__`` or a callable as sent; None if
    ``x`` is none of them."""
    if isinstance(x, Served):
        # a served object going back (an argument copied back): it stays where it lives
        return {"$": "fn", "id": -1, "name": type(x).__name__}
    if getattr(type(x), "__wire_methods__", None):
        methods = []
        for name in type(x).__wire_methods__:
            callables.append(getattr(x, name))
            methods.append([str(name), len(callables) - 1])
        return {"$": "obj", "name": type(x).__name__, "methods": methods}
    if callable(x):
        callables.append(x)
        return {"$": "fn", "id": len(callables) - 1, "name": str(getattr(x, "__name__", "fn"))}
    return None


def _enc(x, blobs, callables, depth):
    if depth > MAX_DEPTH:
        raise WireError(f"nested more than {MAX_DEPTH} levels deep")
    leaf = _enc_leaf(x, blobs)
    if leaf is not _NOT_LEAF:
        return leaf
    if isinstance(x, range):
        if len(x) > 2**20:
            raise WireError("a range of more than 2**20 numbers cannot be sent")
        return {"$": "list", "items": [int(i) for i in x]}
    if isinstance(x, (list, tuple)):
        kind = "tuple" if isinstance(x, tuple) else "list"
        return {"$": kind, "items": [_enc(y, blobs, callables, depth + 1) for y in list(x)]}
    if isinstance(x, dict):
        return {"$": "dict", "items": [[_enc(k, blobs, callables, depth + 1),
                                        _enc(v, blobs, callables, depth + 1)]
                                       for k, v in list(dict.items(x))]}
    sent = None if callables is None else _enc_callable(x, callables)
    if sent is not None:
        return sent
    raise WireError(f"a value of type {type(x).__name__} cannot be sent (only NumPy arrays, "
                    f"numbers, strings, None, and lists, tuples or dicts of them)")


def decode(tree, blobs, make_fn=None):
    """The value of ``(tree, blobs)``; ``make_fn(id, name)`` builds a stand-in for a sent
    callable (without it, a callable is refused). Whatever the tree holds, the only error
    raised is :class:`WireError`."""
    try:
        return _dec(tree, blobs, make_fn, 0)
    except WireError:
        raise
    except Exception as exc:  # noqa: BLE001 - any malformed tree is the sender's fault
        raise WireError(f"malformed value: {type(exc).__name__}: {str(exc)[:200]}") from None


def _dec_array(t, blobs, kind):
    try:
        dtype = np.dtype(str(t["dtype"]))
        shape = tuple(int(n) for n in t["shape"])
        blob = blobs[int(t["blob"])]
    except (TypeError, ValueError, KeyError, IndexError) as exc:
        raise WireError(f"malformed array: {exc}") from None
    if dtype.kind not in _DTYPE_KINDS or dtype.fields is not None or min(shape, default=1) < 0:
        raise WireError(f"refused array of dtype {dtype}")
    if int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != len(blob):
        raise WireError("array size does not match its data")
    a = np.frombuffer(blob, dtype=dtype).reshape(shape).copy()
    return a[()] if kind == "scalar" else a


def _dec_dict(t, blobs, make_fn, depth):
    out = {}
    for k, v in t["items"]:
        key = _dec(k, blobs, make_fn, depth + 1)
        try:
            out[key] = _dec(v, blobs, make_fn, depth + 1)
        except TypeError:
            raise WireError(f"unhashable dict key of type {type(key).__name__}") from None
    return out


def _dec_obj(t, make_fn):
    try:
        methods = {str(name): make_fn(int(i), str(name)) for name, i in t["methods"]}
        cls = type(str(t.get("name", "Served"))[:60] or "Served", (Served,), {})
    except (TypeError, ValueError, KeyError) as exc:
        raise WireError(f"malformed object: {exc}") from None
    return cls(methods)


def _dec(t, blobs, make_fn, depth):
    if depth > MAX_DEPTH:
        raise WireError(f"nested more than {MAX_DEPTH} levels deep")
    if t is None or type(t) in (bool, int, str):
        return t
    if not isinstance(t, dict) or "$" not in t:
        raise WireError(f"malformed value {str(t)[:80]!r}")
    kind = t["$"]
    if kind in ("array", "scalar"):
        return _dec_array(t, blobs, kind)
    if kind == "float":
        return float(t["v"])
    if kind in ("list", "tuple"):
        items = [_dec(y, blobs, make_fn, depth + 1) for y in t["items"]]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict":
        return _dec_dict(t, blobs, make_fn, depth)
    if kind == "fn" and make_fn is not None:
        return make_fn(int(t["id"]), str(t.get("name", "fn"))[:100])
    if kind == "obj" and make_fn is not None:
        return _dec_obj(t, make_fn)
    raise WireError(f"refused value of kind {kind!r}")


class Served:
    """What an object with ``__wire_methods__`` becomes on the other side: its methods
    only, each a stub that calls the original where it lives."""

    def __init__(self, methods: dict):
        self.__dict__.update(methods)
        self._names = tuple(methods)

    def __getattr__(self, name):
        raise AttributeError(f"{type(self).__name__} offers only "
                             f"{', '.join(self._names) or 'nothing'} (it has no {name!r})")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} offering {', '.join(self._names)}>"

    def __reduce__(self):            # pickled for a spawned worker: its stubs refuse there
        return (Served, ({name: self.__dict__[name] for name in self._names},))


def check_shape(msg: dict, cell) -> bool:
    """Whether a runner's ``check`` request has the shape the runner sends: from the cell
    being run, a text exercise id, a bool ``callable`` (anything else was forged by a cell,
    and is that cell's protocol error)."""
    return (msg.get("cell") == cell and type(msg.get("cell")) is int
            and type(msg.get("exercise")) is str and type(msg.get("callable")) is bool)


# --------------------------------------------------------------------------- framing
class Conn:
    """One direction pair of pipe file descriptors carrying framed messages."""

    def __init__(self, rfd: int, wfd: int, nonblocking_write: bool = False):
        self.rfd, self.wfd = rfd, wfd
        self._buf = bytearray()
        if nonblocking_write:
            os.set_blocking(wfd, False)

    def send(self, msg: dict, blobs=(), deadline: float | None = None) -> None:
        header = json.dumps({"msg": msg, "blobs": [len(b) for b in blobs]}).encode()
        if len(header) > MAX_HEADER:
            raise WireError(f"message of {len(header) / 2**20:.0f} MiB of nested values is over "
                            f"the {MAX_HEADER / 2**20:.0f} MiB limit (send arrays)")
        total = 8 + len(header) + sum(len(b) for b in blobs)
        if total > MAX_BYTES:
            raise WireError(f"message of {total / 2**20:.0f} MiB is over the "
                            f"{MAX_BYTES / 2**20:.0f} MiB limit")
        self._write(struct.pack(">Q", len(header)) + header, deadline)
        for b in blobs:
            self._write(b, deadline)

    def _write(self, data: bytes, deadline) -> None:
        view = memoryview(data)
        while view:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Timeout("timed out sending")
                _, ready, _ = select.select([], [self.wfd], [], left)
                if not ready:
                    continue
            try:
                n = os.write(self.wfd, view)
            except BlockingIOError:
                continue
            except (BrokenPipeError, OSError) as exc:
                raise Closed(str(exc)) from None
            view = view[n:]

    def _read(self, n: int, deadline) -> bytes:
        while len(self._buf) < n:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Timeout("timed out waiting for an answer")
                ready, _, _ = select.select([self.rfd], [], [], left)
                if not ready:
                    continue
            try:
                # exactly what is missing: nothing of the next message is read ahead
                chunk = os.read(self.rfd, n - len(self._buf))
            except OSError as exc:
                raise Closed(str(exc)) from None
            if not chunk:
                raise Closed("the other side closed the pipe")
            self._buf += chunk
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data

    def recv(self, deadline: float | None = None):
        """``(msg, blobs)`` of the next message: ``msg`` is always a ``dict`` with string
        keys. Any bytes that are not such a message raise :class:`WireError` (the stream is
        then out of step: the caller drops the connection); a closed pipe :class:`Closed`,
        the deadline :class:`Timeout`."""
        (n,) = struct.unpack(">Q", self._read(8, deadline))
        if n > MAX_HEADER:
            raise WireError(f"the channel is out of step: a message announced a header of {n} "
                            f"bytes (over the limit of {MAX_HEADER // 2**20} MiB). Something besides "
                            f"the grader wrote to the channel, such as a forked multiprocessing "
                            f"pool worker calling what the check served: call it from your "
                            f"function's own process (threads are fine)")
        raw = self._read(n, deadline)
        msg, sizes = _header(raw)
        if sum(sizes) + n > MAX_BYTES:
            raise WireError("message over the size limit")
        return msg, [self._read(s, deadline) for s in sizes]


def _header(raw: bytes) -> tuple[dict, list[int]]:
    """``(msg, blob sizes)`` of a JSON header, its shape checked: ``{"msg": {str: ...},
    "blobs": [int >= 0, ...]}``. Deep nesting, a non-object, wrong types: :class:`WireError`."""
    try:
        head = json.loads(raw)
    except RecursionError:
        raise WireError("malformed message: nested too deeply") from None
    except Exception as exc:  # noqa: BLE001 - bad UTF-8, bad JSON, numbers too large ...
        raise WireError(f"malformed message: {type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(head, dict) or not isinstance(head.get("msg"), dict) \
            or not isinstance(head.get("blobs"), list):
        raise WireError("malformed message: not {\"msg\": {...}, \"blobs\": [...]}")
    msg, sizes = head["msg"], head["blobs"]
    if len(sizes) > MAX_BLOBS or not all(type(s) is int and 0 <= s <= MAX_BYTES for s in sizes):
        raise WireError("malformed message: blob sizes must be at most "
                        f"{MAX_BLOBS} whole numbers from 0 to {MAX_BYTES}")
    if not all(type(k) is str for k in msg):
        raise WireError("malformed message: its keys must be strings")
    return msg, sizes


# --------------------------------------------------------------------------- aliasing
def _arrays(x, path, depth=0):
    """``(path, array)`` of every array in ``x`` (lists and tuples, a few levels deep)."""
    if isinstance(x, np.ndarray):
        yield path, x
    elif isinstance(x, (list, tuple)) and depth < 3:
        for i, y in enumerate(list(x)):
            yield from _arrays(y, path + [i], depth + 1)


def shared(result, args) -> list:
    """``[[path in result, path in args], ...]``: the arrays of ``result`` that share memory
    with an argument of the same shape (an input handed back, or a view of all of it). The
    sandbox sends them with the result, so that the judge's check sees the aliasing that
    the check cell sees (:func:`relink`)."""
    found: list = []
    try:
        inputs = list(_arrays(list(args), []))
        for rpath, r in _arrays(result, []):
            for apath, a in inputs:
                if r.shape == a.shape and np.shares_memory(r, a):
                    found.append([rpath, apath])
                    break
    except Exception:  # noqa: BLE001 - too hard to tell, odd sequences: no link, never an error
        pass
    return found


def relink(result, links, args):
    """``result`` with each array that :func:`shared` named replaced by the judge's own
    argument it aliased in the sandbox (``links`` from the other side: malformed paths are
    ignored)."""
    def at(x, path):
        for i in path:
            x = x[int(i)]
        return x

    def put(x, path, value):
        if not path:
            return value
        items = list(x)
        items[int(path[0])] = put(items[int(path[0])], path[1:], value)
        return tuple(items) if isinstance(x, tuple) else items
    for link in links if isinstance(links, list) else ():
        try:
            rpath, apath = link
            target = at(list(args), apath)
            if isinstance(target, np.ndarray) and at(result, rpath).shape == target.shape:
                result = put(result, list(rpath), target)
        except (TypeError, ValueError, IndexError, KeyError, AttributeError):
            continue
    return result
