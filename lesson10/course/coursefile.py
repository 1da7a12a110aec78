"""``python -m lesson10 course [--course FILE]``: the scheme in force, printed.

One row per exercise (notebook, exercise, status, points, its parts' points), then the
course maximum, the bonus on top of it, the term, the release and the late defaults, and
which file they came from (:mod:`lesson10.scheme`). A bad file exits with status 2 and the
loader's sentence, which names the key and what to write.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import scheme


def uses_optional() -> list[str]:
    """A note per graded exercise that calls the student's own function of an optional one:
    unless the notebook writes that function for a student who skipped it (notebook 04 does
    for ``heads_to_seq``), skipping the practice costs the graded exercise too."""
    from ..checks import EXERCISES
    return [f"note: {ex.id} ({ex.status}) calls the student's {EXERCISES[u].function or u}, which is "
            f"optional: the notebook must write it for a student who skips it, or skipping it "
            f"costs {ex.id}"
            for ex in EXERCISES.values() if not ex.optional
            for u in ex.uses if u in EXERCISES and EXERCISES[u].optional]


def table(found: scheme.Scheme) -> str:
    """The effective scheme as text (the exercises' parts are checked too: an exercise whose
    points do not split over its parts raises :class:`~lesson10.scheme.SchemeError`)."""
    from ..checks import EXERCISES
    rows = [("notebook", "exercise", "status", "points", "parts")]
    for ex in EXERCISES.values():
        parts = ", ".join(f"{name} {p}" for name, p in ex.parts)
        rows.append((ex.notebook, ex.id, ex.status, str(ex.points), parts))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[4] for r in rows]
    bonus = sum(ex.points for ex in EXERCISES.values() if ex.status == "bonus")
    notes = uses_optional()
    if notes:
        lines += ["", *notes]
    late = found.late
    lines += ["", f"maximum: {found.maximum} points" + (f" (bonus on top: {bonus})" if bonus else ""),
              f"term: {found.term} (salts the grader's hidden cases)",
              f"release: {found.repository} at {found.ref}",
              f"late: due {late.due or 'none'}, penalty {late.penalty or 'none'}, cap {late.cap:g}%, "
              f"latest on time {'yes' if late.latest_on_time else 'no'}",
              f"course file: {found.source}" + (" (the package's default)" if found.source == scheme.DEFAULT
                                                else " (over the package's default)")]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m lesson10 course",
        description="Print the course scheme in force (each exercise's status and points, the "
                    "maximum, the term, the release) and the file it came from.")
    p.add_argument("--course", type=Path, default=None, metavar="FILE",
                   help="the course file (default: $LESSON10_COURSE, else the nearest "
                        "course.toml from here up, else the package's default)")
    args = p.parse_args(argv)
    try:
        text = table(scheme.use(args.course))
    except scheme.SchemeError as exc:
        print(f"course: {exc}", file=sys.stderr)
        return 2
    print(text, end="")
    return 0
