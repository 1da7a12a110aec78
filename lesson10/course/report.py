"""``python -m lesson10 report RESULTS``: the class report of a graded class.

``RESULTS`` is the grader's results folder (``grade --resume DIR``, or the
``lesson10-results/`` written beside a class's outputs); ``grade ... --report DIR`` writes
the same report after grading. Two files: ``class-report.html``, one page with the plots
embedded as PNG (matplotlib, nothing fetched from the network), and ``class-report.md``,
the same numbers as Markdown tables. They show:

* per exercise, how many students passed it, got part of it, failed it, did not attempt it
  (the function still raises NotImplementedError) or did not hand its notebook in;
* the mistakes the checks recognised (the hint functions of :mod:`lesson10.checks.mistakes`
  and the checks' own diagnoses, by name), how often, with an example message;
* the distribution of the students' totals;
* the students who need attention: most notebooks missing, most exercises lost to errors
  (failed, crashed, timed out), lowest totals.
"""
from __future__ import annotations

import argparse
import base64
import html
import io
import sys
from collections import Counter
from pathlib import Path

#: the columns of the per-exercise table, in order
COLUMNS = ("passed", "partly", "failed", "not attempted", "missing", "other")
#: statuses that count as an error of the student's code (for "needs attention")
ERRORS = {"failed", "crashed", "timed out", "not judged", "check removed"}
HTML_NAME, MD_NAME = "class-report.html", "class-report.md"


def column(e: dict) -> str:
    """Which column of the per-exercise table an exercise's entry counts in."""
    if e["passed"]:
        return "passed"
    if e["points"] > 0:
        return "partly"
    if e["status"] in ("failed", "not attempted", "missing"):
        return e["status"]
    return "other"


def per_exercise(rows: list[dict]) -> dict[str, Counter]:
    """exercise -> Counter of :data:`COLUMNS`, in the course's order."""
    out: dict[str, Counter] = {}
    for row in rows:
        for e in row["exercises"]:
            out.setdefault(e["exercise"], Counter())[column(e)] += 1
    return out


def mistakes(rows: list[dict]) -> list[dict]:
    """The recognised mistakes, most frequent first: ``{"mistake", "exercise", "count",
    "students", "example"}`` (a part's mistake counts too)."""
    found: dict[str, dict] = {}
    for row in rows:
        for e in row["exercises"]:
            verdicts = e.get("parts") or [e]
            for v in verdicts:
                name = v.get("mistake")
                if not name:
                    continue
                m = found.setdefault(name, {"mistake": name, "exercise": e["exercise"],
                                            "count": 0, "students": set(),
                                            "example": v.get("message", "")})
                m["count"] += 1
                m["students"].add(row["student"])
    out = sorted(found.values(), key=lambda m: (-m["count"], m["mistake"]))
    for m in out:
        m["students"] = len(m["students"])
    return out


def attention(rows: list[dict], limit: int = 15) -> list[dict]:
    """The students to look at first: most notebooks missing, then most exercises lost to
    errors, then the lowest total; a student whose grading failed always."""
    scored = []
    for row in rows:
        errors = sum(1 for e in row["exercises"] if e["status"] in ERRORS and not e["passed"])
        why = []
        if not row.get("ok", True):
            why.append("grader error: grade again")
        if row["missing"]:
            why.append(f"{len(row['missing'])} notebooks missing")
        if errors:
            why.append(f"{errors} exercises failed or broken")
        if row.get("not_graded"):
            why.append(f"{len(row['not_graded'])} files not graded")
        if why:
            scored.append(((row.get("ok", True), -len(row["missing"]), -errors, row["points"]),
                           {"student": row["student"], "points": row["points"],
                            "max_points": row["max_points"], "why": "; ".join(why)}))
    return [s for _, s in sorted(scored, key=lambda x: x[0])][:limit]


def totals(rows: list[dict]) -> Counter:
    return Counter(r["points"] for r in rows)


# --------------------------------------------------------------------------- plots
def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def plots(rows: list[dict]) -> dict[str, str]:
    """name -> base64 PNG: the statuses per exercise, the totals, the mistakes."""
    from matplotlib.figure import Figure
    out = {}
    table = per_exercise(rows)
    names = list(table)
    colours = {"passed": "#2a9d5c", "partly": "#9ccc65", "failed": "#d1495b",
               "not attempted": "#f4a259", "missing": "#8d99ae", "other": "#6d597a"}
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
    ax.legend(fontsize=7, ncol=3)
    out["exercises"] = _png(fig)
    fig = Figure(figsize=(6, 3))
    ax = fig.subplots()
    top = max([r["max_points"] for r in rows] + [1])
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
        ax.barh([m["mistake"][:60] for m in found][::-1], [m["count"] for m in found][::-1],
                color="#d1495b")
        ax.set_xlabel("answers")
        ax.set_title("mistakes the checks recognised")
        ax.tick_params(axis="y", labelsize=7)
        out["mistakes"] = _png(fig)
    return out


# --------------------------------------------------------------------------- pages
def _cell(text, limit: int = 300) -> str:
    text = " ".join(("" if text is None else str(text)).split())
    text = text if len(text) <= limit else text[:limit] + " ..."
    return text.replace("|", "\\|").replace("<", "&lt;")


def _tables(rows: list[dict]) -> list[tuple[str, list[str], list[list]]]:
    """(title, header, body) of each table the report shows."""
    table = per_exercise(rows)
    ex = ("per exercise", ["exercise", *COLUMNS],
          [[n, *[table[n][c] for c in COLUMNS]] for n in table])
    mis = ("mistakes the checks recognised", ["mistake", "exercise", "answers", "students",
                                              "example message"],
           [[m["mistake"], m["exercise"], m["count"], m["students"], m["example"]]
            for m in mistakes(rows)])
    counts = totals(rows)
    dist = ("distribution of totals", ["total", "students"],
            [[t, counts[t]] for t in sorted(counts)])
    att = ("students who need attention", ["student", "points", "why"],
           [[a["student"], f"{a['points']}/{a['max_points']}", a["why"]]
            for a in attention(rows)])
    return [ex, mis, dist, att]


def _headline(rows: list[dict], seed) -> str:
    n = len(rows)
    mean = sum(r["points"] for r in rows) / n if n else 0.0
    top = rows[0]["max_points"] if rows else 0
    text = f"{n} students, mean total {mean:.1f} of {top}"
    return text + (f"; seed {seed}" if seed is not None else "")


def markdown(rows: list[dict], seed=None) -> str:
    lines = ["# Class report", "", _headline(rows, seed), ""]
    for title, head, body in _tables(rows):
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
          "img{max-width:100%}")


def page(rows: list[dict], seed=None) -> str:
    """The HTML page: headline, plots (embedded PNG), the tables."""
    pictures = plots(rows)
    parts = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
             "<title>Class report</title>", f"<style>{_STYLE}</style>", "</head>", "<body>",
             "<h1>Class report</h1>", f"<p id=\"headline\">{html.escape(_headline(rows, seed))}</p>"]
    for name, data in pictures.items():
        parts.append(f'<p><img id="plot-{name}" alt="{name}" src="data:image/png;base64,{data}">'
                     f"</p>")
    for title, head, body in _tables(rows):
        parts.append(f"<h2>{html.escape(title[0].upper() + title[1:])}</h2>")
        if not body:
            parts.append("<p>(none)</p>")
            continue
        parts.append("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>")
        for r in body:
            parts.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>")
        parts.append("</table>")
    parts += ["</body>", "</html>"]
    return "\n".join(parts) + "\n"


def write(folder, rows: list[dict], reports: list[dict] | None = None, *, seed=None) -> list[Path]:
    """Write ``class-report.html`` and ``class-report.md`` into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / HTML_NAME).write_text(page(rows, seed), encoding="utf-8")
    (folder / MD_NAME).write_text(markdown(rows, seed), encoding="utf-8")
    return [folder / HTML_NAME, folder / MD_NAME]


def rows_of(results: Path) -> tuple[list[dict], int | None]:
    """The gradebook rows of a results folder, and its seed."""
    from .grade import gradebook, store
    box = store.Store(results)
    doc = box.load_class()
    if doc is None:
        raise ValueError(f"{results} holds no graded class (no class.json): give the results "
                         f"folder of a grading run (grade --resume DIR)")
    reports, the_plan = store.load(doc, box)
    return gradebook.rows(reports, the_plan), doc.get("seed")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lesson10 report",
                                description="Write the class report (HTML with plots, and "
                                            "Markdown) of a graded class's results folder.")
    p.add_argument("results", type=Path, help="the results folder (grade --resume DIR)")
    p.add_argument("--out", type=Path, default=None,
                   help="folder for class-report.html and class-report.md (default: RESULTS)")
    args = p.parse_args(argv)
    try:
        rows, seed = rows_of(args.results)
        written = write(args.out or args.results, rows, seed=seed)
    except (ValueError, OSError) as exc:
        print(f"report: {exc}", file=sys.stderr)
        return 2
    print("wrote " + " and ".join(str(w) for w in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
