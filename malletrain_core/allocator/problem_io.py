"""Allocation problems as JSON: strict reading (every mistake named with its file) and writing.

The format::

    {"nodes": 460, "lookahead_s": 120, "objective": "throughput",
     "jobs": [{"id": "j1", "min_nodes": 1, "max_nodes": 64, "current_nodes": 3,
               "owner": "alice", "model": "resnet18",
               "curve": {"nodes": [1, 2, 4], "throughput": [100, 190, 350]},
               "scale_up_s": 18, "scale_down_s": 12}],
     "constraints": {"user_max_nodes": {"alice": 32}, "min_share": 0.1,
                     "max_running_jobs": 20}}

``nodes``, ``jobs`` and, per job, ``id``, ``max_nodes`` and ``curve`` are required; everything
else has the defaults of :mod:`malletrain_core.model`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

from ..errors import InputFileError, ValidationError
from ..model import DEFAULT_LOOKAHEAD_S, Constraints, Curve, Job, Objective, Problem

TOP_KEYS = ("nodes", "jobs", "lookahead_s", "objective", "constraints")
JOB_KEYS = ("id", "max_nodes", "curve", "min_nodes", "current_nodes", "owner", "model",
            "scale_up_s", "scale_down_s")
CURVE_KEYS = ("nodes", "throughput")
CONSTRAINT_KEYS = ("user_max_nodes", "min_share", "max_running_jobs")


class _Reader:
    """Checks one decoded document, raising :class:`InputFileError` naming ``source``."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, problem: str) -> InputFileError:
        return InputFileError(self.source, f"{where}: {problem}")

    def mapping(self, value: Any, where: str, keys: tuple[str, ...],
                required: tuple[str, ...]) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, f"must be a JSON object, not {type(value).__name__}")
        unknown = sorted(set(value) - set(keys))
        if unknown:
            raise self.fail(where, f"unknown key {unknown[0]!r}; valid keys: {', '.join(keys)}")
        missing = [k for k in required if k not in value]
        if missing:
            raise self.fail(where, f"missing required key {missing[0]!r}")
        return value

    def integer(self, value: Any, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(where, f"{value!r} must be a whole number")
        return value

    def number(self, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(where, f"{value!r} must be a number")
        return float(value)

    def string(self, value: Any, where: str) -> str:
        if not isinstance(value, str):
            raise self.fail(where, f"{value!r} must be a string")
        return value

    def curve(self, value: Any, where: str) -> Curve:
        data = self.mapping(value, where, CURVE_KEYS, CURVE_KEYS)
        for key in CURVE_KEYS:
            if not isinstance(data[key], list):
                raise self.fail(f"{where}.{key}", "must be a list")
        nodes = [self.integer(n, f"{where}.nodes") for n in data["nodes"]]
        throughput = [self.number(p, f"{where}.throughput") for p in data["throughput"]]
        return Curve.of(nodes, throughput, where=where)

    def job(self, value: Any, index: int) -> Job:
        where = f"jobs[{index}]"
        if isinstance(value, dict) and isinstance(value.get("id"), str):
            where += f" ({value['id']!r})"
        data = self.mapping(value, where, JOB_KEYS, ("id", "max_nodes", "curve"))
        job_id = self.string(data["id"], f"{where}.id")
        kwargs: dict[str, Any] = {"id": job_id, "curve": self.curve(data["curve"], f"{where}.curve")}
        for key in ("max_nodes", "min_nodes", "current_nodes"):
            if key in data:
                kwargs[key] = self.integer(data[key], f"{where}.{key}")
        for key in ("scale_up_s", "scale_down_s"):
            if key in data:
                kwargs[key] = self.number(data[key], f"{where}.{key}")
        for key in ("owner", "model"):
            if key in data:
                kwargs[key] = self.string(data[key], f"{where}.{key}")
        return Job(**kwargs)

    def constraints(self, value: Any) -> Constraints:
        data = self.mapping(value, "constraints", CONSTRAINT_KEYS, ())
        kwargs: dict[str, Any] = {}
        if "user_max_nodes" in data:
            caps = data["user_max_nodes"]
            if not isinstance(caps, dict):
                raise self.fail("constraints.user_max_nodes", "must map owner names to node caps")
            kwargs["user_max_nodes"] = {
                user: self.integer(cap, f"constraints.user_max_nodes.{user}")
                for user, cap in caps.items()}
        if "min_share" in data:
            kwargs["min_share"] = self.number(data["min_share"], "constraints.min_share")
        if data.get("max_running_jobs") is not None:
            kwargs["max_running_jobs"] = self.integer(data["max_running_jobs"],
                                                      "constraints.max_running_jobs")
        return Constraints(**kwargs)

    def problem(self, value: Any) -> Problem:
        data = self.mapping(value, "top level", TOP_KEYS, ("nodes", "jobs"))
        if not isinstance(data["jobs"], list):
            raise self.fail("jobs", "must be a list of job objects")
        objective = data.get("objective", Objective.THROUGHPUT.value)
        choices = [o.value for o in Objective]
        if objective not in choices:
            raise self.fail("objective", f"{objective!r} is unknown; choose one of "
                            f"{', '.join(choices)}")
        lookahead = self.number(data.get("lookahead_s", DEFAULT_LOOKAHEAD_S), "lookahead_s")
        return Problem(
            nodes=self.integer(data["nodes"], "nodes"),
            jobs=tuple(self.job(j, i) for i, j in enumerate(data["jobs"])),
            lookahead_s=lookahead, objective=Objective(objective),
            constraints=self.constraints(data.get("constraints", {})))


def problem_from_dict(data: Any, source: str = "<problem>") -> Problem:
    """Validate a decoded JSON document; errors are :class:`InputFileError` naming ``source``."""
    try:
        return _Reader(source).problem(data)
    except ValidationError as err:
        raise InputFileError(source, str(err)) from None


def load_problem(path: str) -> Problem:
    """Read a problem from a JSON file, or from standard input when ``path`` is ``-``."""
    source = "<stdin>" if path == "-" else path
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
    except OSError as exc:
        raise InputFileError(source, f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InputFileError(source, "is not UTF-8 text; give a JSON problem file") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputFileError(source, f"not valid JSON: {exc.msg} (column {exc.colno})",
                             exc.lineno) from None
    return problem_from_dict(data, source)


def problem_to_dict(problem: Problem) -> dict[str, Any]:
    """The JSON form of ``problem`` (what :func:`load_problem` reads back)."""
    jobs = []
    for job in problem.jobs:
        assert job.curve is not None
        jobs.append({"id": job.id, "min_nodes": job.min_nodes, "max_nodes": job.max_nodes,
                     "current_nodes": job.current_nodes, "owner": job.owner, "model": job.model,
                     "curve": job.curve.to_dict(), "scale_up_s": job.scale_up_s,
                     "scale_down_s": job.scale_down_s})
    cons = problem.constraints
    out: dict[str, Any] = {"nodes": problem.nodes, "lookahead_s": problem.lookahead_s,
                           "objective": problem.objective.value, "jobs": jobs}
    if cons.active:
        out["constraints"] = {"user_max_nodes": dict(cons.user_max_nodes),
                              "min_share": cons.min_share,
                              "max_running_jobs": cons.max_running_jobs}
    return out
