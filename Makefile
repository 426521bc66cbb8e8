# Newcomer commands: `make demo` and `make test`. Each creates or reuses .venv by itself.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STACK ?= dev

.PHONY: demo test plan lint venv clean

# Reinstall only when the pinned dependencies change.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $@

## venv: the pinned Python environment (Pulumi.yaml runs the program in it)
venv: $(VENV)/.installed

## demo: the offline plan of the dev stack (no cloud account needed)
demo: plan

## plan: offline plan of STACK (default dev) into build/plan/STACK
plan: $(VENV)/.installed
	$(PY) -m infra.plan --stack $(STACK) --out build/plan/$(STACK)

## test: lint and the whole offline test suite
test: $(VENV)/.installed lint
	$(PY) -m pytest

lint: $(VENV)/.installed
	$(PY) -m ruff check .

clean:
	rm -rf build .pytest_cache .ruff_cache
