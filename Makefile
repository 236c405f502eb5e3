# MalleTrain — the two entry points are `make demo` and `make test`; both set the machine up.
PYTHON ?= python3
PYTEST ?= $(PYTHON) -m pytest
export PYTHONDONTWRITEBYTECODE = 1

.PHONY: setup setup-full setup-pbs setup-matrix test test-pbs test-matrix test-long test-faults-inplace check lint demo bench bench-quick soak soak-quick clean rpm

setup:
	@bash scripts/setup-machine.sh

# The whole suite also runs the local cluster's accounting mode (MariaDB + slurmdbd + QOS)
# and the real-PBS tier (OpenPBS built from ../shared/vendor/openpbs into build/openpbs, once).
setup-full:
	@MALLETRAIN_ACCOUNTING=1 MALLETRAIN_PBS=1 bash scripts/setup-machine.sh

setup-pbs:
	@MALLETRAIN_PBS=1 bash scripts/setup-machine.sh

## Whole suite: unit, property, simulator, PBS (fake and real), real-Slurm and real-torch tests,
## in three parts (scripts/test-suite.sh): the Slurm modules with clusters of their own, which
## wait on Slurm's clock, run beside everything outside tests/slurm; then tests/slurm.
test: setup-full
	@PYTEST="$(PYTEST)" bash scripts/test-suite.sh

## The real-PBS tier alone: a local OpenPBS complex (server + 8 moms in network namespaces).
test-pbs: setup-pbs
	$(PYTEST) -q -m pbs_real || [ $$? -eq 5 ]

## Long loops (not in `make test`): 200 cancellations during rescale churn on real Slurm, the
## two slowest fault scenarios (a hung slurmd, the checkpoint folder full and read-only), the
## restart path's Lightning and HF runs under real Slurm, every backend contract scenario on
## the real PBS complex, 200
## re-forms of two processes (threads, fds and memory flat), and
## 40 pairs of processes re-formed in place 21 times each beside two busy processes.
test-long: setup-full
	MALLETRAIN_REFORM_ROUNDS=40 $(PYTEST) -q tests/test_inplace.py -k many_pairs
	MALLETRAIN_REFORM_LEAK_ROUNDS=200 $(PYTEST) -q -s tests/test_inplace.py -k leak_nothing
	MALLETRAIN_REVIVAL_CANCELS=200 $(PYTEST) -q -s tests/slurm/test_revival.py
	MALLETRAIN_LONG_FAULTS=1 $(PYTEST) -q tests/slurm/test_faults_site.py -k "slurmd_hung or checkpoint_folder"
	MALLETRAIN_BYO_RESTART_ALL=1 $(PYTEST) -q tests/slurm/test_byo_e2e.py -k "lightning or hf"
	MALLETRAIN_LIVE_CONTRACT_ALL=1 $(PYTEST) -q tests/pbs_real/test_pbs_backend_real.py -k contract

## The fault scenarios that change an epoch under the fault, on the in-place path
## (malletrain-run --inplace; the others are skipped with why): about 3 minutes.
test-faults-inplace: setup-full
	MALLETRAIN_FAULTS_PATH=inplace MALLETRAIN_LONG_FAULTS=1 $(PYTEST) -q -rs tests/slurm/test_faults.py tests/slurm/test_faults_site.py

# Slurm 24.11 (Debian trixie in a chroot), 25.11 and 26.05 (built from ../shared/vendor/slurm in
# it), and a pyslurm for 24.11 and 25.11 (none exists for 26.05: there the 25.11 one must be
# refused), under build/slurm-matrix; a second run only checks the mounts.
setup-matrix:
	@bash scripts/setup-slurm-matrix.sh all
	@bash scripts/setup-slurm-matrix.sh pyslurm

## The real-Slurm contract tier on every newer release: job_submit.lua, the epilog hook, holes
## on PLANNED nodes, holds surviving preemption, users locked out, admin check, the daemon, the
## e2e torch test and the fault scenarios, and the backend's pyslurm path (reads and actions; a
## missing pyslurm fails here instead of skipping). `make test` keeps the whole suite on 22.05.
MATRIX_RELEASES ?= 24.11 25.11 26.05
MATRIX_TESTS ?= tests/slurm --ignore=tests/slurm/test_accounting.py
test-matrix: setup setup-matrix
	@failed=""; for r in $(MATRIX_RELEASES); do echo "== Slurm $$r"; start=$$(date +%s); \
	  MALLETRAIN_REQUIRE_PYSLURM=1 MALLETRAIN_BYO_RESTART_ALL=1 $(PYTEST) -q -m slurm --slurm-release=$$r $(MATRIX_TESTS) \
	    || failed="$$failed $$r"; \
	  echo "== Slurm $$r: $$(( $$(date +%s) - start )) s"; done; \
	  if [ -n "$$failed" ]; then echo "test-matrix failed on:$$failed"; exit 1; fi

## The RPM a site installs (malletrain.spec, `rpmbuild -ta` on the release tarball), built for
## $(PYTHON): dist/rpm/RPMS/noarch/malletrain-VERSION-1.noarch.rpm, in seconds.
rpm:
	@bash scripts/make-rpm.sh --python "$$(command -v $(PYTHON))"

## Quick development loop: everything that needs neither Slurm nor torch, plus lint.
check: setup lint
	$(PYTEST) -q -m "not slurm and not torch and not slow" || [ $$? -eq 5 ]

lint:
	$(PYTHON) -m ruff check malletrain_core devtools tests bench pbs_hooks
	$(PYTHON) -m mypy malletrain_core devtools bench

demo: setup
	bash scripts/demo.sh

bench-quick: setup
	$(PYTHON) -m bench.allocator --quick

bench: setup
	$(PYTHON) -m bench.allocator --json --markdown BENCHMARKS.md

## One hour on a 32-node local Slurm cluster (not in `make test`): leaks, lost and revived
## jobs, lost reports, prod start delay; rewrites the soak section of BENCHMARKS.md.
soak: setup
	$(PYTHON) -m bench.soak --json --markdown BENCHMARKS.md

## The same for about 5 minutes (results under bench-output/), for trials.
soak-quick: setup
	$(PYTHON) -m bench.soak --quick

# build/slurm-matrix/trixie has the checkout's parent folder, /tmp and /home bind-mounted into it while the
# matrix is set up: unmount before removing anything, and refuse while a mount is left.
clean:
	@if grep -q " $(CURDIR)/build/" /proc/mounts; then \
	  [ "$$(id -u)" = 0 ] && bash scripts/setup-slurm-matrix.sh umount; \
	  if grep -q " $(CURDIR)/build/" /proc/mounts; then \
	    echo "clean: mounts under build/ are left: run scripts/setup-slurm-matrix.sh umount as root"; \
	    exit 1; fi; fi
	rm -rf build dist *.egg-info .pytest_cache .hypothesis .mypy_cache .ruff_cache
