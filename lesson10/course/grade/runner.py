"""The cell runner: the one program that runs inside the sandbox (as ``_lesson10_runner.py``).

It runs a submission's code cells in order in an IPython shell (magics such as
``%%writefile`` work; the working folder is on ``sys.path``, as in Jupyter), captures
each cell's output (capped) and sends it to the judge. ``lesson10`` here is the
stand-in (:mod:`.standin`): no course code. When a cell calls
``checks.check_<exercise>(fn)``:

1. the runner tells the judge, which answers with a private channel (one of the socket
   pairs handed to the sandbox at its start);
2. the runner forks. The child is the notebook exactly as it is at that cell, with no
   thread a library started (a fork keeps only the calling thread); it serves the
   judge's calls of ``fn`` on the channel (arguments and results are plain data, see
   :mod:`.wire`; a callable argument is a stub that calls the judge back) and exits;
3. the parent waits for the child (killing it at the exercise's time limit), then
   prints the verdict the judge sends as the check cell's output, and goes on.

Nothing here is trusted: the judge checks every answer itself and keeps its own
clock. This file imports only the standard library, NumPy (through the wire) and
IPython, never the course package.
"""
import io
import os
import resource
import select
import signal
import sys
import time
import traceback
import warnings

# started with python -I (no script folder on the path): the stand-in package and the
# wire live beside this file, first on the path (only when it runs: a test that imports
# this file must not leave the stand-in on its own path)
if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _lesson10_wire as wire  # noqa: E402

OUTPUT_CAP = 100_000            # characters of output kept per cell


class _Capped(io.TextIOBase):
    """A stream that keeps the first :data:`OUTPUT_CAP` characters written to it."""

    def __init__(self, name, sink):
        self.name, self.sink = name, sink

    def writable(self):
        return True

    def write(self, text):
        text = str(text)
        used = self.sink["size"]
        if used < OUTPUT_CAP:
            part = text[:OUTPUT_CAP - used]
            out = self.sink["outputs"]
            if out and out[-1]["name"] == self.name:
                out[-1]["text"] += part
            else:
                out.append({"name": self.name, "text": part})
            if used + len(text) > OUTPUT_CAP:
                out.append({"name": "stderr", "text": f"\n[grader: output of this cell cut at "
                                                      f"{OUTPUT_CAP} characters]\n"})
        self.sink["size"] = used + len(text)
        return len(text)

    def flush(self):
        pass

    def isatty(self):
        return False


def _limits(memory: int, cpu: int, fsize: int, nproc: int) -> None:
    for res, value in ((resource.RLIMIT_AS, memory), (resource.RLIMIT_CPU, cpu),
                       (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_NPROC, nproc),
                       (resource.RLIMIT_CORE, 0)):
        if value >= 0:
            try:
                resource.setrlimit(res, (value, value))
            except (ValueError, OSError):
                pass


class Runner:
    def __init__(self, conn, channels):
        self.conn, self.channels = conn, channels
        self.shell = None
        self.current = None                  # index of the cell being run
        self.sink = None
        self.exercise_timeout = 30.0

    # ------------------------------------------------------------------ cells
    def setup(self, msg):
        for name, text in msg.get("files", []):
            name = os.path.basename(str(name))
            if name.endswith(".py") and not name.startswith("."):
                with open(name, "w", encoding="utf-8") as f:
                    f.write(str(text))
        self.exercise_timeout = float(msg.get("exercise_timeout", 30))
        sys.path.insert(0, os.getcwd())
        warnings.simplefilter("ignore", DeprecationWarning)     # fork() with threads (3.12+)
        from IPython.core.interactiveshell import InteractiveShell
        from traitlets.config import Config
        config = Config()
        config.HistoryManager.enabled = False        # no history thread, no sqlite file
        self.shell = InteractiveShell.instance(config=config)
        # the error of a cell is reported as data ("error" of its "done"), not as a traceback
        self.shell.showtraceback = lambda *args, **kwargs: None
        self.shell.showsyntaxerror = lambda *args, **kwargs: None
        import lesson10.checks
        lesson10.checks.hook = self.check

    def run_cells(self, cells):
        for index, source in cells:
            self.current = index
            self.conn.send({"op": "cell", "index": index})
            self.sink = {"outputs": [], "size": 0}
            error = None
            old = sys.stdout, sys.stderr
            sys.stdout, sys.stderr = _Capped("stdout", self.sink), _Capped("stderr", self.sink)
            try:
                result = self.shell.run_cell(source, store_history=False)
                exc = result.error_in_exec or result.error_before_exec
                if exc is not None:
                    error = {"ename": type(exc).__name__, "evalue": str(exc)[:2000],
                             "traceback": traceback.format_exception_only(type(exc), exc)[-1:]}
            except BaseException as exc:  # noqa: BLE001 - a cell's error must not stop the run
                error = {"ename": type(exc).__name__, "evalue": str(exc)[:2000], "traceback": []}
            finally:
                sys.stdout, sys.stderr = old
            self.conn.send({"op": "done", "index": index, "outputs": self.sink["outputs"],
                            "error": error})
            self.current = None
        self.conn.send({"op": "finished"})

    def _say(self, text):
        """Print to the cell's captured output even if the cell replaced sys.stdout."""
        if self.sink is not None:
            _Capped("stdout", self.sink).write(text + "\n")

    # ------------------------------------------------------------------ a check
    def check(self, exercise, fn):
        self.conn.send({"op": "check", "exercise": str(exercise), "cell": self.current,
                        "callable": callable(fn), "name": str(getattr(fn, "__name__", ""))[:100]})
        msg, _ = self.conn.recv()
        if msg.get("op") == "judge" and callable(fn):
            k = int(msg["channel"])
            status = self._fork_and_serve(fn, self.channels[k], float(msg.get("timeout", 30)),
                                          (str(exercise), str(msg.get("instead", ""))))
            self.conn.send({"op": "checked", "exercise": exercise, "exit": status})
            msg, _ = self.conn.recv()
        if msg.get("op") != "verdict":
            raise SystemExit("protocol")
        outcome = {k: msg.get(k) for k in ("exercise", "status", "passed", "points",
                                            "max_points", "message")}
        self._say(str(msg.get("text", "")))
        return outcome

    def _fork_and_serve(self, fn, channel_fd, timeout, judging):
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        pid = os.fork()
        if pid == 0:                                   # the child: judged, then gone
            code = 0
            try:
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                # every descriptor but its own channel: copies of the main socket or of
                # other channels that a cell kept (os.dup) go too
                os.closerange(3, channel_fd)
                os.closerange(channel_fd + 1, _max_fd())
                _restart_thread_pools()
                sys.stdout = sys.stderr = io.StringIO()
                try:
                    import lesson10._standin as standin
                    standin.JUDGING = judging
                except ImportError:
                    pass
                Serve(wire.Conn(channel_fd, channel_fd)).serve(fn)
            except BaseException:  # noqa: BLE001
                code = 1
                if os.environ.get("LESSON10_GRADE_DEBUG"):
                    with open("/tmp/lesson10-child-error.txt", "a") as f:
                        f.write(traceback.format_exc())
            os._exit(code)
        os.close(channel_fd)                           # the judge sees EOF when the child ends
        return _wait(pid, timeout)


def _max_fd() -> int:
    try:
        return max(int(fd) for fd in os.listdir("/proc/self/fd")) + 1
    except (OSError, ValueError):
        return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _restart_thread_pools() -> None:
    """A fork keeps only the thread that forked: a ``ThreadPoolExecutor`` made in an earlier
    cell still counts its workers as alive and idle, and would never run what the judged
    function submits. Make each one start new workers (honest code that uses a pool works)."""
    import gc
    import threading
    pools = sys.modules.get("concurrent.futures.thread")
    if pools is None:
        return
    for obj in gc.get_objects():
        if isinstance(obj, pools.ThreadPoolExecutor):
            obj._threads = set()
            obj._idle_semaphore = threading.Semaphore(0)
            obj._shutdown_lock = threading.Lock()
    getattr(pools, "_threads_queues", {}).clear()


def _wait(pid: int, timeout: float) -> str:
    """Wait for the child; SIGKILL it at ``timeout`` seconds. Returns how it ended."""
    end = time.monotonic() + timeout
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return f"exit {status}"
        left = end - time.monotonic()
        if left <= 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "killed at the time limit"
        if pidfd is not None:
            select.select([pidfd], [], [], left)
        else:
            time.sleep(min(left, 0.01))


class Serve:
    """The judged child's side of a channel: call ``fn`` as the judge asks."""

    def __init__(self, conn):
        self.conn = conn

    def _stub(self, fid: int, name: str):
        conn = self.conn

        def stub(*args, **kwargs):
            tree, blobs = wire.encode([list(args), dict(kwargs)], [])
            conn.send({"op": "callback", "id": fid, "args": tree}, blobs)
            msg, blobs = conn.recv()
            if msg.get("op") == "return":
                return wire.decode(msg["value"], blobs)
            raise _remote(str(msg.get("type", "Error")), str(msg.get("message", "")))

        stub.__name__ = stub.__qualname__ = name
        return stub

    def serve(self, fn):
        while True:
            try:
                msg, blobs = self.conn.recv()
            except wire.Closed:
                return
            if msg.get("op") != "call":
                return
            args, kwargs = wire.decode(msg["args"], blobs, make_fn=self._stub)
            try:
                result = fn(*args, **kwargs)
                tree, out = wire.encode([result, [list(args), dict(kwargs)]], [])
                reply = {"op": "result", "value": tree}
            except wire.WireError as exc:
                reply, out = {"op": "error", "type": "ValueError",
                              "message": f"the grader cannot read what your function returned: "
                                         f"{exc}"}, []
            except BaseException as exc:  # noqa: BLE001 - SystemExit and co. included
                reply, out = {"op": "error", "type": type(exc).__name__,
                              "message": str(exc)[:4000]}, []
            try:
                self.conn.send(reply, out)
            except wire.WireError as exc:
                self.conn.send({"op": "error", "type": "ValueError",
                                "message": f"what your function returned is too large: {exc}"})


def _remote(type_name: str, message: str) -> BaseException:
    """An exception standing for one the judge's callback raised (never unpickled)."""
    if type_name == "NotImplementedError":
        return NotImplementedError(message)
    builtin = {"ValueError": ValueError, "TypeError": TypeError, "IndexError": IndexError,
               "KeyError": KeyError, "AttributeError": AttributeError}.get(type_name)
    if builtin is not None:
        return builtin(message)
    return type(type_name[:80] or "Error", (Exception,), {})(message)


def main():
    main_fd = int(sys.argv[1])
    channels = [int(x) for x in sys.argv[2].split(",") if x]
    memory, cpu, fsize, nproc = (int(x) for x in sys.argv[3:7])
    _limits(memory, cpu, fsize, nproc)
    conn = wire.Conn(main_fd, main_fd)
    runner = Runner(conn, channels)
    conn.send({"op": "hello", "pid": os.getpid(), "python": sys.version.split()[0]})
    try:
        msg, _ = conn.recv()
        if msg.get("op") != "setup":
            os._exit(3)
        runner.setup(msg)
        conn.send({"op": "ready"})
        runner.run_cells([(int(i), str(src)) for i, src in msg.get("cells", [])])
        conn.recv()                                    # "exit", or the judge closes
        # CPU seconds of this process and its waited forks: in a PID namespace they are
        # not added to the grader's own rusage (bench grade adds them up)
        cpu = sum(getattr(resource.getrusage(who), f) for who in
                  (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN) for f in ("ru_utime", "ru_stime"))
        conn.send({"op": "bye", "cpu": cpu})
    except BaseException:  # noqa: BLE001 - tell the judge, then go
        try:
            conn.send({"op": "fatal", "cell": runner.current,
                       "message": traceback.format_exc()[-2000:]})
        except BaseException:  # noqa: BLE001
            pass
    os._exit(0)


if __name__ == "__main__":
    main()
