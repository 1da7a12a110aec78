"""The results key holds everything that changes a verdict, and seeds are not replayed
against a student (issue 32): a run after a finished one draws a new secret seed unless the
instructor asks for a replay, and only a file unchanged since its verdict keeps it (its seed
too); a run that stopped is resumed with its own."""
import pytest

from lesson10.course.grade import store
from lesson10.course.grade.cli import _parser
from lesson10.course.grade.request import Request

LIMITS = {"cell_timeout": 120, "exercise_timeout": 30, "notebook_timeout": 600,
          "memory_gib": 4, "sandboxed": True}


def _key(**kw):
    args = {"content": b"{}", "helpers": [("h.py", "x = 1")], "seed": 5, "notebook": "03_x",
            "limits": LIMITS}
    args.update(kw)
    content, helpers = args.pop("content"), args.pop("helpers")
    return store.key(content, helpers, **args)


def test_everything_that_changes_a_verdict_changes_the_key():
    base = _key()
    assert _key() == base                                        # the same submission
    changed = [_key(seed=6), _key(notebook="04_y"), _key(content=b"{ }"),
               _key(helpers=[("h.py", "x = 2")]), _key(helpers=[])]
    for name, value in (("exercise_timeout", 60), ("cell_timeout", 121),
                        ("notebook_timeout", 900), ("memory_gib", 8), ("sandboxed", False)):
        changed.append(_key(limits={**LIMITS, name: value}))
    assert base not in changed and len(set(changed)) == len(changed)


def test_the_key_holds_the_code_version(monkeypatch):
    base = _key()
    monkeypatch.setattr(store, "code_version", lambda: "another grader")
    assert _key() != base


def test_code_version_is_a_digest_of_the_package():
    assert len(store.code_version()) == 16 and store.code_version() == store.code_version()


def test_the_limits_come_from_the_options():
    args = _parser().parse_args(["x.ipynb", "--exercise-timeout", "45", "--memory", "2",
                                 "--no-sandbox"])
    assert Request.from_args(args).verdict_limits() == {"cell_timeout": 120, "exercise_timeout": 45,
                             "notebook_timeout": 600, "memory_gib": 2, "sandboxed": False}


def test_a_regrade_draws_a_new_seed_and_a_replay_takes_the_stored_one(tmp_path):
    box = store.Store(tmp_path / "r")
    box.prepare()
    first = store.choose_seed(box, None, False)
    box.begin(first)
    assert box.unfinished() and store.choose_seed(box, None, False) == first     # a resume
    box.end()
    assert not box.unfinished()
    again = store.choose_seed(box, None, False)                                   # a regrade
    assert again != first
    assert store.choose_seed(box, None, True) == first                            # --replay
    assert store.choose_seed(box, 77, False) == 77                                # --seed
    assert store.choose_seed(None, None, False) != store.choose_seed(None, None, False)


def test_a_resume_refuses_another_seed_and_a_replay_needs_a_stored_one(tmp_path):
    box = store.Store(tmp_path / "r")
    box.prepare()
    with pytest.raises(store.StoreError, match="keeps none"):
        store.choose_seed(box, None, True)
    with pytest.raises(store.StoreError, match="--resume DIR"):
        store.choose_seed(None, None, True)
    box.begin(5)
    with pytest.raises(store.StoreError, match="unfinished grading with seed 5"):
        store.choose_seed(box, 6, False)
    assert store.choose_seed(box, 5, False) == 5
    box.end()
    assert store.choose_seed(box, 6, False) == 6                 # a finished run: any seed


def test_each_file_keeps_the_seed_it_was_graded_with(tmp_path):
    from pathlib import Path

    from lesson10.course.grade.gradebook import Item, Plan
    box = store.Store(tmp_path / "r")
    box.prepare()
    rep = {"notebook": "a", "student": "ann", "course_notebook": "03_x", "exercises": [],
           "points": 0, "max_points": 0, "feedback": [], "ok": True, "error": None}
    old = store.class_doc(Plan(graded=[Item(Path("c/ann/a.ipynb"), "ann", "03_x")],
                               students=["ann"]), {Path("c/ann/a.ipynb"): "k1"}, seed=1, root="c")
    new = store.class_doc(Plan(graded=[Item(Path("c/bob/b.ipynb"), "bob", "03_x")],
                               students=["bob"]), {Path("c/bob/b.ipynb"): "k2"}, seed=2, root="c")
    box.put("k1", rep)
    box.put("k2", {**rep, "student": "bob"})
    reports, _ = store.load(store.merge(old, new), box)
    assert {r["student"]: r["seed"] for r in reports} == {"ann": 1, "bob": 2}


def test_an_unchanged_file_keeps_its_verdict_and_a_changed_one_does_not(tmp_path):
    from pathlib import Path

    from lesson10.course.grade.gradebook import Item, Plan
    box = store.Store(tmp_path / "r")
    box.prepare()
    ann, bob = Item(Path("c/ann/a.ipynb"), "ann", "03_x"), Item(Path("c/bob/b.ipynb"), "bob", "03_x")
    content = {ann.path: b"ann's", bob.path: b"bob's"}

    def key_at(it, seed):
        return _key(content=content[it.path], seed=seed)

    old = store.class_doc(Plan(graded=[ann, bob], students=["ann", "bob"]),
                          {ann.path: key_at(ann, 1), bob.path: key_at(bob, 1)}, seed=1, root="c")
    box.put(key_at(ann, 1), {"notebook": "a"})
    box.put(key_at(bob, 1), {"notebook": "b"})
    content[bob.path] = b"bob's, resubmitted"
    keys = {it.path: key_at(it, 9) for it in (ann, bob)}
    seeds = store.keep_unchanged(old, box, [ann, bob], keys, 9, key_at)
    assert seeds == {ann.path: 1, bob.path: 9}                   # bob meets new cases
    assert keys == {ann.path: key_at(ann, 1), bob.path: key_at(bob, 9)}
    fixed = {it.path: key_at(it, 9) for it in (ann, bob)}
    assert store.keep_unchanged(old, box, [ann, bob], fixed, 9, key_at, fixed=True) == \
        {ann.path: 9, bob.path: 9}                               # --seed, --new-cases
    (box.folder / "results" / f"{key_at(ann, 1)}.json").unlink()
    assert store.keep_unchanged(old, box, [ann], {ann.path: key_at(ann, 9)}, 9, key_at) == \
        {ann.path: 9}                                            # no stored verdict: graded
