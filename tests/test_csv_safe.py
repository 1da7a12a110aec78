"""Every CSV the grader writes is safe to open in a spreadsheet: a text cell that begins
like a formula (``=``, ``+``, ``-``, ``@``, a tab, a carriage return) gets OWASP's single
quote in front, numbers stay numbers, and every CSV is written by one function
(``reports.csv_text``), which a scan of the package's source holds to."""
import ast
import csv
import io
import re
from pathlib import Path

import pytest
from adjusted_class import DUE, DUE_EPOCH, args, entry, put, report, write_all

from lesson10.course.grade import gradebook, lms, reports

ROOT = Path(__file__).resolve().parents[1]
RING = "02_ring_attention"
EVIL = ['=HYPERLINK("http://x","y")', "+cmd", "@SUM(1)", "-2+3", "\tx", "\rx", " =1+1",
        "x;=cmd", 'x; "@SUM(1)', "x\n-2+3", "x\t+cmd"]


def _would_run(cell: str) -> bool:
    """Whether a spreadsheet would read ``cell`` as a formula (a plain number is data)."""
    text = cell.lstrip(' \n"')
    if not text.startswith(reports.FORMULA_START):
        return False
    try:
        float(cell)
        return False
    except ValueError:
        return True


def _fields(text: str) -> list[str]:
    """Every cell a spreadsheet may see in the CSV ``text``: read as comma-separated
    (quotes honoured), and split at every semicolon, tab and line break (a locale whose
    separator is ``;``, an import dialog with tabs, quotes ignored mid-line)."""
    return [c for row in csv.reader(io.StringIO(text, newline="")) for c in row] + \
        re.split(r"[;\t\r\n]", text)


def _cells(path: Path) -> list[str]:
    text = path.read_bytes().decode("utf-8")               # a CR in a cell kept as it is
    return [c for row in csv.reader(io.StringIO(text, newline="")) for c in row]


@pytest.mark.parametrize("value, cell", [
    ('=HYPERLINK("http://x","y")', '\'=HYPERLINK("http://x","y")'), ("+cmd", "'+cmd"),
    ("@SUM(1)", "'@SUM(1)"), ("-2+3", "'-2+3"), ("\tx", "'\tx"), ("\rx", "'\rx"),
    (" \n=1", " \n'=1"), ("alice", "alice"), ("a=b", "a=b"), ("", ""), (None, ""),
    (-1.5, -1.5), (-3, -3), ("-1.5", "-1.5"), ("+2", "+2"), ("-", "'-"),
    ("x;=cmd", "x;'=cmd"), ('x; "@a', 'x; "\'@a'), ("a\n-1", "a\n'-1"), ("a\t\t=1", "a\t'\t'=1"),
    ("-50% = -2; 03: 1 h late, -25%", "'-50% = -2; 03: 1 h late, -25%"),
])
def test_a_cell_is_neutralised_only_where_it_begins_like_a_formula(value, cell):
    got = reports.csv_cell(value)
    assert got == cell and type(got) is type(cell)


def test_the_check_of_these_tests_finds_a_cell_a_spreadsheet_would_run():
    for name in EVIL:
        raw = io.StringIO()
        csv.writer(raw, lineterminator="\n").writerow(["a", name, 3, -1.5])
        assert _would_run(name) and "\r" in name or \
            [c for c in _fields(raw.getvalue()) if _would_run(c)], name
        safe = reports.csv_text([["a", name, 3, -1.5]])
        assert not [c for c in _fields(safe) if _would_run(c)] and "-1.5" in _fields(safe), name


def _evil_class(tmp_path):
    """A class whose student folders, roster names, emails, ids and override reasons
    each begin like a formula; every output asked for, the LMS exports included. The
    students are the plan's (``=HYPERLINK("http://x","y")`` is three folders)."""
    paths = [put(tmp_path / "subs" / name / f"{RING}.ipynb", RING,
                 DUE_EPOCH + 3600 if i % 2 else DUE_EPOCH - 60) for i, name in enumerate(EVIL)]
    students = [it.student for it in gradebook.plan(paths, {p: p.read_bytes() for p in paths}).graded]
    reps = [report(p, who, RING, [entry("block_attention"),
                                  entry("merge", "failed", 0, message="=1+1"),
                                  entry("ring_attention")]) for p, who in zip(paths, students)]
    roster = ["student,name,sis_id,email,section,canvas_id"]
    for i, who in enumerate(students):
        cell = who.replace('"', '""')
        roster.append(f'"{cell}","{cell}","-{i}+1","@{i}.example","=S{i}","+C{i}"')
    (tmp_path / "roster.csv").write_text("\n".join(roster) + "\n", encoding="utf-8")
    (tmp_path / "o.csv").write_text('student,exercise,points,reason\n"+cmd",merge,1,"=evil()"\n',
                                    encoding="utf-8")
    a = args(tmp_path / "out", roster=tmp_path / "roster.csv", export=["canvas", "moodle"],
             overrides=tmp_path / "o.csv", due=DUE, late_penalty="50/day",
             assignment="-hw10")
    rows, _ = write_all(a, paths, reps, roster=students)
    return students, rows, tmp_path / "out"


def test_no_cell_of_any_csv_output_would_run_in_a_spreadsheet(tmp_path):
    students, rows, out = _evil_class(tmp_path)
    assert sorted(r["student"] for r in rows) == sorted(students) and len(students) == len(EVIL)
    written = sorted(out.rglob("*.csv"))
    assert {p.name for p in written} == {"grades.csv", *lms.FILE_NAMES.values()}
    for path in written:
        fields = _fields(path.read_bytes().decode("utf-8"))
        assert not [c for c in fields if _would_run(c)], path.name
    grades = _cells(out / "grades.csv")
    assert {reports.csv_cell(n) for n in students} <= set(grades)    # every row is there
    assert any("=evil()" in c for c in grades)
    canvas = _cells(out / "lms" / "canvas-grades.csv")
    assert "'-hw10" in canvas and "'-0+1" in canvas and "'+C0" in canvas and "'=S0" in canvas
    assert "'@0.example" in _cells(out / "lms" / "moodle-grades.csv")


# --------------------------------------------------------------------------- one writer
WRITERS = {"writer", "DictWriter", "writerow", "writerows", "to_csv"}


def csv_writers(source: str) -> list[int]:
    """The lines of ``source`` that make or use a CSV writer (``csv.writer``, ``DictWriter``,
    ``writerow(s)``, pandas' ``to_csv``, under any alias or ``from csv import ...``)."""
    def writes(node) -> bool:
        if isinstance(node, ast.ImportFrom) and node.module == "csv":
            return any(a.name in WRITERS or a.name == "*" for a in node.names)
        return isinstance(node, ast.Attribute) and node.attr in WRITERS

    return [node.lineno for node in ast.walk(ast.parse(source)) if writes(node)]


def test_the_scan_finds_a_writer_however_it_is_spelled():
    for source in ("import csv\ncsv.writer(f).writerow([1])\n", "import csv as c\nw = c.DictWriter(f, [])\n",
                   "from csv import writer\n", "df.to_csv('x.csv')\n", "w.writerows(rows)\n"):
        assert csv_writers(source), source
    assert not csv_writers("import csv\nrows = list(csv.reader(f))\n")


def test_every_csv_the_package_writes_goes_through_the_one_safe_writer():
    sites = []
    for path in sorted((ROOT / "lesson10").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        sites += [(str(path.relative_to(ROOT)), line) for line in csv_writers(text)]
    tree = ast.parse((ROOT / "lesson10/course/grade/reports.py").read_text(encoding="utf-8"))
    body = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "csv_text")
    inside = {n.lineno for n in ast.walk(body) if hasattr(n, "lineno")}
    others = [(p, n) for p, n in sites
              if not (p == "lesson10/course/grade/reports.py" and n in inside)]
    assert sites and not others, f"a CSV written without reports.csv_text: {others}"
