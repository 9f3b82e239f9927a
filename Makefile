# Two entry points for a fresh machine: `make demo` and `make test`. Each creates .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint format install clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt "torch==2.13.0" -e ".[dev,tasks,sinks,data]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/heterorl run configs/demo.yaml

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

test: lint
	$(BIN)/python -m pytest -q

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
