# make lab   : set up .venv and open the course in JupyterLab
# make test  : set up .venv and run every test (pytest + nbval over the notebooks)
# make test-colab     : the notebooks in Colab-like venvs (Colab's versions, no torch for 01-05 on
#                       Python 3.12 and 3.13; 06 on 3.11 with the CPU torch), via their install cell
# make test-frontends : the figures in JupyterLab 4 (ipywidgets 8) and Notebook 6.5 (ipywidgets 7.7.1),
#                       headless Chromium (Debian's chromium: apt-get install chromium)
# make test-grader    : the grader's tests on Python 3.12 and 3.13 (pyenv's), each in a venv with only
#                       what grading needs (.venv-py312, .venv-py313; no torch); a missing Python is skipped
# make test-multinode : torchrun --nnodes 2 across two network namespaces joined by a veth (root, iproute2;
#                       skipped with a message where namespaces cannot be made)
# make lint          : ruff and mypy (their settings: pyproject.toml)
# make test-redteam  : the grader's batches of cheats, edge cases and seeds (minutes)
# make test-loaded   : test-slow and test-redteam with every core kept busy by tests/cpu_hog.py
#                      (no verdict may depend on the machine's speed; run it after touching a limit)
# .ci/run runs every target above but lab and test-loaded (too long for CI), each step timed.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PIP_ENV := PIP_DISABLE_PIP_VERSION_CHECK=1

COLAB   := .venv-colab
COLAB_STAMP := $(COLAB)/.installed
# Colab's Python 3.12 (required) and 3.13 (when this machine has it): pyenv's, else on PATH
PY312   ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12) python3.12)
PY313   ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.13*/bin/python3.13) python3.13)
COLAB_NEW := .venv-colab312/.installed .venv-colab313/.installed
OTHER   := colab or frontends or multinode or redteam
FAST    := -m "not slow and not ($(OTHER))"
# both cores (pytest-xdist): a module's tests stay in one worker, a notebook's cells too
# (tests/conftest.py: the workers share one launch of the ranks)
XDIST   := -n 2 --dist loadfile

.PHONY: bench-anchors lab lint test test-slow test-redteam test-loaded test-colab test-frontends test-grader test-multinode demo bench build clean

PYENV_ROOT   ?= $(HOME)/.pyenv
# (make test and make test-slow run these, the gradebook and the answer suites on 3.11; CI's 20 minutes
# leave room for the sandbox's own tests on the other two versions)
GRADER_TESTS := tests/test_grade.py tests/test_grade_redteam.py tests/test_grade_wire.py tests/test_grade_paths.py
GRADER_DEPS  := numpy matplotlib ipython nbformat pytest hypothesis
GRADER_PY312 ?= $(lastword $(sort $(wildcard $(PYENV_ROOT)/versions/3.12.*/bin/python)))
GRADER_PY313 ?= $(lastword $(sort $(wildcard $(PYENV_ROOT)/versions/3.13.*/bin/python)))

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(PIP_ENV) $(BIN)/pip install -q -c constraints.txt -e ".[spmd,lab,test,frontends,lint]"
	touch $(STAMP)

# as root (containers, cloud machines) Jupyter refuses to start without --allow-root;
# LAB_ARGS: more options for the server (e.g. LAB_ARGS="--no-browser --port 8899")
LAB_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)
LAB_ARGS ?=
lab: $(STAMP)
	$(BIN)/jupyter lab notebooks/ $(LAB_ROOT) $(LAB_ARGS)

# ruff (the rule set and its reasons: pyproject.toml) and mypy on lesson10/
lint: $(STAMP)
	$(BIN)/ruff check lesson10 benchmarks tests conftest.py
	$(BIN)/mypy

# the package's tests and every notebook (nbval) in one run on both cores; notebook 06's exercises
# are checked in Jupyter only (their stubs stop Run All), so only its solutions/ copy runs
# (tests/test_notebook06_text.py: the same code)
test: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) $(FAST) --nbval-lax tests notebooks solutions \
	    --ignore=notebooks/06_multiprocess.ipynb

# whole commands end to end (classes graded, benchmarks run, process trees killed): seconds
# each, minutes in all; a step of .ci/run
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) -m "slow and not ($(OTHER))" tests

# Colab's preinstalled versions (tests/colab/colab-pins.txt); lesson10 itself is NOT installed here:
# each notebook's install cell installs it (tests/test_colab.py)
$(COLAB_STAMP): tests/colab/colab-pins.txt
	rm -rf $(COLAB)
	$(PY) -m venv $(COLAB)
	$(PIP_ENV) $(COLAB)/bin/pip install -q -r tests/colab/colab-pins.txt
	touch $(COLAB_STAMP)

# .venv-colab312, .venv-colab313: the same pins, no torch (3.13 is skipped where there is no python3.13)
.venv-colab3%/.installed: tests/colab/colab-pins.txt
	rm -rf .venv-colab3$*
	@if [ "$*" != 12 ] && ! $(PY3$*) -V >/dev/null 2>&1; then \
	    echo "no Python 3.$* here ($(PY3$*)): its Colab-like run is skipped"; exit 0; fi; \
	set -e; $(PY3$*) -m venv .venv-colab3$*; \
	$(PIP_ENV) .venv-colab3$*/bin/pip install -q -r tests/colab/colab-pins.txt; \
	touch $@

test-colab: $(STAMP) $(COLAB_STAMP) $(COLAB_NEW)
	$(BIN)/python -m pytest -q -m colab tests/test_colab.py

test-frontends: $(STAMP) $(COLAB_STAMP)
	$(BIN)/python -m pytest -q -m frontends tests/test_frontends.py

# torchrun across two hosts made of network namespaces (root and iproute2; skipped otherwise)
test-multinode: $(STAMP)
	$(BIN)/python -m pytest -q -m multinode tests/test_multinode.py

# the grader's batches of hostile, edge and seed cases (each grades whole classes: minutes)
test-redteam: $(STAMP)
	$(BIN)/python -m pytest -q -p no:randomly -m redteam tests

# test-slow and test-redteam beside one busy process per core (tests/cpu_hog.py starts them and
# always stops them); each step's seconds are printed; not a step of .ci/run (it is long)
HOGS ?= $(shell nproc 2>/dev/null || echo 2)
test-loaded: $(STAMP)
	$(BIN)/python tests/cpu_hog.py --cpus $(HOGS) -- bash -c 'rc=0; for t in test-slow test-redteam; do \
	    s=$$SECONDS; $(MAKE) --no-print-directory $$t || rc=1; \
	    echo "== make $$t (under load): $$((SECONDS - s)) s"; done; exit $$rc'

# the grader's tests where grading has no torch: the package itself with --no-deps
.venv-py%/.installed: pyproject.toml Makefile
	rm -rf .venv-py$*
	$(GRADER_PY$*) -m venv .venv-py$*
	$(PIP_ENV) .venv-py$*/bin/pip install -q $(GRADER_DEPS)
	$(PIP_ENV) .venv-py$*/bin/pip install -q --no-deps -e .
	touch $@

test-grader: test-grader-312 test-grader-313

test-grader-%:
	@if [ -z "$(GRADER_PY$*)" ]; then \
	    echo "test-grader: no Python 3.$(patsubst 3%,%,$*) under $(PYENV_ROOT)/versions: its grader tests are skipped"; \
	else \
	    $(MAKE) --no-print-directory .venv-py$*/.installed && \
	    .venv-py$*/bin/python -m pytest -q $(GRADER_TESTS); \
	fi

demo: $(STAMP)
	$(BIN)/python -m lesson10 demo

bench: $(STAMP)
	$(BIN)/python -m lesson10 bench sim

build: $(STAMP)
	$(BIN)/python -m lesson10 build

# our ring, Ulysses and MoE against lucidrains' ring_attention_pytorch, DeepSpeed's
# DistributedAttention and fairscale's MOELayer (benchmarks/results/anchors.md), in a venv of
# their own; torch pinned (an unpinned one pulls a CUDA build of several GB)
ANCHORS := .venv-anchors
$(ANCHORS)/.installed: pyproject.toml Makefile
	$(PY) -m venv $(ANCHORS)
	$(PIP_ENV) $(ANCHORS)/bin/pip install -q torch==2.13.0 numpy ring_attention_pytorch==0.5.20
	$(PIP_ENV) $(ANCHORS)/bin/pip install -q --no-deps fairscale==0.4.13
	DS_BUILD_OPS=0 $(PIP_ENV) $(ANCHORS)/bin/pip install -q --no-deps deepspeed==0.19.8
	$(PIP_ENV) $(ANCHORS)/bin/pip install -q hjson msgpack ninja packaging psutil py-cpuinfo pydantic tqdm
	$(PIP_ENV) $(ANCHORS)/bin/pip install -q --no-deps -e .
	touch $@

bench-anchors: $(ANCHORS)/.installed
	$(ANCHORS)/bin/python -m benchmarks.tooling.anchors $(ANCHOR_ARGS)

clean:
	rm -rf $(VENV) $(COLAB) .venv-colab3* .venv-py312 .venv-py313 $(ANCHORS) .pytest_cache
