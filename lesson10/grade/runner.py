"""Run a submission top to bottom for its outputs: the student's feedback, not the score.

nbclient executes every cell in a fresh kernel (:mod:`.kernel`: the private package
copy, limited memory), errors allowed, with a per-cell timeout and a total one for the
notebook. Output is capped per cell (:data:`OUTPUT_CAP` characters), so a cell that
prints 100 MB costs little memory. The errors that the cells raised (other than a
failed check) are returned as feedback lines.
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from . import sandbox

OUTPUT_CAP = 100_000
KERNEL_NAME = "lesson10-grade"


def _client_class():
    from jupyter_client.kernelspec import KernelSpecManager
    from nbclient import NotebookClient

    class CappedClient(NotebookClient):
        """A NotebookClient with a total deadline, a cap on output, and our own kernel."""

        def __init__(self, nb, *, kernel_dir: str, deadline: float, cap: int, **kw):
            super().__init__(nb, **kw)
            self._kernel_dir, self._deadline, self._cap = kernel_dir, deadline, cap
            self._sizes: dict[int, int] = {}

        def create_kernel_manager(self):
            ksm = KernelSpecManager(kernel_dirs=[self._kernel_dir])
            self.km = self.kernel_manager_class(kernel_name=KERNEL_NAME, kernel_spec_manager=ksm,
                                                config=self.config)
            return self.km

        def _get_timeout(self, cell):
            left = self._deadline - time.monotonic()
            return max(1, min(self.timeout, int(left) + 1))

        def output(self, outs, msg, display_id, cell_index):
            size = len(json.dumps(msg.get("content", {}), default=str))
            used = self._sizes.get(cell_index, 0)
            self._sizes[cell_index] = used + size
            if used + size > self._cap:
                if used <= self._cap:
                    self._sizes[cell_index] = self._cap + 1
                    from nbformat.v4 import new_output
                    outs.append(new_output("stream", name="stderr",
                                           text=f"[grader: output of this cell cut at "
                                                f"{self._cap} characters]\n"))
                return None
            return super().output(outs, msg, display_id, cell_index)

    return CappedClient


def _kernel_spec(folder: Path, pkg_root: Path) -> Path:
    spec = folder / "kernels" / KERNEL_NAME
    spec.mkdir(parents=True)
    argv = sandbox.bootstrap(pkg_root, "lesson10.grade.kernel") + ["-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps(
        {"argv": argv, "display_name": "lesson10 grader", "language": "python"}))
    return folder / "kernels"


def execute(nb, *, workdir: Path, tmp: Path, package: sandbox.Package, cell_timeout: float,
            deadline: float, memory: int, cap: int = OUTPUT_CAP, tag: str = "") -> dict:
    """Execute ``nb`` (an nbformat node, changed in place). Returns ``{"errors": [...],
    "environment": message or None}``; ``environment`` is set when no kernel could start
    (the grader's fault, not the student's)."""
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    pkg_root = package.copy(tmp)
    kernels = _kernel_spec(Path(tmp) / "jupyter", pkg_root)
    env = sandbox.child_env({"LESSON10_GRADE_MEMORY": str(memory), sandbox.TAG_ENV: tag})
    client = _client_class()(nb, kernel_dir=str(kernels), deadline=deadline, cap=cap,
                             timeout=int(max(1, cell_timeout)), allow_errors=True,
                             startup_timeout=60, shutdown_kernel="immediate",
                             resources={"metadata": {"path": str(workdir)}})
    result = {"errors": [], "environment": None}
    try:
        # the kernel's own stdout/stderr (not the cells' outputs) would land in the grader's
        client.execute(env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except CellTimeoutError as exc:
        result["errors"].append(f"a cell ran out of time: {str(exc).splitlines()[0][:300]}")
    except DeadKernelError as exc:
        result["errors"].append(f"the kernel died (os._exit, a signal or out of memory): "
                                f"{str(exc)[:200]}")
    except RuntimeError as exc:
        text = str(exc)
        if "Kernel died before replying to kernel_info" in text or "didn't respond" in text:
            result["environment"] = f"the notebook kernel did not start: {text[:300]}"
        else:
            result["errors"].append(f"execution stopped: {text[:300]}")
    except Exception as exc:  # noqa: BLE001 - whatever else stopped the run is feedback
        result["errors"].append(f"execution stopped: {type(exc).__name__}: {str(exc)[:300]}")
    finally:
        sandbox.remove(pkg_root)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error" and out.get("ename") != "CheckFailed":
                result["errors"].append(f"{out.get('ename')}: {str(out.get('evalue'))[:200]}")
    return result
