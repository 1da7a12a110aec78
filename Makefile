# make lab   : set up .venv and open the course in JupyterLab
# make test  : set up .venv and run every test (pytest + nbval over the notebooks)
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PIP_ENV := PIP_DISABLE_PIP_VERSION_CHECK=1

.PHONY: lab test demo bench build clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(PIP_ENV) $(BIN)/pip install -q -c constraints.txt -e ".[lab,test]"
	touch $(STAMP)

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks/

test: $(STAMP)
	$(BIN)/python -m pytest -q tests
	$(BIN)/python -m pytest -q -p no:randomly --nbval-lax notebooks solutions

demo: $(STAMP)
	$(BIN)/python -m lesson10 demo

bench: $(STAMP)
	$(BIN)/python -m lesson10 bench sim

build: $(STAMP)
	$(BIN)/python -m lesson10 build

clean:
	rm -rf $(VENV) .pytest_cache
