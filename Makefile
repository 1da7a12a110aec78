# make lab   : set up .venv and open the course in JupyterLab
# make test  : set up .venv and run every test (pytest + nbval over the notebooks)
# make test-colab     : the notebooks in a Colab-like venv (.venv-colab, Colab's versions), via their install cell
# make test-frontends : the figures in JupyterLab 4 (ipywidgets 8) and Notebook 6.5 (ipywidgets 7.7.1),
#                       headless Chromium (Debian's chromium: apt-get install chromium)
# .ci/run runs all three.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PIP_ENV := PIP_DISABLE_PIP_VERSION_CHECK=1

COLAB   := .venv-colab
COLAB_STAMP := $(COLAB)/.installed
SLOW    := -m "not colab and not frontends"

.PHONY: lab test test-colab test-frontends demo bench build clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(PIP_ENV) $(BIN)/pip install -q -c constraints.txt -e ".[spmd,lab,test,frontends]"
	touch $(STAMP)

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks/

test: $(STAMP)
	$(BIN)/python -m pytest -q $(SLOW) tests
	$(BIN)/python -m pytest -q -p no:randomly --nbval-lax notebooks solutions

# Colab's preinstalled versions (tests/colab/colab-pins.txt); lesson10 itself is NOT installed here:
# each notebook's install cell installs it (tests/test_colab.py)
$(COLAB_STAMP): tests/colab/colab-pins.txt
	rm -rf $(COLAB)
	$(PY) -m venv $(COLAB)
	$(PIP_ENV) $(COLAB)/bin/pip install -q -r tests/colab/colab-pins.txt
	touch $(COLAB_STAMP)

test-colab: $(STAMP) $(COLAB_STAMP)
	$(BIN)/python -m pytest -q -m colab tests/test_colab.py

test-frontends: $(STAMP) $(COLAB_STAMP)
	$(BIN)/python -m pytest -q -m frontends tests/test_frontends.py

demo: $(STAMP)
	$(BIN)/python -m lesson10 demo

bench: $(STAMP)
	$(BIN)/python -m lesson10 bench sim

build: $(STAMP)
	$(BIN)/python -m lesson10 build

clean:
	rm -rf $(VENV) $(COLAB) .pytest_cache
