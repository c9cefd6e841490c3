# Two entry points for a fresh machine: `make run` and `make test`. Both build their own venv.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# PyPI's torch for Linux is a CUDA build of several GB: the CPU build (2.13.0+cpu, which
# ==2.13.0 matches and pip prefers) comes from PyTorch's index when it answers. A machine that
# cannot reach it (one with the wheel on disk, as the project's are) installs as pip is set up to.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_INDEX = $(shell $(PYTHON) -c "import urllib.request as r; r.urlopen('$(TORCH_CPU_INDEX)/torch/', timeout=5)" \
	>/dev/null 2>&1 && echo --extra-index-url $(TORCH_CPU_INDEX))

.PHONY: run test lint typecheck pytest redis-server benchmark clients loadtest clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first and pinned, the CPU build: the project's dependencies then find it installed.
	$(BIN)/python -m pip install -q torch==2.13.0 $(TORCH_INDEX)
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

run: $(STAMP)
	$(BIN)/kiln serve --host 127.0.0.1 --port 8000

redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
		$(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q redis-server; }

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP) redis-server
	$(BIN)/pytest -q

test: lint typecheck pytest

benchmark: $(STAMP)
	$(BIN)/python benchmarks/backbone.py

# openapi.json from the app, then the Python and TypeScript SDKs under clients/ from it.
clients: $(STAMP)
	VENV=$(VENV) scripts/generate_clients.sh

# Locust for 20 s (10 users) against a fresh embedded server on 127.0.0.1; report in loadtest/reports/.
loadtest: $(STAMP)
	$(BIN)/python -m loadtest.run --users 10 --spawn-rate 5 --run-time 20s

clean:
	rm -rf $(VENV)
