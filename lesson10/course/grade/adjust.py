"""The instructor's adjustments of a graded class, applied to the gradebook rows before any
output is written: the overrides (:mod:`.overrides`) first, then the late policy
(:mod:`.late`). Every output (the table, CSV, JSON's ``students``, feedback, Markdown,
JUnit, Gradescope, Classroom, the class report, the LMS exports) is written from the rows,
so each shows the same points, the override's reason and the lateness; the notebook
reports (the JSON's ``notebooks``) keep the judge's verdicts.

``grade`` keeps what it was given in the results folder (``DIR/adjustments.json``: the
overrides, the policy, the hand-in times of the files graded, where the feedback and the
executed notebooks went), so ``report DIR`` and ``grade --resume DIR`` with no notebooks
write the same points. An option given again replaces what is kept.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import late, overrides

FILE_NAME = "adjustments.json"


@dataclass
class Adjustments:
    overrides: list = field(default_factory=list)
    policy: late.Policy | None = None
    #: path of a graded file -> its modification time when it was graded
    times: dict = field(default_factory=dict)
    #: path of a graded file -> the hand-in it came in (:mod:`.identity`), or None
    handins: dict = field(default_factory=dict)
    #: "feedback" / "executed" -> the folders the grade wrote them to (for the report's links)
    folders: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"overrides": [{k: o[k] for k in overrides.COLUMNS} for o in self.overrides],
                "policy": self.policy.as_dict() if self.policy is not None else None,
                "times": dict(self.times), "handins": dict(self.handins),
                "folders": dict(self.folders)}

    @classmethod
    def from_dict(cls, doc: dict) -> Adjustments:
        pol = doc.get("policy")
        return cls(overrides=list(doc.get("overrides") or []),
                   policy=late.Policy.from_dict(pol) if pol else None,
                   times=dict(doc.get("times") or {}), handins=dict(doc.get("handins") or {}),
                   folders=dict(doc.get("folders") or {}))

    def summary(self) -> dict:
        """What the JSON report says of them."""
        return {"overrides": [{k: o[k] for k in overrides.COLUMNS} for o in self.overrides],
                "late_policy": self.policy.describe() if self.policy is not None else None}


def load(folder) -> Adjustments | None:
    """What a results folder keeps, or None."""
    try:
        doc = json.loads((Path(folder) / FILE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return Adjustments.from_dict(doc) if isinstance(doc, dict) else None


def save(folder, adj: Adjustments) -> None:
    path = Path(folder) / FILE_NAME
    tmp = path.with_name("." + FILE_NAME + ".tmp")
    tmp.write_text(json.dumps(adj.as_dict(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def from_args(args, kept: Adjustments | None = None) -> Adjustments:
    """The adjustments of ``grade``'s options, on top of those a results folder keeps
    (raises :class:`overrides.OverrideError` / :class:`late.LateError`)."""
    out = Adjustments() if kept is None else Adjustments.from_dict(kept.as_dict())
    if getattr(args, "overrides", None) is not None:
        out.overrides = overrides.read(args.overrides)
    exts: dict = {}
    if getattr(args, "roster", None) is not None and getattr(args, "due", None) is not None:
        exts.update(late.read_extensions(args.roster, column_required=False))
    if getattr(args, "extensions", None) is not None:
        exts.update(late.read_extensions(args.extensions))
    pol = late.policy(getattr(args, "due", None), getattr(args, "late_penalty", None),
                      getattr(args, "late_cap", None), bool(getattr(args, "latest_on_time", False)),
                      exts, getattr(args, "time_from", None))
    if pol is not None:
        out.policy = pol
    for key, name in (("feedback", "feedback"), ("executed", "save_executed")):
        if getattr(args, name, None) is not None:
            out.folders[key] = str(Path(getattr(args, name)).resolve())
    return out


def note_times(adj: Adjustments, paths, handins: dict | None = None) -> None:
    """Keep the modification time of each of ``paths`` (the files of this batch; one from a
    zip has the zip's) and the hand-in it came in (``handins``: the plan's)."""
    for p in paths:
        t = late.time_of(str(p), {})
        if t is not None:
            adj.times[str(p)] = t
        adj.handins[str(p)] = None if handins is None or handins.get(p) is None \
            else str(handins[p])


def apply(rows: list[dict], adj: Adjustments | None) -> list[dict]:
    """The rows with the overrides and the late policy applied (in place; returned). A
    warning (an override of a student not in the class) goes to stderr."""
    if adj is None:
        return rows
    for line in overrides.apply(rows, adj.overrides):
        print(f"grade: warning: {line}", file=sys.stderr)
    late.apply(rows, adj.policy, adj.times, adj.handins)
    return rows


def describe(row: dict) -> str:
    """A row's adjustments in one line (the CSV's ``adjustments`` column, the tables): the
    notes of its identity first (:mod:`.identity`: a collision), then the overrides and the
    lateness."""
    parts = [f"{e['exercise']}: override {e['override']['points']}/{e['max_points']} "
             f"(judged {e['override']['judged_points']}): {e['override']['reason']}"
             for e in row["exercises"] if "override" in e]
    lateness = late.describe_row(row)
    return "; ".join(list(row.get("notes", [])) + parts
                     + ([f"late {lateness}"] if lateness else []))
