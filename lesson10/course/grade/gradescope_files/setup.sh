#!/usr/bin/env bash
# Gradescope runs this once, while it builds the autograder's image (written by
# `python -m lesson10 gradescope`). It installs the course package pinned to
# @PACKAGE@ -- the package only: grading needs no torch.
set -euo pipefail
ROOT="${AUTOGRADER_ROOT:-/autograder}"
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
# bubblewrap is the grader's sandbox; run_autograder grades without it where the container
# has no user namespaces, and says so
$SUDO apt-get install -y -qq python3 python3-venv python3-pip git bubblewrap
# where bubblewrap cannot run, the notebooks run as this user, who can neither write the
# results nor read the package (run_autograder sees to it)
id lesson10-student >/dev/null 2>&1 || $SUDO useradd --system --no-create-home   --shell /usr/sbin/nologin lesson10-student || true
python3 -m venv "$ROOT/lesson10-venv"
"$ROOT/lesson10-venv/bin/python" -m pip install -q --upgrade pip
"$ROOT/lesson10-venv/bin/python" -m pip install -q @QUOTED_PACKAGE@
"$ROOT/lesson10-venv/bin/python" -c   "import lesson10.course.grade, lesson10.checks; print('lesson10', lesson10.__version__)"
