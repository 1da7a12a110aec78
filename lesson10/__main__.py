"""Command line: ``python -m lesson10 {demo,run,bench,grade,gradescope,release,report,build,course}``.

    demo                      every simulated method on a small case: error and bytes vs. the lesson
    run METHOD --nproc N      one real multi-process run on gloo/NCCL; METHOD one of
                              sp, ring, ulysses, allgather, usp, moe (lesson10.runs.registry)
    bench WHAT                benchmarks (sim, ring, ulysses, compare, moe, nodes, sp, ...) -> benchmarks/results/
                              (run and bench, but bench sim, need PyTorch: lesson10[spmd])
    grade NOTEBOOK...         instructors: score submitted notebooks with a judge (see README)
    gradescope OUT.zip        instructors: write a Gradescope autograder (setup.sh, run_autograder)
    release DIR               instructors: write the student repository (no solutions/);
                              release --self-study DIR: the self-study edition (folded solutions)
    report RESULTS            instructors: the class report (HTML with plots, Markdown) of a graded class
    build [--check]           write notebooks/ from solutions/ (or check it is up to date)
    course [--course FILE]    instructors: the scheme in force (points, optional exercises, maximum, term)
"""
from __future__ import annotations

import importlib
import sys

USAGE = __doc__

#: each command's function, by import path (relative to this package)
COMMANDS = {"demo": ".runs.demo:main", "run": ".runs.cli:main", "bench": ".bench:main",
            "grade": ".course.grade:main", "gradescope": ".course.grade.gradescope:main_bundle",
            "release": ".course.release:main", "report": ".course.report:main",
            "build": ".course.build:main", "course": ".course.coursefile:main"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"unknown command {cmd!r}\n{USAGE}", file=sys.stderr)
        return 2
    module, name = COMMANDS[cmd].split(":")
    run = getattr(importlib.import_module(module, __package__), name)
    try:
        return run(rest) or 0
    except ModuleNotFoundError as exc:     # run / bench without the spmd extra
        if exc.name != "torch":
            raise
        hint = str(exc) if "lesson10[spmd]" in str(exc) else \
            f'{exc}: this command needs PyTorch, pip install "lesson10[spmd]"'
        print(f"python -m lesson10 {cmd}: {hint}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
