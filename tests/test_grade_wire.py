"""The wire under any bytes (Hypothesis): whatever a submission writes on a socket, the
judge's side gets a message dict or one of the wire's own errors, never anything else; and
the runner's served stubs called from many threads at once each get their own reply."""
import json
import socket
import struct
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lesson10.course.grade import wire

WIRE_ERRORS = (wire.WireError, wire.Closed, wire.Timeout)
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) |
                    st.dictionaries(st.text(max_size=4), inner, max_size=4), max_leaves=30)


def _frame(header: bytes, blobs=()) -> bytes:
    return struct.pack(">Q", len(header)) + header + b"".join(blobs)


def _recv(data: bytes):
    """What ``Conn.recv`` makes of ``data`` written by the other side, which then closes."""
    a, b = socket.socketpair()

    def write():
        try:
            b.sendall(data)
        except OSError:
            pass
        b.close()
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        conn = wire.Conn(a.fileno(), a.fileno())
        return conn.recv(deadline=time.monotonic() + 30)
    finally:
        a.close()
        writer.join(timeout=10)


def _only_wire_errors(data: bytes):
    try:
        msg, blobs = _recv(data)
    except WIRE_ERRORS:
        return None
    assert isinstance(msg, dict) and all(isinstance(k, str) for k in msg)
    assert isinstance(blobs, list) and all(isinstance(b, bytes) for b in blobs)
    return msg


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200))
def test_any_bytes_are_a_message_or_a_wire_error(data):
    _only_wire_errors(data)


@settings(max_examples=300, deadline=None)
@given(JSON, st.lists(st.binary(max_size=16), max_size=3))
def test_any_json_header_is_a_message_or_a_wire_error(tree, blobs):
    sizes = [len(b) for b in blobs]
    for head in (tree, {"msg": tree, "blobs": sizes}, {"msg": {"op": tree}, "blobs": sizes}):
        _only_wire_errors(_frame(json.dumps(head).encode(), blobs))


@settings(max_examples=300, deadline=None)
@given(JSON, st.lists(st.binary(max_size=16), max_size=3))
def test_decode_of_any_tree_is_a_value_or_a_wire_error(tree, blobs):
    for t in (tree, {"$": "list", "items": tree}, {"$": "array", "dtype": tree, "shape": [1],
                                                  "blob": 0}, {"$": "dict", "items": [[tree, tree]]}):
        try:
            wire.decode(t, blobs, make_fn=lambda i, n: (i, n))
        except wire.WireError:
            pass


@pytest.mark.parametrize("header", [
    b"[" * 200_000 + b"]" * 200_000,                           # RecursionError in json
    json.dumps({"msg": [{"op": "done"}], "blobs": []}).encode(),     # a list for an object
    json.dumps([{"msg": {}, "blobs": []}]).encode(),
    json.dumps({"msg": {"op": "x"}, "blobs": [1e400]}).encode(),  # inf as a size
    json.dumps({"msg": {"op": "x"}, "blobs": [-1]}).encode(),
    json.dumps({"msg": {"op": "x"}, "blobs": "12"}).encode(),
    json.dumps({"msg": {"op": "x"}, "blobs": [0] * (wire.MAX_BLOBS + 1)}).encode(),
    b"\xff\xfe not utf-8",
    b"",
])
def test_known_bad_headers_are_wire_errors(header):
    with pytest.raises(wire.WireError):
        _recv(_frame(header))


def test_a_huge_header_length_is_refused_before_reading_it():
    with pytest.raises(wire.WireError, match="over the limit"):
        _recv(struct.pack(">Q", wire.MAX_HEADER + 1))
    with pytest.raises(wire.WireError):
        _recv(_frame(json.dumps({"msg": {}, "blobs": [wire.MAX_BYTES]}).encode()))


def test_deeply_nested_values_are_wire_errors():
    deep: dict = {"$": "list", "items": []}
    for _ in range(5000):
        deep = {"$": "list", "items": [deep]}
    with pytest.raises(wire.WireError):
        wire.decode(deep, [])
    for bad in ({"$": "array", "dtype": "<f8", "shape": [2**62, 4], "blob": 0},
                {"$": "float", "v": [1]}, {"$": "dict", "items": 5},
                {"$": "dict", "items": [[{"$": "list", "items": []}, 1]]}):
        with pytest.raises(wire.WireError):
            wire.decode(bad, [b""])


# ------------------------------------------------------------------ stubs from threads
@pytest.fixture()
def runner_module():
    import tempfile

    from lesson10.course.grade import standin
    folder = standin.write(Path(tempfile.mkdtemp()) / "box")
    sys.path.insert(0, str(folder))
    try:
        import _lesson10_runner as r
        yield r
    finally:
        sys.path.remove(str(folder))


def test_served_stubs_called_from_threads_each_get_their_own_reply(runner_module):
    """Sixteen threads of the judged function call the judge's ``op`` at once: each gets
    ``op`` of its own argument back (they would get each other's without the lock)."""
    r = runner_module
    judge_side, inside = socket.socketpair()

    def fn(xs, op):
        with ThreadPoolExecutor(16) as pool:
            return list(pool.map(op, xs))

    server = threading.Thread(target=r.Serve(r.wire.Conn(inside.fileno(), inside.fileno())).serve,
                              args=(fn,), daemon=True)
    server.start()
    from lesson10.course.grade import judge
    channel = judge.Channel(judge_side, "fn")
    seen = []

    def op(x):
        seen.append(int(np.asarray(x).sum()))
        return np.asarray(x) * 2
    xs = [np.full(3, i) for i in range(64)]
    out = channel.call([xs, op], {}, time.monotonic() + 60)
    assert [o.tolist() for o in out] == [(2 * x).tolist() for x in xs]
    assert sorted(seen) == sorted(3 * i for i in range(64))
    channel.close()
    server.join(timeout=10)
    inside.close()
