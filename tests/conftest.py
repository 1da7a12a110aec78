import os

os.environ.setdefault("MPLBACKEND", "Agg")

try:
    from hypothesis import settings

    # No per-example deadline: the machine is small and shared; keep runs bounded by count.
    settings.register_profile("lesson10", deadline=None, max_examples=40)
    settings.load_profile("lesson10")
except ImportError:  # pragma: no cover
    pass
