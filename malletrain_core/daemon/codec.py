"""JSON encoding of events and actions (the daemon's journal, the API, test fixtures)."""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import events as ev
from ..model import Curve

_TYPES: dict[str, type] = {
    cls.__name__: cls for cls in (
        ev.NodesIdle, ev.NodesReclaimed, ev.JobSubmitted, ev.JobEnded, ev.ProgressReport,
        ev.WorkerStarted, ev.WorkerStopped, ev.Tick,
        ev.Grow, ev.Shrink, ev.Checkpoint, ev.Finish)
}


def _plain(value: Any) -> Any:
    if isinstance(value, Curve):
        return value.to_dict()
    if isinstance(value, ev.IdleNode):
        return {"name": value.name, "hole_end": value.hole_end, "group": value.group}
    if isinstance(value, ev.JobRequest):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, ev.EndReason):
        return value.value
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def to_dict(obj: ev.Event | ev.Action) -> dict[str, Any]:
    """``{"type": "NodesIdle", ...fields}``."""
    out = {"type": type(obj).__name__}
    for f in dataclasses.fields(obj):
        out[f.name] = _plain(getattr(obj, f.name))
    return out


def _request(data: dict[str, Any]) -> ev.JobRequest:
    data = dict(data)
    curve = data.get("curve")
    if curve is not None:
        data["curve"] = Curve.of(curve["nodes"], curve["throughput"], where=f"job {data.get('id')}")
    return ev.JobRequest(**data)


def from_dict(data: dict[str, Any]) -> ev.Event | ev.Action:
    """Inverse of :func:`to_dict`; raises ValueError (one line) on anything it does not know."""
    if not isinstance(data, dict):
        raise ValueError(f"an event is a JSON object, not {type(data).__name__}")
    name = data.get("type")
    cls = _TYPES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f"unknown event or action type {name!r}")
    time = data.get("time")
    if issubclass(cls, ev.Event) and (isinstance(time, bool)
                                      or not isinstance(time, (int, float))):
        raise ValueError(f"{name}: 'time' must be a number, got {time!r}")
    try:
        return _build(cls, data)
    except ValueError:
        raise
    except (TypeError, KeyError, AttributeError) as exc:
        raise ValueError(f"{name}: malformed fields ({type(exc).__name__}: {exc})") from None


def _build(cls: type, data: dict[str, Any]) -> ev.Event | ev.Action:
    data = dict(data)
    data.pop("type")
    if cls is ev.NodesIdle:
        data["nodes"] = tuple(ev.IdleNode(**n) for n in data.get("nodes", ()))
    elif cls is ev.JobSubmitted:
        data["job"] = _request(data["job"])
    elif cls is ev.JobEnded and "reason" in data:
        data["reason"] = ev.EndReason(data["reason"])
    for key in ("nodes",):
        if key in data and isinstance(data[key], list):
            data[key] = tuple(data[key])
    return cls(**data)  # type: ignore[no-any-return]
