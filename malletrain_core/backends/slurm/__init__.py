"""Slurm: an elastic job is a held array of one-node tasks (see :mod:`.backend`).

The package: the backend (:mod:`.backend`), its command parsing (:mod:`.parse`), its admin
checks (:mod:`.checks`), its settings (:mod:`.options`, a leaf that the configuration reads)
and its registry entry (:mod:`.system`). This file imports nothing, so that reading the
settings imports no backend.
"""
