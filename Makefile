# Two entry points for a fresh machine: `make run` and `make test`. Both build their own venv.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test lint typecheck pytest redis-server benchmark clients loadtest clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first and pinned: on the project's machines this takes the CPU wheel on disk.
	$(BIN)/python -m pip install -q torch==2.13.0
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
