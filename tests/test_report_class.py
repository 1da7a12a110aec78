"""The class report an instructor reads first: a row per mistake by name with its own
example, every student who needs attention, a table of every student with links, a legend
beside the bars, messages that keep their lines."""
from pathlib import Path

from adjusted_class import DUE_EPOCH, args, entry, put, report, write_all

from lesson10.checks.exercises import maximum
from lesson10.course import report as class_report
from lesson10.course.grade.notebook import executed_path

RING = "02_ring_attention"
AVERAGED = ("check_merge failed: case 2: o differs\n  yours : 0.5\n  target: 0.7\n"
            "hint: you averaged the two outputs: each side's weight is its share, exp(lse_i - lse)")
SWAPPED = ("check_merge failed: case 1: o differs\n"
           "hint: each weight multiplies the other side's output: exp(lse1 - lse) belongs to o1")


#: the course maximum in the course file in force
MAX = maximum()


def _row(student, points_lost=0, missing=(), mistakes=()):
    exercises = [{"exercise": f"e{i}", "notebook": RING, "status": "failed", "passed": False,
                  "points": 0, "max_points": 1, "message": m, "mistake": "merge_mistake"}
                 for i, m in enumerate(mistakes)]
    return {"student": student, "points": MAX - points_lost, "max_points": MAX,
            "exercises": exercises, "missing": list(missing), "notebooks": {}, "ok": True}


def test_two_mistakes_of_one_hint_function_are_two_rows_each_with_its_example():
    rows = [_row(f"s{i}", mistakes=[AVERAGED.replace("0.5", str(i))]) for i in range(4)]
    rows.append(_row("odd", mistakes=[SWAPPED]))
    found = class_report.mistakes(rows)
    assert [(m["mistake"], m["count"], m["hint"]) for m in found] == [
        ("you averaged the two outputs", 4, "merge_mistake"),
        ("each weight multiplies the other side's output", 1, "merge_mistake")]
    assert "averaged" in found[0]["example"] and "other side" in found[1]["example"]


def test_needs_attention_lists_everyone_at_or_below_the_threshold_and_everyone_missing():
    rows = [_row(f"blank{i:02d}", points_lost=MAX) for i in range(20)]
    rows += [_row("gone", missing=["05_moe_dispatch"]), _row("fine"), _row("edge", MAX - MAX // 2)]
    who = class_report.attention(rows)
    assert len(who) == 22 and {w["student"] for w in who} >= {"gone", "edge", "blank19"}
    assert "fine" not in {w["student"] for w in who}
    assert [w["student"] for w in class_report.attention(rows, at=0)].count("edge") == 0
    md = class_report.markdown(rows)
    assert f"## Students who need attention (22: a notebook missing, or at or below {MAX // 2}" in md


def test_the_legend_sits_beside_the_bars():
    rows = [_row("a"), _row("b", mistakes=[AVERAGED])]
    fig = class_report.exercise_figure(rows)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent(canvas.get_renderer())
    frame = ax.get_window_extent(canvas.get_renderer())
    assert legend.x0 >= frame.x1                         # wholly right of the axes
    bars = [p.get_window_extent(canvas.get_renderer()) for p in ax.patches]
    assert bars and not any(legend.overlaps(b) for b in bars)


def test_messages_keep_their_lines_and_stay_escaped():
    rows = [_row("a", mistakes=[AVERAGED + "\n<script>x</script>"])]
    page = class_report.page(rows)
    assert '<td class="msg">check_merge failed: case 2: o differs\n  yours : 0.5' in page
    assert "<script>x" not in page and "&lt;script&gt;" in page
    md = class_report.markdown(rows)
    assert "o differs<br>yours : 0.5<br>target: 0.7" in md


def test_every_student_has_a_row_with_links_to_feedback_and_executed_notebook(tmp_path):
    a = put(tmp_path / "subs" / "ann" / f"{RING}.ipynb", RING, DUE_EPOCH)
    b = put(tmp_path / "subs" / "ben" / f"{RING}.ipynb", RING, DUE_EPOCH)
    executed = tmp_path / "out" / "executed"
    done = executed_path(executed, "ann", RING)
    done.parent.mkdir(parents=True)
    done.write_text("{}")
    reps = [report(p, who, RING, [entry("block_attention"), entry("merge"),
                                  entry("ring_attention")]) for p, who in ((a, "ann"), (b, "ben"))]
    write_all(args(tmp_path / "out", save_executed=executed), [a, b], reps)
    page = (tmp_path / "out" / "report" / class_report.HTML_NAME).read_text()
    assert "<h2>Every student</h2>" in page
    assert '<a href="../feedback/ann.html">feedback</a>' in page
    assert '<a href="../executed/ann/02_ring_attention.ipynb">02</a>' in page
    assert '<a href="../feedback/ben.html">feedback</a>' in page and "../executed/ben" not in page
    for href in ("../feedback/ann.html", "../executed/ann/02_ring_attention.ipynb"):
        assert (tmp_path / "out" / "report" / Path(href)).resolve().is_file()
    assert "http" not in page                              # nothing fetched, nothing linked out
