"""What goes back to a student: ``--feedback DIR`` writes ``DIR/<student>.md`` and
``DIR/<student>.html`` (for each exercise: its points, the judge's message and the hint),
and :func:`annotate_executed` makes the notebooks of ``--save-executed`` agree with the
grade (a summary cell on top; a note at a check cell whose verdict a later check replaced).
"""
from __future__ import annotations

import html
import re
from pathlib import Path

from . import gradebook
from . import reports as _reports


def _blocks(row: dict, reports: list[dict], *, seed=None, sandboxed=None) -> list[tuple]:
    """The feedback of one student as blocks: ("h1"|"h2"|"h3"|"p"|"pre"|"hint"|"list"|
    "table", payload). Markdown and HTML are both written from these."""
    mine = [r for r in reports if r["student"] == row["student"]]
    out: list[tuple] = [("h1", f"Feedback for {row['student']}"),
                        ("p", f"**Score: {row['points']} / {row['max_points']}**")]
    info = _reports.seed_line(seed, sandboxed)
    if info:
        out.append(("p", info))
    out.append(("table", [["notebook", "exercise", "result", "points"]] +
                [[e["notebook"], e["exercise"], _reports.shown(e), f"{e['points']}/{e['max_points']}"]
                 for e in row["exercises"]]))
    for nid in gradebook.graded_notebooks():
        entries = [e for e in row["exercises"] if e["notebook"] == nid]
        got, top = sum(e["points"] for e in entries), sum(e["max_points"] for e in entries)
        out.append(("h2", f"{nid}: {got} / {top}"))
        path = row["notebooks"].get(nid)
        if path is None:
            out.append(("p", f"Not handed in: no {nid} notebook was found, so each of its "
                             f"exercises counts 0."))
            continue
        out.append(("p", f"Graded file: `{path}`"))
        for e in entries:
            out.append(("h3", f"{e['exercise']}: {_reports.shown(e)} ({e['points']}/{e['max_points']})"))
            body, hints = gradebook.split_message(e["message"])
            if body:
                out.append(("pre", body))
            for h in hints:
                out.append(("hint", h))
    notes = [f"Not graded: {i['path']} (another copy of {i['notebook']}; graded: "
             f"{i['graded']}, chosen as {gradebook.COPY_RULE})." for i in row["ignored"]]
    notes += [f"Not a course notebook (scores nothing): {p}" for p in row["unknown"]]
    notes += [f"Not graded: {f['path']} ({f['reason']})" for f in row.get("not_graded", [])]
    notes += _reports.lateness_lines(row)
    for rep in mine:
        if rep.get("error"):
            notes.append(f"GRADER ERROR in {rep['notebook']}: {rep['error']} (not your score: "
                         f"it will be graded again)")
        notes += [f"{rep['notebook']}: {f}" for f in rep.get("feedback", [])]
    if notes:
        out += [("h2", "Notes"), ("list", notes)]
    return out


def _md_inline(text: str) -> str:
    return str(text).replace("<", "&lt;").replace(">", "&gt;")


def to_markdown(blocks: list[tuple]) -> str:
    lines = []
    for kind, value in blocks:
        if kind in ("h1", "h2", "h3"):
            lines += ["#" * int(kind[1]) + " " + _md_inline(value), ""]
        elif kind == "p":
            lines += [_md_inline(value), ""]
        elif kind == "pre":
            fence = "````" if "```" in value else "```"
            lines += [fence, value, fence, ""]
        elif kind == "hint":
            lines += [f"**Hint:** {_md_inline(value)}", ""]
        elif kind == "list":
            lines += [f"- {_md_inline(v)}" for v in value] + [""]
        elif kind == "table":
            head, *body = value
            lines.append("| " + " | ".join(head) + " |")
            lines.append("|" + "---|" * len(head))
            lines += ["| " + " | ".join(_reports.md_cell(c) for c in r) + " |" for r in body]
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _html_inline(text: str) -> str:
    t = html.escape(str(text))
    t = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", t)
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", t)


_STYLE = ("body{font-family:system-ui,sans-serif;max-width:56rem;margin:2rem auto;padding:0 1rem;"
          "line-height:1.45}table{border-collapse:collapse}td,th{border:1px solid #bbb;"
          "padding:.2rem .5rem;text-align:left}pre{background:#f4f4f4;padding:.6rem;"
          "overflow-x:auto}.hint{border-left:4px solid #3a7;padding-left:.6rem}"
          ".passed{color:#176c2e}.failed,.missing,.crashed{color:#a11}")


def to_html(blocks: list[tuple], title: str) -> str:
    parts = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
             f"<title>{html.escape(title)}</title>", f"<style>{_STYLE}</style>", "</head>",
             "<body>"]
    for kind, value in blocks:
        if kind in ("h1", "h2", "h3"):
            parts.append(f"<{kind}>{_html_inline(value)}</{kind}>")
        elif kind == "p":
            parts.append(f"<p>{_html_inline(value)}</p>")
        elif kind == "pre":
            parts.append(f"<pre>{html.escape(value)}</pre>")
        elif kind == "hint":
            parts.append(f'<p class="hint"><strong>Hint:</strong> {html.escape(value)}</p>')
        elif kind == "list":
            parts.append("<ul>" + "".join(f"<li>{html.escape(v)}</li>" for v in value) + "</ul>")
        elif kind == "table":
            head, *body = value
            parts.append("<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head)
                         + "</tr>")
            for r in body:
                cls = re.sub(r"\W", "-", r[2]) if len(r) > 2 else ""
                parts.append("<tr>" + "".join(
                    f'<td class="{cls}">{html.escape(c)}</td>' if i == 2 else
                    f"<td>{html.escape(c)}</td>" for i, c in enumerate(r)) + "</tr>")
            parts.append("</table>")
    parts += ["</body>", "</html>"]
    return "\n".join(parts) + "\n"


def feedback_files(rows: list[dict], reports: list[dict]) -> dict[str, list]:
    """student -> safe path parts of its files (``sec1/s01`` -> ``["sec1", "s01"]``), unique
    even where two names differ only in characters a file name cannot hold."""
    taken, out = set(), {}
    for row in rows:
        parts = gradebook.safe_parts(row["student"])
        key, n = tuple(parts), 1
        while "/".join(key).lower() in taken:
            n += 1
            key = tuple(parts[:-1]) + (f"{parts[-1]}-{n}",)
        taken.add("/".join(key).lower())
        out[row["student"]] = list(key)
    return out


def write(folder: Path, rows: list[dict], reports: list[dict], *, seed=None,
          sandboxed=None) -> list[Path]:
    """Write ``<student>.md`` and ``<student>.html`` for every row; returns the paths."""
    folder = Path(folder)
    written = []
    names = feedback_files(rows, reports)
    for row in rows:
        blocks = _blocks(row, reports, seed=seed, sandboxed=sandboxed)
        base = folder.joinpath(*names[row["student"]])
        base.parent.mkdir(parents=True, exist_ok=True)
        md, page = base.with_name(base.name + ".md"), base.with_name(base.name + ".html")
        md.write_text(to_markdown(blocks), encoding="utf-8")
        page.write_text(to_html(blocks, f"Feedback for {row['student']}"), encoding="utf-8")
        written += [md, page]
    return written


# --------------------------------------------------------------------------- executed notebooks
def annotate_executed(path: Path, report: dict, *, seed=None) -> None:
    """Make a notebook written by ``--save-executed`` say what the grade says: a first cell
    with the score of each exercise (the grade counts the last judged call of each check),
    and, at a check cell whose printed verdict is not the one that counts, a note saying so."""
    import nbformat
    nb = nbformat.read(str(path), as_version=4)
    final = {e["exercise"]: e for e in report["exercises"]}
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        text = "".join(o.get("text", "") for o in cell.get("outputs", [])
                       if o.get("output_type") == "stream")
        shown = re.findall(r"\[grader\] check_(\w+): ([a-z ]+) \((\d+)/(\d+)\)", text)
        notes = []
        for ex, status, points, _ in shown:
            e = final.get(ex)
            if e is not None and (status != e["status"] or int(points) != e["points"]):
                notes.append(f"[grader] this is not the verdict that counts: check_{ex} was "
                             f"judged again later, and the grade takes the last call: "
                             f"{e['status']} ({e['points']}/{e['max_points']})\n")
        if notes:
            cell.outputs.append(nbformat.v4.new_output("stream", name="stderr",
                                                       text="".join(notes)))
    lines = [f"**Graded by the course's judge: {report['points']} / {report['max_points']}**"
             + (f" (seed {seed})" if seed is not None else ""), "",
             "The outputs below are those of the graded run; each check cell shows the judge's "
             "verdict on its hidden cases.", "", "| exercise | result | points |", "|---|---|---|"]
    lines += [f"| {e['exercise']} | {_reports.shown(e)} | {e['points']}/{e['max_points']} |"
              for e in report["exercises"]]
    cell = nbformat.v4.new_markdown_cell("\n".join(lines))
    cell.metadata["lesson10"] = {"grade": True}
    if nb.get("nbformat_minor", 0) < 5:
        cell.pop("id", None)                        # ids exist from nbformat 4.5 on
    else:                                # the same id each time: the same bytes each time
        taken = {c.get("id") for c in nb.cells}
        cell["id"] = next(f"lesson10-grade{n or ''}" for n in range(len(taken) + 1)
                          if f"lesson10-grade{n or ''}" not in taken)
    nb.cells.insert(0, cell)
    nbformat.write(nb, str(path))
