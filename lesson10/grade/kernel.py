"""The Jupyter kernel that runs a submission for its feedback: IPython's kernel, started
from the private copy of the package (see :mod:`.sandbox`), with its address space
limited like a worker's (``LESSON10_GRADE_MEMORY`` bytes) and no core dumps."""
from __future__ import annotations

import os
import resource


def main() -> None:
    memory = int(os.environ.pop("LESSON10_GRADE_MEMORY", "0") or 0)
    if memory > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    from ipykernel import kernelapp
    kernelapp.launch_new_instance()
