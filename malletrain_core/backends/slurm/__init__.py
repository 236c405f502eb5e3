"""Slurm: an elastic job is a held array of one-node tasks (see :mod:`.backend`).

The package: the backend (:mod:`.backend`: the poll's order and the actions; :mod:`.reconcile`:
the task table and the poll's reconciliation; :mod:`.rules`: what a task's state means), its
client (:mod:`.client`: the commands or pyslurm, :mod:`.pyslurm_reader` and
:mod:`.pyslurm_rpc`), its command parsing (:mod:`.parse`), its admin checks (:mod:`.checks`),
its settings (:mod:`.options`, a leaf that the configuration reads) and its registry entry
(:mod:`.system`). This file imports nothing, so that reading the settings imports no backend.
"""
