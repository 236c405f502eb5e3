# MalleTrain — the two entry points are `make demo` and `make test`; both set the machine up.
PYTHON ?= python3
PYTEST ?= $(PYTHON) -m pytest
export PYTHONDONTWRITEBYTECODE = 1

.PHONY: setup setup-full setup-pbs test test-pbs test-long check lint demo bench bench-quick clean

setup:
	@bash scripts/setup-machine.sh

# The whole suite also runs the local cluster's accounting mode (MariaDB + slurmdbd + QOS)
# and the real-PBS tier (OpenPBS built from ../shared/vendor/openpbs into build/openpbs, once).
setup-full:
	@MALLETRAIN_ACCOUNTING=1 MALLETRAIN_PBS=1 bash scripts/setup-machine.sh

setup-pbs:
	@MALLETRAIN_PBS=1 bash scripts/setup-machine.sh

## Whole suite: unit, property, simulator, PBS (fake and real), real-Slurm and real-torch tests.
test: setup-full
	$(PYTEST) -q || [ $$? -eq 5 ]

## The real-PBS tier alone: a local OpenPBS complex (server + 8 moms in network namespaces).
test-pbs: setup-pbs
	$(PYTEST) -q -m pbs_real || [ $$? -eq 5 ]

## Long loops (not in `make test`): 200 cancellations during rescale churn on real Slurm.
test-long: setup-full
	MALLETRAIN_REVIVAL_CANCELS=200 $(PYTEST) -q -s tests/slurm/test_revival.py

## Quick development loop: everything that needs neither Slurm nor torch, plus lint.
check: setup lint
	$(PYTEST) -q -m "not slurm and not torch and not slow" || [ $$? -eq 5 ]

lint:
	$(PYTHON) -m ruff check malletrain_core tests bench pbs_hooks
	$(PYTHON) -m mypy malletrain_core

demo: setup
	bash scripts/demo.sh

bench-quick: setup
	$(PYTHON) bench/allocator.py --quick

bench: setup
	$(PYTHON) bench/allocator.py --json --markdown BENCHMARKS.md

clean:
	rm -rf build dist *.egg-info .pytest_cache .hypothesis .mypy_cache .ruff_cache
