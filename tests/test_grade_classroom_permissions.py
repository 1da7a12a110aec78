"""The Classroom workflow grants every permission reporter v1 needs to hand the points over.

Reporter v1 (``classroom-resources/autograding-grading-reporter@v1``, ``src/notify-classroom.js``)
finds the job's check run and writes "Points X/Y" into it; GitHub Classroom reads the points
there. Its REST calls are recorded below from that source (:data:`REPORTER_V1_CALLS`), each
with the permission of ``GITHUB_TOKEN`` it needs (GitHub's "permissions required for GitHub
Apps" table), and the workflow must grant every one.
"""
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

WORKFLOW = Path(__file__).resolve().parent.parent / "classroom" / ".github" / "workflows" / \
    "classroom.yml"

#: (octokit call, REST route, (permission, level)) of each call reporter v1 makes, in order
REPORTER_V1_CALLS = [
    ("actions.getWorkflowRun", "GET /repos/{owner}/{repo}/actions/runs/{run_id}",
     ("actions", "read")),
    ("checks.listForSuite", "GET /repos/{owner}/{repo}/check-suites/{check_suite_id}/check-runs",
     ("checks", "read")),
    ("checks.update", "PATCH /repos/{owner}/{repo}/check-runs/{check_run_id}",
     ("checks", "write")),
]
#: the check run reporter v1 looks up (``check_name`` of its listForSuite call): it updates
#: it only when exactly one check run of the suite has this name
REPORTER_V1_CHECK_NAME = "run-autograding-tests"
LEVELS = {"none": 0, "read": 1, "write": 2}


def _granted(doc: dict, job: dict) -> dict:
    """The token's permissions in ``job``: the job's block replaces the workflow's."""
    perms = job.get("permissions", doc.get("permissions"))
    if isinstance(perms, str):                        # read-all, write-all
        level = perms.split("-")[0]
        return {perm: level for _, _, (perm, _) in REPORTER_V1_CALLS}
    return dict(perms or {})


def missing_permissions(doc: dict) -> list[str]:
    """The calls of reporter v1 that the workflow's token may not make (``call: needs X``)."""
    out = []
    for job in doc["jobs"].values():
        if not any("autograding-grading-reporter" in s.get("uses", "") for s in job["steps"]):
            continue
        granted = _granted(doc, job)
        for call, route, (perm, level) in REPORTER_V1_CALLS:
            if LEVELS.get(granted.get(perm, "none"), 0) < LEVELS[level]:
                out.append(f"{call} ({route}) needs {perm}: {level}")
    return out


def test_the_workflow_grants_every_call_of_the_reporter():
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert missing_permissions(doc) == []


def test_the_check_refuses_a_workflow_without_checks_write():
    doc = yaml.safe_load(WORKFLOW.read_text())
    doc["permissions"] = {"actions": "read", "contents": "read"}        # the old block
    assert missing_permissions(doc) == ["checks.listForSuite (GET /repos/{owner}/{repo}/"
                                        "check-suites/{check_suite_id}/check-runs) needs "
                                        "checks: read",
                                        "checks.update (PATCH /repos/{owner}/{repo}/check-runs/"
                                        "{check_run_id}) needs checks: write"]
    doc["permissions"] = {"checks": "read", "actions": "read"}
    assert missing_permissions(doc) == ["checks.update (PATCH /repos/{owner}/{repo}/check-runs/"
                                        "{check_run_id}) needs checks: write"]
    job = next(iter(doc["jobs"].values()))
    job["permissions"] = {"checks": "write"}           # a job's block replaces the workflow's
    assert missing_permissions(doc) == ["actions.getWorkflowRun (GET /repos/{owner}/{repo}/"
                                        "actions/runs/{run_id}) needs actions: read"]


def test_the_reporter_finds_the_jobs_check_run_by_its_name():
    """A job's check run is named after the job's ``name`` (its id when it has none)."""
    doc = yaml.safe_load(WORKFLOW.read_text())
    names = [job.get("name", jid) for jid, job in doc["jobs"].items()]
    assert names.count(REPORTER_V1_CHECK_NAME) == 1, names


def test_the_comment_says_what_the_reporter_does():
    text = WORKFLOW.read_text()
    head = text[:text.index("\nname:")]
    assert "checks: write" in head and "needs no `checks: write`" not in head
    assert "makes no check run" not in head
