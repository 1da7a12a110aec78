"""``python -m lesson10 report RESULTS``: the class report of a graded class.

``RESULTS`` is the grader's results folder (``grade --resume DIR``, or the
``lesson10-results/`` written beside a class's outputs); ``grade ... --report DIR`` writes
the same report after grading. Two files: ``class-report.html``, one page with the plots
embedded as PNG (matplotlib, nothing fetched from the network), and ``class-report.md``,
the same numbers as Markdown tables. They show:

* per exercise, how many students passed it, got part of it, failed it, did not attempt it
  (the function still raises NotImplementedError) or did not hand its notebook in;
* the mistakes the checks recognised, one row per mistake by its name (the hint's first
  clause; the hint function of :mod:`lesson10.checks.mistakes` that recognised it is a
  column, so two mistakes of one function are two rows), how often, with an example message
  that keeps its lines;
* the distribution of the students' totals;
* every student who needs attention, with their count: a notebook missing, a total at or
  below a threshold (``--attention-at``, default half the maximum), a grader error;
* a table of every student: points, notebooks missing, overrides and lateness, similarity
  flags, and links to their feedback page and executed notebooks;
* the similarity flags (:mod:`lesson10.course.grade.similarity`), for a person to look at.

The points are those of the rows after the instructor's adjustments (overrides, the late
policy: :mod:`lesson10.course.grade.adjust`), which the results folder keeps.
"""
from __future__ import annotations

import argparse
import base64
import html
import io
import os
import re
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..checks.verdict import Status
from .grade.results import Entry, PartEntry, StudentRow

#: what the report's functions take: gradebook rows, typed or as their JSON dicts
Rows = Sequence[StudentRow | Mapping[str, Any]]

#: the statuses with a column of their own in the per-exercise table (the rest: "other")
OWN_COLUMN = (Status.FAILED, Status.NOT_ATTEMPTED, Status.MISSING)
#: optional practice not passed: never "failed" (the course file's status, :mod:`lesson10.scheme`)
OPTIONAL_COLUMN = "optional: not passed"
#: the columns of the per-exercise table, in order
COLUMNS = ("passed", "partly", *(s.value for s in OWN_COLUMN), "other", OPTIONAL_COLUMN)
HTML_NAME, MD_NAME = "class-report.html", "class-report.md"


def typed(rows: Rows) -> list[StudentRow]:
    """The rows as records (:class:`StudentRow`): the report reads attributes only."""
    return [StudentRow.of(r) for r in rows]


def column(e: Entry | Mapping[str, Any]) -> str:
    """Which column of the per-exercise table an exercise's entry counts in."""
    e = Entry.of(e)
    if e.passed:
        return "passed"
    if _optional(e.exercise):
        return OPTIONAL_COLUMN
    if e.points > 0:
        return "partly"
    return e.status.value if e.status in OWN_COLUMN else "other"


def _optional(exercise: str) -> bool:
    from ..checks import EXERCISES
    ex = EXERCISES.get(exercise)
    return ex is not None and ex.optional


def per_exercise(rows: Rows) -> dict[str, Counter]:
    """exercise -> Counter of :data:`COLUMNS`, in the course's order."""
    out: dict[str, Counter] = {}
    for row in typed(rows):
        for e in row.exercises:
            out.setdefault(e.exercise, Counter())[column(e)] += 1
    return out


def mistake_label(message: str) -> str:
    """A mistake's name: the first clause of the hint the check gave ("you averaged the two
    outputs"), its numbers kept out of the name's identity (:func:`mistake_key`)."""
    from .grade.gradebook import split_message
    _, hints = split_message(message)
    text = hints[0] if hints else ""
    head = re.split(r":\s|;\s|\.\s", text, maxsplit=1)[0].strip()
    return head if len(head) <= 90 else head[:87] + "..."


def mistake_key(label: str) -> str:
    return re.sub(r"\d+(\.\d+)?", "#", label.lower())


def mistakes(rows: Rows) -> list[dict]:
    """The recognised mistakes, one per name, most frequent first: ``{"mistake" (its name),
    "hint" (the check's function that recognised it), "exercise", "count", "students",
    "example"}``. Two mistakes one hint function recognises ("averaged the outputs",
    "swapped the weights") are two rows, each with its own example (a part's counts too)."""
    found: dict[tuple, dict] = {}
    for row in typed(rows):
        for e in row.exercises:
            verdicts: Sequence[Entry | PartEntry] = e.parts or e.judged_parts or [e]
            for v in verdicts:
                if not v.mistake:
                    continue
                label = mistake_label(v.message) or v.mistake
                m = found.setdefault((e.exercise, v.mistake, mistake_key(label)), {
                    "mistake": label, "hint": v.mistake, "exercise": e.exercise, "count": 0,
                    "students": set(), "example": v.message})
                m["count"] += 1
                m["students"].add(row.student)
    out = sorted(found.values(), key=lambda m: (-m["count"], m["exercise"], m["mistake"]))
    for m in out:
        m["students"] = len(m["students"])
    return out


def threshold_of(rows: Rows, at: int | None = None) -> int:
    """The "needs attention" threshold: ``at``, else half the course's maximum."""
    top = StudentRow.of(rows[0]).max_points if rows else 0
    return top // 2 if at is None else at


def attention(rows: Rows, at: int | None = None) -> list[dict]:
    """Every student to look at, none left out: a grader error, a notebook missing, or a
    total at or below the threshold (:func:`threshold_of`); most notebooks missing first,
    then most exercises lost to errors, then the lowest total."""
    limit = threshold_of(rows, at)
    scored = []
    for row in typed(rows):
        errors = sum(1 for e in row.exercises
                     if e.status.against_student and not e.passed and not _optional(e.exercise))
        why = []
        if not row.ok:
            why.append("grader error: grade again")
        if row.missing:
            why.append(f"{len(row.missing)} notebooks missing")
        if row.points <= limit:
            why.append(f"at or below {limit} points")
        if errors:
            why.append(f"{errors} exercises failed or broken")
        if row.not_graded:
            why.append(f"{len(row.not_graded)} files not graded")
        if not row.ok or row.missing or row.points <= limit:
            scored.append(((row.ok, -len(row.missing), -errors, row.points),
                           {"student": row.student, "points": row.points,
                            "max_points": row.max_points, "why": "; ".join(why)}))
    return [s for _, s in sorted(scored, key=lambda x: x[0])]


def totals(rows: Rows) -> Counter:
    return Counter(r.points for r in typed(rows))


# --------------------------------------------------------------------------- plots
def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def exercise_figure(rows: Rows):
    """The statuses per exercise as stacked bars, the legend beside the axes (never over a
    bar; ``bbox_inches="tight"`` keeps it in the picture)."""
    from matplotlib.figure import Figure
    table = per_exercise(rows)
    names = list(table)
    colours = {"passed": "#2a9d5c", "partly": "#9ccc65", "failed": "#d1495b",
               "not attempted": "#f4a259", "missing": "#8d99ae", "other": "#6d597a",
               OPTIONAL_COLUMN: "#cfd8dc"}
    fig = Figure(figsize=(9, 3.6))
    ax = fig.subplots()
    bottom = [0] * len(names)
    for col in COLUMNS:
        values = [table[n][col] for n in names]
        ax.bar(names, values, bottom=bottom, label=col, color=colours[col])
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel("students")
    ax.set_title("each exercise: how the class did")
    ax.tick_params(axis="x", rotation=60, labelsize=8)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return fig


def plots(rows: Rows) -> dict[str, str]:
    """name -> base64 PNG: the statuses per exercise, the totals, the mistakes."""
    from matplotlib.figure import Figure
    rows = typed(rows)
    out = {"exercises": _png(exercise_figure(rows))}
    fig = Figure(figsize=(6, 3))
    ax = fig.subplots()
    top = max([r.max_points for r in rows] + [1])
    counts = totals(rows)
    ax.bar(range(top + 1), [counts.get(t, 0) for t in range(top + 1)], color="#3a6ea5")
    ax.set_xlabel(f"total points (of {top})")
    ax.set_ylabel("students")
    ax.set_title("distribution of totals")
    out["totals"] = _png(fig)
    found = mistakes(rows)[:12]
    if found:
        fig = Figure(figsize=(7, 0.4 * len(found) + 1))
        ax = fig.subplots()
        ax.barh([f"{m['exercise']}: {m['mistake'][:50]}" for m in found][::-1], [m["count"] for m in found][::-1],
                color="#d1495b")
        ax.set_xlabel("answers")
        ax.set_title("mistakes the checks recognised")
        ax.tick_params(axis="y", labelsize=7)
        out["mistakes"] = _png(fig)
    return out


# --------------------------------------------------------------------------- pages
class Msg(str):
    """A table cell that keeps its line breaks (an example message)."""


class Links(tuple):
    """A table cell of ``(label, href)`` links (the HTML page's; the Markdown shows labels)."""


def _cell(text, limit: int = 300) -> str:
    if isinstance(text, Links):
        return ", ".join(label for label, _ in text) or "-"
    if isinstance(text, Msg):
        lines = [" ".join(line.split()) for line in str(text).splitlines()]
        text = "<br>".join(line for line in lines if line)
        limit *= 2
    else:
        text = " ".join(("" if text is None else str(text)).split())
    text = text if len(text) <= limit else text[:limit] + " ..."
    text = text.replace("|", "\\|").replace("<", "&lt;")
    return text.replace("&lt;br>", "<br>")


def student_table(rows: Rows, links: dict | None = None, flags: dict | None = None):
    """(title, header, body) of the per-student table: points, lateness, overrides,
    notebooks missing, similarity flags, and links to the feedback and executed notebooks."""
    from .grade import adjust
    flagged: Counter = Counter(f["student"] for f in (flags or {}).get("source", []))
    for p in (flags or {}).get("pairs", []):
        flagged.update(p["students"])
    body = []
    for r in typed(rows):
        body.append([r.student, f"{r.points}/{r.max_points}",
                     " ".join(r.missing) or "-", adjust.describe(r.to_json()) or "-",
                     flagged.get(r.student, 0), Links((links or {}).get(r.student, ()))])
    return ("every student", ["student", "points", "missing", "overrides and lateness",
                              "similarity flags", "feedback and executed notebooks"], body)


def similarity_table(flags: dict | None):
    """(title, header, body) of the similarity flags (for a person; no point changed)."""
    body = [[f["student"], f["exercise"], f"the package's {f['matches']}", f["what"]]
            for f in (flags or {}).get("source", [])]
    body += [[" and ".join(p["students"]), p["exercise"], "each other",
              "the same answer, names aside"] for p in (flags or {}).get("pairs", [])]
    return ("similarity flags (for a person to look at: no point is changed)",
            ["students", "exercise", "matches", "what"], body)


def _tables(rows: Rows, *, at=None, links=None, flags=None) -> list[tuple]:
    """(title, header, body) of each table the report shows."""
    rows = typed(rows)
    table = per_exercise(rows)
    ex = ("per exercise", ["exercise", *COLUMNS],
          [[n, *[table[n][c] for c in COLUMNS]] for n in table])
    mis = ("mistakes the checks recognised", ["mistake", "exercise", "answers", "students",
                                              "recognised by", "example message"],
           [[m["mistake"], m["exercise"], m["count"], m["students"], m["hint"],
             Msg(m["example"])] for m in mistakes(rows)])
    counts = totals(rows)
    dist = ("distribution of totals", ["total", "students"],
            [[t, counts[t]] for t in sorted(counts)])
    who = attention(rows, at)
    att = (f"students who need attention ({len(who)}: a notebook missing, or at or below "
           f"{threshold_of(rows, at)} points)", ["student", "points", "why"],
           [[a["student"], f"{a['points']}/{a['max_points']}", a["why"]] for a in who])
    out = [ex, mis, dist, att, student_table(rows, links, flags)]
    return out + ([similarity_table(flags)] if flags is not None else [])


def _headline(rows: Sequence[StudentRow], seed) -> str:
    n = len(rows)
    mean = sum(r.points for r in rows) / n if n else 0.0
    top = rows[0].max_points if rows else 0
    text = f"{n} students, mean total {mean:.1f} of {top}"
    return text + (f"; seed {seed}" if seed is not None else "")


def _notes(rows: Sequence[StudentRow]) -> list[str]:
    """What changed the judge's points: overrides and the late policy."""
    n_over = sum(1 for r in rows for e in r.exercises if e.override is not None)
    n_late = sum(len(r.late or []) for r in rows)
    out = [f"Exercises overridden by the instructor: {n_over} (the reasons are in the table of "
           f"every student)"] if n_over else []
    if any(r.due is not None or "due" in r.order for r in rows):
        out.append(f"Notebooks handed in late: {n_late}")
    return out


def markdown(rows: Rows, seed=None, *, at=None, flags=None) -> str:
    rows = typed(rows)
    lines = ["# Class report", "", _headline(rows, seed), ""] + \
        [f"- {n}" for n in _notes(rows)] + [""]
    for title, head, body in _tables(rows, at=at, flags=flags):
        lines += [f"## {title[0].upper() + title[1:]}", ""]
        if not body:
            lines += ["(none)", ""]
            continue
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in body]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


_STYLE = ("body{font-family:system-ui,sans-serif;max-width:64rem;margin:2rem auto;padding:0 1rem;"
          "line-height:1.4}table{border-collapse:collapse;margin-bottom:1rem}td,th{border:1px "
          "solid #bbb;padding:.2rem .5rem;text-align:left;vertical-align:top;font-size:.9rem}"
          "td.msg{white-space:pre-wrap;font-family:ui-monospace,monospace;font-size:.8rem}"
          "img{max-width:100%;height:auto}.wide{overflow-x:auto}")


def _html_cell(c) -> str:
    if isinstance(c, Links):
        inner = " ".join(f'<a href="{html.escape(href)}">{html.escape(label)}</a>'
                         for label, href in c)
        return f"<td>{inner or '-'}</td>"
    if isinstance(c, Msg):
        return f'<td class="msg">{html.escape(str(c).strip())}</td>'
    return f"<td>{html.escape(str(c))}</td>"


def page(rows: Rows, seed=None, *, at=None, links=None, flags=None) -> str:
    """The HTML page: headline, plots (embedded PNG), the tables."""
    rows = typed(rows)
    pictures = plots(rows)
    parts = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             "<title>Class report</title>", f"<style>{_STYLE}</style>", "</head>", "<body>",
             "<h1>Class report</h1>", f"<p id=\"headline\">{html.escape(_headline(rows, seed))}</p>"]
    parts += [f"<p>{html.escape(n)}</p>" for n in _notes(rows)]
    for name, data in pictures.items():
        parts.append(f'<p><img id="plot-{name}" alt="{name}" src="data:image/png;base64,{data}">'
                     f"</p>")
    for title, head, body in _tables(rows, at=at, links=links, flags=flags):
        parts.append(f"<h2>{html.escape(title[0].upper() + title[1:])}</h2>")
        if not body:
            parts.append("<p>(none)</p>")
            continue
        parts.append('<div class="wide"><table><tr>'
                     + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>")
        parts += ["<tr>" + "".join(_html_cell(c) for c in r) + "</tr>" for r in body]
        parts.append("</table></div>")
    parts += ["</body>", "</html>"]
    return "\n".join(parts) + "\n"


def links_of(folder: Path, rows: Rows, reports, folders: dict) -> dict:
    """student -> ``[(label, href)]``: their feedback page and executed notebooks, as links
    relative to ``folder`` (those that exist)."""
    from .grade import feedback
    from .grade.notebook import executed_path
    out: dict = {}
    rows = typed(rows)
    names = feedback.feedback_files([r.to_json() for r in rows], reports or [])
    for r in rows:
        found = []
        if folders.get("feedback"):
            page_file = Path(folders["feedback"]).joinpath(*names[r.student])
            page_file = page_file.with_name(page_file.name + ".html")
            if page_file.is_file():
                found.append(("feedback", os.path.relpath(page_file, folder)))
        if folders.get("executed"):
            for nid in r.notebooks:
                target = executed_path(folders["executed"], r.student, nid)
                if target.is_file():
                    found.append((nid[:2], os.path.relpath(target, folder)))
        out[r.student] = found
    return out


def write(folder, rows: Rows, reports: list[dict] | None = None, *, seed=None,
          at=None, flags=None, folders=None) -> list[Path]:
    """Write ``class-report.html`` and ``class-report.md`` into ``folder``; ``flags``: the
    similarity flags (computed from the rows when None); ``folders``: ``{"feedback",
    "executed"}`` where the per-student table's links point."""
    from .grade import similarity
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rows = typed(rows)
    flags = similarity.flags([r.to_json() for r in rows]) if flags is None else flags
    links = links_of(folder.resolve(), rows, reports, folders or {})
    (folder / HTML_NAME).write_text(page(rows, seed, at=at, links=links, flags=flags),
                                    encoding="utf-8")
    (folder / MD_NAME).write_text(markdown(rows, seed, at=at, flags=flags), encoding="utf-8")
    return [folder / HTML_NAME, folder / MD_NAME]


def rows_of(results: Path, overrides_file: Path | None = None):
    """``(rows, seed, reports, folders)`` of a results folder: the gradebook rows with the
    adjustments the folder keeps applied (``overrides_file`` replaces its overrides), the
    seed, the reports, and where the feedback and executed notebooks went."""
    from .grade import adjust, gradebook, overrides, store
    box = store.Store(results)
    doc = box.load_class()
    if doc is None:
        raise ValueError(f"{results} holds no graded class (no class.json): give the results "
                         f"folder of a grading run (grade --resume DIR)")
    reports, the_plan = store.load(doc, box)
    adj = adjust.load(results) or adjust.Adjustments()
    if overrides_file is not None:
        adj.overrides = overrides.read(overrides_file)
    rows = adjust.apply(gradebook.rows(reports, the_plan), adj)
    return rows, doc.get("seed"), reports, adj.folders


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lesson10 report",
                                description="Write the class report (HTML with plots, and "
                                            "Markdown) of a graded class's results folder.")
    p.add_argument("results", type=Path, help="the results folder (grade --resume DIR)")
    p.add_argument("--out", type=Path, default=None,
                   help="folder for class-report.html and class-report.md (default: RESULTS)")
    p.add_argument("--overrides", type=Path, default=None, metavar="FILE",
                   help="overrides.csv (student,exercise,points,reason) applied instead of "
                        "the ones the results folder keeps")
    p.add_argument("--attention-at", type=int, default=None, metavar="POINTS",
                   help="list every student at or below POINTS under 'needs attention' "
                        "(default: half the course's maximum)")
    args = p.parse_args(argv)
    try:
        rows, seed, reports, folders = rows_of(args.results, args.overrides)
        written = write(args.out or args.results, rows, reports, seed=seed,
                        at=args.attention_at, folders=folders)
    except (ValueError, OSError) as exc:
        print(f"report: {exc}", file=sys.stderr)
        return 2
    print("wrote " + " and ".join(str(w) for w in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
