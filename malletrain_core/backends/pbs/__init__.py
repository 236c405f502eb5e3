"""PBS Professional / OpenPBS: an elastic job is an array of one-node subjobs in a
preemptable queue (see :mod:`.backend`).

The package: the backend (:mod:`.backend`), the commands it runs (:mod:`.commands`), their
parsing (:mod:`.parse`), its admin checks (:mod:`.checks`), its settings (:mod:`.options`, a
leaf that the configuration reads) and its registry entry (:mod:`.system`). This file imports
nothing, so that reading the settings imports no backend.
"""
