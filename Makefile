# gpupool: the two commands a newcomer runs are `make lab` and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV := .venv/bin
STACK ?= lab
PYTEST_ARGS ?=
LINT := $(VENV)/ruff check gpupool tests infra policies bench inventory_plugins strategy_plugins scripts \
  && $(VENV)/yamllint -s . && $(VENV)/ansible-lint

.PHONY: bootstrap lab lab-down test lint unit integration bench burst-image-artifact clean

bootstrap:
	@scripts/bootstrap.sh

## The main job on the local lab default: validate the pool, bring its hosts up, converge
## every role and the scheduler on them, then gate every node.
lab: bootstrap
	$(VENV)/gpupool validate --stack $(STACK)
	$(VENV)/gpupool show --stack $(STACK)
	mkdir -p .cache && $(VENV)/gpupool inventory --stack $(STACK) -o .cache/inventory-$(STACK).yml --force
	$(VENV)/gpupool lab up --stack $(STACK)
	flock -w 1800 /tmp/gpupool-lab.lock env ANSIBLE_CONFIG=ansible.cfg $(VENV)/ansible-playbook \
	  -i "$$($(VENV)/gpupool lab status --stack $(STACK) --json | $(VENV)/python -c \
	  'import json,sys; print(json.load(sys.stdin)["inventory"])')" playbooks/site.yml
	$(VENV)/gpupool gate --stack $(STACK) --tier standard

## Remove the lab's hosts and networks.
lab-down: bootstrap
	$(VENV)/gpupool lab down --stack $(STACK)

## The whole test suite: lint, unit and integration tests.
test: bootstrap
	@# The integration tests on one shared lab and, beside them, lint and the unit tests
	@# (scripts/unit_lane.sh: on the CPU the lab leaves idle); the lane's report follows the
	@# integration tests'. Exit 5 (nothing collected: PYTEST_ARGS picked only one kind) is
	@# no failure.
	mkdir -p .cache && rm -f .cache/lint.rc .cache/unit-tests.rc .cache/newer-python.rc
	LINT='$(LINT)' setsid -w scripts/unit_lane.sh $(PYTEST_ARGS) & lane=$$!; \
	trap 'kill -- -$$lane 2>/dev/null; exit 130' INT TERM; \
	rc=0; $(VENV)/pytest -m "integration and not newer_python" --durations=60 $(PYTEST_ARGS) \
	  || rc=$$?; \
	wait $$lane || true; cat .cache/lint.log .cache/unit-tests.log .cache/newer-python.log; \
	lint=$$(cat .cache/lint.rc); unit=$$(cat .cache/unit-tests.rc); \
	newer=$$(cat .cache/newer-python.rc); \
	[ "$$lint" = 0 ] || { echo "lint failed (exit $$lint)"; exit 1; }; \
	for r in $$rc $$unit $$newer; do [ "$$r" = 0 ] || [ "$$r" = 5 ] || exit 1; done

lint: bootstrap
	$(LINT)

unit: bootstrap
	$(VENV)/pytest -m "not integration" $(PYTEST_ARGS)

integration: bootstrap
	scripts/wheelhouse.sh 3.13
	$(VENV)/pytest -m integration $(PYTEST_ARGS)

bench: bootstrap
	$(VENV)/python -m bench

## The burst image's artifact from this checkout's HEAD (the paths of
## gpupool.render.image.ARTIFACT_PATHS); upload it to the key the image's build fetches
## (s3://<datasets bucket>/gpupool/burst-image/gpupool-image.tar.gz) before a build.
burst-image-artifact: bootstrap
	@# The gate packed for the Python of the burst image's release (the controllers').
	mkdir -p .cache && $(VENV)/python -m gpupool.gate.bundle \
	  "$$($(VENV)/python -c 'from gpupool.render import image; print(image.GATE_BUNDLE)')" \
	  --python "$$($(VENV)/python -c 'import sys; from pathlib import Path; \
	  from gpupool.spec import loader, os_release; \
	  print(os_release.burst_release(loader.load_stack(sys.argv[1], Path.cwd())).python)' '$(STACK)')"
	git archive --format=tar -o .cache/gpupool-image.tar HEAD \
	  $$($(VENV)/python -c 'from gpupool.render import image; print(*image.ARTIFACT_PATHS)')
	tar --append -f .cache/gpupool-image.tar \
	  "$$($(VENV)/python -c 'from gpupool.render import image; print(image.GATE_BUNDLE)')"
	gzip -nf .cache/gpupool-image.tar
	@echo "upload .cache/gpupool-image.tar.gz, then pin it: pulumi config set" \
	  "gpupool:$$($(VENV)/python -c 'from gpupool.render import image; print(image.DIGEST_KEY)')" \
	  "$$(sha256sum .cache/gpupool-image.tar.gz | cut -d' ' -f1)"

clean:
	rm -rf .cache .pytest_cache .ruff_cache
