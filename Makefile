# gpupool: the two commands a newcomer runs are `make lab` and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV := .venv/bin
STACK ?= lab
PYTEST_ARGS ?=

.PHONY: bootstrap lab test lint unit integration bench clean

bootstrap:
	@scripts/bootstrap.sh

## The main job on the local lab default: validate the pool and bring it up.
lab: bootstrap
	$(VENV)/gpupool validate --stack $(STACK)
	$(VENV)/gpupool show --stack $(STACK)
	$(VENV)/gpupool inventory --stack $(STACK) -o .cache/inventory-$(STACK).yml

## The whole test suite: lint, unit and integration tests.
test: bootstrap lint
	$(VENV)/pytest $(PYTEST_ARGS)

lint: bootstrap
	$(VENV)/ruff check gpupool tests infra policies bench
	$(VENV)/yamllint -s .

unit: bootstrap
	$(VENV)/pytest -m "not integration" $(PYTEST_ARGS)

integration: bootstrap
	$(VENV)/pytest -m integration $(PYTEST_ARGS)

bench: bootstrap
	$(VENV)/python -m bench

clean:
	rm -rf .cache .pytest_cache .ruff_cache
