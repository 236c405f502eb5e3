"""The benchmarks behind BENCHMARKS.md, one module per section.

A package, run from the repository root as ``python -m bench.NAME`` (``python -m bench.e2e
--json``), so that its modules import one another, ``malletrain_core`` and ``devtools`` by
their names and never edit ``sys.path``; the tests import them the same way (``bench.e2e``).
Helpers that a test and a bench both need live in ``devtools/`` (the run-log readers in
``devtools/runlogs/``, the real-PBS helpers in ``devtools/localcluster/pbs_helpers.py``), never
in ``tests/``.
"""
