"""Reading a snapshot of format 1 (written by malletraind before snapshots were state dicts).

Format 1 was a walk of the engine's objects: every attribute of every object under the engine,
by its name at the time, with tags for dicts, lists, sets, tuples, deques, enums, numpy values
and shared references (``{"R": n}``). That layout is frozen here: it is decoded into plain
data, no class named in it is loaded or built, and the table below turns it into the
engine's :meth:`~malletrain_core.engine.engine.Engine.state_dict` (format 2), which the engine
then loads as any other. The engine's fields can change freely; only a change of what its
state dict holds touches this table.

Errors are KeyError, TypeError or ValueError, which :func:`.snapshot.restore` reports.
"""

from __future__ import annotations

import math
from typing import Any

RUN_FIELDS = ("job_id", "scales", "upward", "probe", "extension", "index", "step_start",
              "step_size", "lender", "cut")
"""The fields of a profiling run in format 1 (and in the state dict)."""


class _Plain:
    """Format 1's tagged JSON as plain data: objects become dicts of their attributes,
    tuples stay tuples (keys of dicts), the other collections become lists or dicts."""

    def __init__(self) -> None:
        self.memo: dict[int, Any] = {}

    def dec(self, node: Any) -> Any:
        if not isinstance(node, dict):
            if isinstance(node, list):
                raise ValueError("a bare list")
            return node
        if "R" in node:
            if node["R"] not in self.memo:
                raise ValueError(f"reference {node['R']} before its object")
            return self.memo[node["R"]]
        if "X" in node:
            return None  # the configuration or the policy: not state
        if "F" in node:
            return float(node["F"])
        if "E" in node:
            _check(node["E"])
            return self.dec(node["v"])
        if "N" in node:
            return self.dec(node["v"])
        for tag in ("T", "Z"):
            if tag in node:
                return tuple(self.dec(x) for x in node[tag])
        if "C" in node:
            return int(node["C"])
        for tag in ("L", "S", "Q", "A"):
            if tag in node:
                out: list[Any] = []
                self.memo[node[tag]] = out
                out.extend(self.dec(x) for x in node["v"])
                return out
        for tag in ("D", "O"):
            if tag in node:
                if tag == "O":
                    _check(node["c"])
                obj: dict[Any, Any] = {}
                self.memo[node[tag]] = obj
                for key, value in node["v"]:
                    obj[self.dec(key)] = self.dec(value)
                return obj
        raise ValueError(f"unknown node {sorted(node)!r}")


def _check(name: str) -> None:
    module = name.partition(":")[0]
    if not (module == "malletrain_core" or module.startswith("malletrain_core.")):
        raise ValueError(f"snapshot names class {name!r} outside malletrain_core; the state "
                         "file was not written by malletraind")


def state(body: dict[str, Any]) -> dict[str, Any]:
    """The state dict of a format-1 snapshot (of one engine, or of a router's engines)."""
    if "engines" in body:
        return {"routes": body["routes"],
                "engines": {name: _body(one) for name, one in body["engines"].items()}}
    return _body(body)


def _body(body: dict[str, Any]) -> dict[str, Any]:
    old = _Plain().dec(body["state"])
    pool, monitor, advisor = old["_pool"], old["_monitor"], old["_advisor"]
    return {
        "now": None if old["_now"] == -math.inf else old["_now"],
        "next_order": old["_order"],
        "jobs": {jid: _job(rec) for jid, rec in old["_jobs"].items()},
        "queue": list(old["_queue"]), "admitted": list(old["_admitted"]),
        "ended": old["_ended"],
        "store": {model: _curve(curve) for model, curve in old["_store"].items()},
        "pool": {"hole_end": pool["hole_end"], "group": pool["group"], "since": pool["since"],
                 "free": sorted(pool["free"]), "owner": pool["owner"],
                 "held": {job: sorted(names) for job, names in pool["held"].items()},
                 "delta": {job: [before, sorted(out), sorted(into)]
                           for job, (before, out, into) in pool["delta"].items()}},
        "monitor": {"tracks": {job: _track(t) for job, t in monitor["_tracks"].items()},
                    "all_up": monitor["_all_up"], "all_down": monitor["_all_down"]},
        "profiler": {"runs": {job: {k: run[k] for k in RUN_FIELDS}
                              for job, run in advisor["runs"].items()},
                     "borrower": advisor["borrower"], "sent_back": list(advisor["sent_back"]),
                     "remeasured": sorted([job, k] for job, k in advisor["remeasured"])},
        "stats": old["_stats"],
        "lifetime": body.get("lifetime"),
    }


def _curve(curve: dict[str, Any] | None) -> dict[str, list[Any]] | None:
    if curve is None:
        return None
    return {"nodes": list(curve["nodes"]), "throughput": list(curve["throughput"])}


def _job(rec: dict[str, Any]) -> dict[str, Any]:
    probe = rec["probe_point"]
    return {"req": {**rec["req"], "curve": _curve(rec["req"]["curve"])}, "order": rec["order"],
            "submitted": rec["submitted"], "phase": rec["phase"], "prior": _curve(rec["prior"]),
            "source": rec["source"], "last_interrupted": rec["last_interrupted"],
            "probe_point": None if probe is None else list(probe),
            "curve": _curve(rec["curve"]), "curve_version": rec["_curve_version"]}


def _track(track: dict[str, Any]) -> dict[str, Any]:
    seg = track["segment"]
    if seg is not None:
        seg = {**seg, "intervals": [list(i) for i in seg["intervals"]],
               "others": list(seg["others"].items())}
    return {**track, "segment": seg, "rates": list(track["rates"].items()),
            "full": sorted(track["full"])}
