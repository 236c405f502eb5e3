"""Backends: translate a batch system's state into engine events and execute its actions.

One package per batch system (``slurm/``, ``pbs/``, ``toy/``) beside what they share: the
:class:`~.base.Backend` protocol's bookkeeping for array tasks (:mod:`.base`), the lifecycle
enums (:mod:`.states`), the admin checks' vocabulary (:mod:`.checks`) and the registry entry's
shape (:mod:`.system`). The registry itself, :data:`~.registry.BATCH_SYSTEMS`, is
:mod:`.registry`: ``daemon.batch_system`` names one of its keys.

This file imports nothing, so that a batch system's settings (``slurm/options.py``,
``pbs/options.py``: leaf modules) can be read by :mod:`malletrain_core.config` without
importing any backend.
"""
