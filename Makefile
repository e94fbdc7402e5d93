# The two user-facing commands are `make demo` and `make test`; both build the
# virtual environment from PyPI on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
JOBS   ?= 2

.PHONY: demo test test-all bench synth clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/mxu demo

test: $(STAMP)
	$(BIN)/python -m pytest -n $(JOBS)

test-all: $(STAMP)
	$(BIN)/python -m pytest -n $(JOBS) -m ''

bench: $(STAMP)
	$(BIN)/python bench/mac.py

synth: $(STAMP)
	$(BIN)/python -m mxu.synth.mac

clean:
	rm -rf build .cache sim_build
