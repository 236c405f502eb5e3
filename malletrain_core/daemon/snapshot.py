"""Snapshots of the engine's state, for compacting the daemon's journal.

The engine is a function of the events it consumed; a snapshot is that function's value at one
journal position, so that the journal before it can go. It is JSON: a walk of the engine's
objects (dataclasses and plain classes of this package, dicts, lists, sets, tuples, deques,
enums, numpy arrays and scalars) that keeps shared references (a job's node set is the pool's
set) and the order of every dict and set, and refuses anything else by name — no code is ever
loaded from the state file (no pickle): only classes under ``malletrain_core`` can be named, and
objects are rebuilt attribute by attribute without calling their constructors.

What is configuration and not state is not in the snapshot: the engine's :class:`EngineConfig`
and policy come from the configuration the daemon is started with, as in a replay of the whole
journal. The reclaim predictor's learned fragment counts, kept inside the configuration, are
state and are carried separately.
"""

from __future__ import annotations

import enum
import importlib
import itertools
import json
import math
from collections import deque
from typing import Any

import numpy as np

from ..engine.router import trainers
from ..errors import MalleTrainError

FORMAT = 1
"""Version of the snapshot layout; a snapshot of another version is refused by name."""

_NOT_STATE = ("config", "_policy", "name")
"""Engine attributes that come from the configuration, not from events."""


class SnapshotError(MalleTrainError):
    """A snapshot cannot be written or read."""


class CorruptSnapshot(SnapshotError):
    """A stored snapshot does not decode (as opposed to one of another format version)."""


def _class_name(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}:{cls.__qualname__}"


def _load_class(name: str) -> type:
    module, _, qual = name.partition(":")
    if not (module == "malletrain_core" or module.startswith("malletrain_core.")) or not qual:
        raise SnapshotError(f"snapshot names class {name!r} outside malletrain_core; the state "
                            "file was not written by malletraind: remove it and restart")
    try:
        target: Any = importlib.import_module(module)
        for part in qual.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError):
        raise SnapshotError(f"snapshot names class {name!r}, which this version does not have; "
                            "restart the version that wrote it or remove state.db") from None
    if not isinstance(target, type):
        raise SnapshotError(f"snapshot names {name!r}, which is not a class")
    return target


class _Encoder:
    def __init__(self, externals: dict[int, str]) -> None:
        self.externals = externals
        self.memo: dict[int, int] = {}
        self.keep: list[object] = []  # keeps every memoised object alive (ids stay unique)

    def _id(self, obj: object) -> tuple[int, bool]:
        key = id(obj)
        if key in self.memo:
            return self.memo[key], False
        self.memo[key] = n = len(self.memo)
        self.keep.append(obj)
        return n, True

    def enc(self, obj: Any) -> Any:
        if isinstance(obj, enum.Enum):  # before str and int: str- and int-valued enums
            return {"E": _class_name(obj), "v": self.enc(obj.value)}
        if obj is None or type(obj) in (bool, int, str):
            return obj
        if type(obj) is float:
            return obj if math.isfinite(obj) else {"F": repr(obj)}
        if id(obj) in self.externals:
            return {"X": self.externals[id(obj)]}
        if isinstance(obj, np.generic):
            return {"N": obj.dtype.str, "v": self.enc(obj.item())}
        if isinstance(obj, tuple) and type(obj) is tuple:
            return {"T": [self.enc(x) for x in obj]}
        if isinstance(obj, frozenset):
            return {"Z": [self.enc(x) for x in obj]}
        if isinstance(obj, itertools.count):
            text = repr(obj)  # "count(N)": the next number it gives
            return {"C": int(text[text.index("(") + 1:text.index(")")])}
        n, new = self._id(obj)
        if not new:
            return {"R": n}
        if type(obj) is list:
            return {"L": n, "v": [self.enc(x) for x in obj]}
        if type(obj) is set:
            return {"S": n, "v": [self.enc(x) for x in obj]}
        if type(obj) is dict:
            return {"D": n, "v": [[self.enc(k), self.enc(v)] for k, v in obj.items()]}
        if type(obj) is deque:
            return {"Q": n, "m": obj.maxlen, "v": [self.enc(x) for x in obj]}
        if isinstance(obj, np.ndarray):
            if obj.dtype.kind not in "biuf":
                raise SnapshotError(f"cannot snapshot a numpy array of dtype {obj.dtype}")
            return {"A": n, "d": obj.dtype.str, "s": list(obj.shape),
                    "v": [self.enc(x) for x in obj.ravel().tolist()]}
        name = _class_name(obj)
        if not name.startswith("malletrain_core") or not hasattr(obj, "__dict__") or \
                isinstance(obj, type):
            raise SnapshotError(f"cannot snapshot a {name} object; it is not engine state "
                                "(add it to the snapshot's externals or make it plain data)")
        return {"O": n, "c": name, "v": [[k, self.enc(v)] for k, v in vars(obj).items()]}


class _Decoder:
    def __init__(self, externals: dict[str, Any]) -> None:
        self.externals = externals
        self.memo: dict[int, Any] = {}

    def dec(self, node: Any) -> Any:
        if not isinstance(node, dict):
            if isinstance(node, list):
                raise SnapshotError("malformed snapshot: a bare list")
            return node
        if "R" in node:
            try:
                return self.memo[node["R"]]
            except KeyError:
                raise SnapshotError(f"malformed snapshot: reference {node['R']} before its "
                                    "object") from None
        if "X" in node:
            if node["X"] not in self.externals:
                raise SnapshotError(f"malformed snapshot: unknown external {node['X']!r}")
            return self.externals[node["X"]]
        if "F" in node:
            return float(node["F"])
        if "E" in node:
            return _load_class(node["E"])(self.dec(node["v"]))
        if "N" in node:
            return np.dtype(node["N"]).type(self.dec(node["v"]))
        if "T" in node:
            return tuple(self.dec(x) for x in node["T"])
        if "Z" in node:
            return frozenset(self.dec(x) for x in node["Z"])
        if "C" in node:
            return itertools.count(int(node["C"]))
        for tag, make in (("L", list), ("S", set), ("D", dict)):
            if tag in node:
                out: Any = make()
                self.memo[node[tag]] = out
                if tag == "L":
                    out.extend(self.dec(x) for x in node["v"])
                elif tag == "S":
                    for x in node["v"]:
                        out.add(self.dec(x))
                else:
                    for k, v in node["v"]:
                        key = self.dec(k)
                        out[key] = self.dec(v)
                return out
        if "Q" in node:
            q: deque[Any] = deque(maxlen=node["m"])
            self.memo[node["Q"]] = q
            q.extend(self.dec(x) for x in node["v"])
            return q
        if "A" in node:
            arr = np.array([self.dec(x) for x in node["v"]], dtype=np.dtype(node["d"]))
            arr = arr.reshape(node["s"])
            self.memo[node["A"]] = arr
            return arr
        if "O" in node:
            cls = _load_class(node["c"])
            obj: Any = object.__new__(cls)
            self.memo[node["O"]] = obj
            for key, value in node["v"]:
                object.__setattr__(obj, key, self.dec(value))
            return obj
        raise SnapshotError(f"malformed snapshot: unknown node {sorted(node)!r}")


def _externals(engine: Any) -> dict[str, Any]:
    return {"config": engine.config, "policy": engine._policy}


def _body(engine: Any) -> dict[str, Any]:
    state = {k: v for k, v in vars(engine).items() if k not in _NOT_STATE}
    encoder = _Encoder({id(v): k for k, v in _externals(engine).items()})
    lifetime = engine.config.lifetime
    return {"engine": _class_name(engine), "state": encoder.enc(state),
            "lifetime": None if lifetime is None else lifetime.to_dict()}


def snapshot(engine: Any) -> str:
    """The engine's state as one JSON text (see the module docstring); a router of several
    trainers' engines is saved as its routing tables and one body per engine."""
    inner = trainers(engine)
    if inner is not None:
        body: dict[str, Any] = {
            "format": FORMAT, "engine": _class_name(engine),
            "routes": {"nodes": dict(engine._node_engine), "jobs": dict(engine._job_engine),
                       "unowned": sorted(engine._unowned)},
            "engines": {name: _body(one) for name, one in inner.items()}}
    else:
        body = {"format": FORMAT, **_body(engine)}
    return json.dumps(body, separators=(",", ":"))


def restore(engine: Any, text: str) -> None:
    """Load a :func:`snapshot` into a freshly built engine of the same class (its configuration
    and policy are kept)."""
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise CorruptSnapshot(f"the engine snapshot is not JSON ({exc}); remove state.db to "
                            "start empty (the daemon reconciles with the batch system)") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        got = body.get("format") if isinstance(body, dict) else None
        raise SnapshotError(f"engine snapshot format {got!r}, this version reads {FORMAT}; "
                            "restart the version that wrote it or remove state.db")
    inner = trainers(engine)
    if inner is not None:
        _check_class(engine, body)
        saved = body.get("engines")
        routes = body.get("routes")
        if not isinstance(saved, dict) or set(saved) != set(inner) or not isinstance(routes, dict):
            raise SnapshotError(f"the snapshot holds trainers {sorted(saved or [])}, the "
                                f"configuration {sorted(inner)}; restore the [[trainer]] "
                                "tables that wrote it or remove state.db")
        for name, one in inner.items():
            _restore_one(one, saved[name])
        try:
            engine._node_engine = {str(k): str(v) for k, v in routes["nodes"].items()}
            engine._job_engine = {str(k): str(v) for k, v in routes["jobs"].items()}
            engine._unowned = {str(n) for n in routes["unowned"]}
        except (KeyError, TypeError, AttributeError) as exc:
            raise SnapshotError(f"malformed engine snapshot routes ({exc}); remove state.db "
                                "to start empty") from None
        return
    _restore_one(engine, body)


def _check_class(engine: Any, body: dict[str, Any]) -> None:
    if body.get("engine") != _class_name(engine):
        raise SnapshotError(f"the snapshot is of a {body.get('engine')}, not of a "
                            f"{_class_name(engine)}")


def _restore_one(engine: Any, body: Any) -> None:
    if not isinstance(body, dict):
        raise SnapshotError("malformed engine snapshot: an engine's body is not a mapping")
    _check_class(engine, body)
    try:
        state = _Decoder(_externals(engine)).dec(body["state"])
    except (KeyError, TypeError, ValueError) as exc:
        raise SnapshotError(f"malformed engine snapshot ({type(exc).__name__}: {exc}); remove "
                            "state.db to start empty") from None
    if not isinstance(state, dict):
        raise SnapshotError("malformed engine snapshot: its state is not a mapping")
    for key, value in state.items():
        setattr(engine, key, value)
    lifetime = engine.config.lifetime
    learned = body.get("lifetime")
    if lifetime is not None and learned and learned.get("survival") is not None and \
            lifetime.survival is not None:
        lifetime.survival = type(lifetime).from_dict(learned).survival



def canonical(engine: Any) -> Any:
    """The engine's state as plain data with sets sorted and timings dropped, for comparing two
    engines (shared objects are written out at each place they occur)."""
    def walk(obj: Any, seen: tuple[int, ...]) -> Any:
        if obj is None or isinstance(obj, (bool, int, str)) and not isinstance(obj, enum.Enum):
            return obj
        if isinstance(obj, float):
            return obj if math.isfinite(obj) else repr(obj)
        if isinstance(obj, enum.Enum):
            return f"{_class_name(obj)}.{obj.name}"
        if isinstance(obj, np.generic):
            return walk(obj.item(), seen)
        if id(obj) in seen:
            return "<cycle>"
        inner = (*seen, id(obj))
        if isinstance(obj, (set, frozenset)):
            return sorted((walk(x, inner) for x in obj), key=repr)
        if isinstance(obj, (list, tuple, deque)):
            return [walk(x, inner) for x in obj]
        if isinstance(obj, np.ndarray):
            return walk(obj.tolist(), inner)
        if isinstance(obj, dict):
            return sorted(([walk(k, inner), walk(v, inner)] for k, v in obj.items()
                           if k != "solve_ms"), key=repr)
        if isinstance(obj, itertools.count):
            return repr(obj)
        if hasattr(obj, "__dict__") and _class_name(obj).startswith("malletrain_core"):
            return [_class_name(obj), walk({k: v for k, v in vars(obj).items()
                                            if k not in ("solve_ms", "_cache")}, inner)]
        return repr(obj)
    inner = trainers(engine)
    if inner is not None:
        return {"routes": [sorted(engine._node_engine.items()), sorted(engine._job_engine.items()),
                           sorted(engine._unowned)],
                "engines": {name: canonical(one) for name, one in inner.items()}}
    state = {k: v for k, v in vars(engine).items() if k not in _NOT_STATE}
    lifetime = engine.config.lifetime
    return walk({"state": state, "lifetime": None if lifetime is None else lifetime.to_dict()},
                ())
