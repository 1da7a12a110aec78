import contextlib
import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")

try:
    from hypothesis import HealthCheck, settings

    # No per-example deadline: the machine is small and shared; keep runs bounded by count.
    # On CI (the CI variable is set): the same examples on every run, and no example
    # database written into the checkout, so a red build is reproducible and no run
    # fails only because of a rare draw that the previous run did not make.
    _ci = {"derandomize": True, "database": None} if os.environ.get("CI") else {}
    settings.register_profile("lesson10", deadline=None, max_examples=40,
                              suppress_health_check=[HealthCheck.too_slow], **_ci)
    settings.load_profile("lesson10")
except ImportError:  # pragma: no cover
    pass


class SharedLaunch:
    """One launch of ``n`` ranks runs the rank jobs of every collected test module.

    Starting ranks costs seconds (each imports torch), so a test module declares its
    jobs as ``RANK_JOBS = {name: make}`` with ``make(n) -> (worker, kwargs)`` (a worker
    of :mod:`lesson10.runs.workers` or of ``rank_workers``; ``kwargs`` a dict, or a list
    of dicts for one result per case). The first test that asks for ``n`` ranks starts
    them once for all the jobs of the selected tests; results are cached for the session,
    and a failed launch is remembered instead of retried by every module.
    """

    def __init__(self, session):
        self.session = session
        self.cache: dict[int, dict] = {}

    def _jobs(self) -> dict:
        """``{"module:name": make}`` over the selected tests' modules."""
        jobs = {}
        for item in self.session.items:
            mod = getattr(item, "module", None)
            for name, make in getattr(mod, "RANK_JOBS", {}).items():
                jobs[f"{mod.__name__}:{name}"] = make
        return jobs

    @contextlib.contextmanager
    def _across_workers(self, n: int):
        """Under pytest-xdist each worker collects every test, so each would start the same
        ranks: the first worker that needs ``n`` ranks runs them (holding a lock in the
        folder the workers share) and leaves the results in a pickle for the others. Yields
        a dict; ``"results"`` set in it is saved. Without xdist: a plain dict."""
        if "PYTEST_XDIST_WORKER" not in os.environ:
            yield {}
            return
        import fcntl
        import pickle
        root = self.session.config._tmp_path_factory.getbasetemp().parent   # shared by the workers
        path = root / f"lesson10-shared-launch-{n}.pickle"
        with open(root / f"lesson10-shared-launch-{n}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            shared = {"results": pickle.loads(path.read_bytes())} if path.exists() else {}
            before = shared.get("results")
            yield shared
            if shared.get("results") is not before:
                path.write_bytes(pickle.dumps(shared["results"]))

    def __call__(self, n: int, name: str, timeout: float = 1800.0) -> list:
        """Each rank's result of job ``name`` (``"module:name"``) on ``n`` ranks. ``timeout``
        only stops a hang (every module's jobs run in this one launch: minutes on a slow, busy
        machine), so it is long."""
        from rank_workers import run_jobs

        from lesson10.spmd.launch import launch

        have = self.cache.setdefault(n, {})
        failure = None
        if name not in have:
            with self._across_workers(n) as shared:
                have.update(shared.get("results", {}))
                if name not in have:
                    todo = {k: make(n) for k, make in self._jobs().items() if k not in have}
                    try:
                        outs = launch(run_jobs, n, todo, timeout=timeout, quiet=True)
                    except Exception as exc:  # noqa: BLE001 - every test of the shared run shows it
                        failure = exc          # this test shows it whole, the others its repr
                        for k in todo:
                            have[k] = RuntimeError(f"{exc!r}"[:4000])
                    else:
                        for k in todo:
                            have[k] = [o[k] for o in outs]
                    shared["results"] = have
        if failure is not None:
            raise failure
        if isinstance(have[name], Exception):
            raise RuntimeError(f"the shared {n}-rank launch failed (see the first failing "
                               f"test): {have[name]!r}"[:2000]) from have[name]
        return have[name]


@pytest.fixture(scope="session")
def shared_launch(request):
    return SharedLaunch(request.session)


@pytest.fixture(scope="module")
def rank_results(request, shared_launch):
    """``rank_results(n, name)``: each rank's result of this module's ``RANK_JOBS[name]``."""
    module = request.module.__name__
    return lambda n, name: shared_launch(n, f"{module}:{name}")


@pytest.fixture
def course_entries(monkeypatch):
    """``add(exercise, status, points)``: the scheme in force then has that entry besides its
    own (a test's toy exercise needs one, as a course's exercise has one in course.toml)."""
    import dataclasses
    from types import MappingProxyType

    from lesson10 import scheme

    def add(exercise: str, status: str = "counts", points: int = 1) -> None:
        found = scheme.current()
        fixed = dataclasses.replace(found, exercises=MappingProxyType(
            {**found.exercises, exercise: (status, points)}))
        monkeypatch.setattr(scheme, "current", lambda: fixed)   # no course code called later
    return add


@pytest.fixture(autouse=True)
def _course_file_not_pinned():
    """A command run in-process pins its course file in ``$LESSON10_COURSE`` (for the
    processes it starts): put it back after each test, so no test's file reaches the next."""
    before = os.environ.pop("LESSON10_COURSE", None)
    yield
    os.environ.pop("LESSON10_COURSE", None)
    if before is not None:
        os.environ["LESSON10_COURSE"] = before
