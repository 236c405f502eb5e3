"""Snapshots of the engine's state, for compacting the daemon's journal.

The engine is a function of the events it consumed; a snapshot is that function's value at one
journal position, so that the journal before it can go. It is the planner's own account of its
state, :meth:`~malletrain_core.engine.planner.Planner.state_dict` (in the manner of torch's
modules, each part of the engine turns its own fields into plain data and back), written as
JSON under a format version. Renaming a field inside the engine changes no snapshot; changing
what a state dict holds is a new :data:`FORMAT`, and the reader of every older one stays
(:mod:`.snapshot_v1`). No code is ever loaded from the state file.

What is configuration and not state is not in the snapshot: the engine's :class:`EngineConfig`
and policy come from the configuration the daemon is started with, as in a replay of the whole
journal. The reclaim predictor's learned fragment counts, kept inside the configuration, are
state and are in it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..engine.planner import Planner
from ..errors import MalleTrainError
from . import snapshot_v1

FORMAT = 2
"""Version of the snapshot layout this version writes."""

READERS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {
    1: snapshot_v1.state,
    2: lambda body: body["state"],
}
"""Format version → the state dict of a snapshot of that version."""


class SnapshotError(MalleTrainError):
    """A snapshot cannot be written or read."""


class CorruptSnapshot(SnapshotError):
    """A stored snapshot does not decode (as opposed to one that does not fit the engine)."""


class UnknownFormat(SnapshotError):
    """A stored snapshot of a format version this version does not read (one written by a
    later malletraind): the daemon starts from the batch system's state, as for a corrupt one."""


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"a {type(value).__name__} is not plain data")


def snapshot(engine: Planner) -> str:
    """The engine's state as one JSON text (see the module docstring)."""
    try:
        return json.dumps({"format": FORMAT, "state": engine.state_dict()},
                          separators=(",", ":"), default=_plain)
    except (TypeError, ValueError) as exc:
        raise SnapshotError(f"cannot snapshot the engine ({exc}); its state_dict must be "
                            "plain data") from None


def restore(engine: Planner, text: str) -> None:
    """Load a :func:`snapshot` of any format in :data:`READERS` into a freshly built engine
    of the same configuration (its configuration and policy are kept)."""
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise CorruptSnapshot(f"the engine snapshot is not JSON ({exc}); remove state.db to "
                              "start empty (the daemon reconciles with the batch system)") from None
    version = body.get("format") if isinstance(body, dict) else None
    read = READERS.get(version) if type(version) is int else None
    if read is None:
        raise UnknownFormat(f"engine snapshot format {version!r}, this version reads "
                            f"{sorted(READERS)}; the daemon starts from the batch system's "
                            "state, or restart the version that wrote it")
    try:
        engine.load_state_dict(read(body))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise SnapshotError(f"the engine snapshot (format {version}) does not fit this engine "
                            f"({type(exc).__name__}: {exc}); restore the configuration that "
                            "wrote it or remove state.db to start empty") from None


def canonical(engine: Planner) -> Any:
    """The engine's state dict with every mapping's items sorted and timings dropped, for
    comparing two engines that took the same events (in whatever order their dicts filled)."""
    def walk(obj: Any) -> Any:
        if isinstance(obj, dict):
            return sorted(([key, walk(value)] for key, value in obj.items()
                           if key != "solve_ms"), key=repr)
        if isinstance(obj, (list, tuple)):
            return [walk(x) for x in obj]
        if isinstance(obj, float) and not math.isfinite(obj):
            return repr(obj)
        return obj
    return walk(engine.state_dict())
