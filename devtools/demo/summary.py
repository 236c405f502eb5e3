"""The demo's summary, computed from Slurm's own records and the workers' counters.

Nothing here reads the daemon's plan. The inputs are:

* **samples** of ``squeue`` and ``sinfo`` taken by the demo every ~2 s (:class:`Sample`):
  a node runs *prod* work when a ``prod`` job is RUNNING or COMPLETING on it, is *harvested*
  when an elastic task (partition ``preemptable``) is RUNNING on it, is *down* when sinfo says
  down, drained or failing, and is *idle* (free for harvesting) otherwise. Each sample's state
  holds until the next one, so node-seconds are sums of count × interval.
* **prod job records** of ``scontrol -o show job`` (accounting is off in partition mode).
* the **counter files** ``counters.json`` that rank 0 of every elastic job keeps beside its
  checkpoint (samples trained, epochs and world sizes seen, restarts).
* **slurmctld's log**, when at hand: each prod job's start and end to the millisecond
  (:func:`prod_busy_from_log`). The idle and harvested node-seconds are then exact
  (:func:`exact_node_seconds`): a node freed or taken between two samples counts from that
  moment, not from the next sample. On the 2-s samples alone, the harvested share of four
  demo runs was off by −1.0 to +0.8 points (those figures stay in the summary as
  ``*_sampled``).

A *rescale* is a change of an elastic job's RUNNING task count between two samples while it
runs (its first start and its end are not rescales); changes faster than the sampling interval
are not seen. *Preemptions* are counted from slurmctld's log when it is at hand (each
"preempted JobId=... has been requeued to reclaim resources" line), else from the samples (a
task that stopped on a node that runs prod work at the next sample).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from malletrain_core.backends.slurm.parse import parse_scontrol_show_job, parse_time
from malletrain_core.hostlist import expand

from .report import format_summary, markdown  # noqa: F401 - importable from here too
from .slurmctld_log import (  # noqa: F401 - the summary's inputs, importable from here too
    PROD_PARTITION,
    Span,
    count_preemptions_in_log,
    elastic_starts,
    job_times,
    prod_busy_from_log,
)
from .worker_logs import (  # noqa: F401 - importable from here too
    STARTUP_PARTS,
    STEP_JOIN_S,
    read_counters,
    read_startups,
    read_step_logs,
    training_stretches,
)

ELASTIC_PARTITION = "preemptable"
SQUEUE_FORMAT = "%i|%F|%K|%P|%T|%N"
SINFO_FORMAT = "%N|%T"
DOWN_STATES = ("down", "drain", "fail", "not_responding", "unknown", "future")
KEYS = ("idle_node_seconds", "harvested_node_seconds", "harvested_share", "samples",
        "rescales", "preemptions", "prod_start_delay_s")


@dataclass(frozen=True)
class Sample:
    """The cluster at time ``t`` (Unix seconds), as squeue and sinfo saw it."""

    t: float
    prod: frozenset[str]
    harvested: dict[str, str]  # node → elastic job (array job id)
    down: frozenset[str] = frozenset()
    pending_prod: int = 0
    jobs: dict[str, int] = field(default_factory=dict)  # elastic job → RUNNING tasks

    @classmethod
    def parse(cls, t: float, squeue: str, sinfo: str = "") -> Sample:
        """From ``squeue -h -a -o '%i|%F|%K|%P|%T|%N'`` and ``sinfo -h -N -o '%N|%T'``."""
        prod: set[str] = set()
        harvested: dict[str, str] = {}
        jobs: dict[str, int] = {}
        pending = 0
        for line in squeue.splitlines():
            parts = line.strip().split("|")
            if len(parts) != 6:
                continue
            _, array, _task, partition, state, nodelist = parts
            state = state.upper()
            if partition == PROD_PARTITION:
                if state in ("RUNNING", "COMPLETING"):
                    prod.update(expand(nodelist))
                elif state == "PENDING":
                    pending += 1
            elif partition == ELASTIC_PARTITION:
                jobs.setdefault(array, 0)
                if state == "RUNNING":
                    for node in expand(nodelist):
                        harvested[node] = array
                        jobs[array] += 1
        down = set()
        for line in sinfo.splitlines():
            name, _, state = line.strip().partition("|")
            if name and state.lower().rstrip("*~#!%$@^-").startswith(DOWN_STATES):
                down.add(name)
        harvested = {n: j for n, j in harvested.items() if n not in prod}
        return cls(t, frozenset(prod), harvested, frozenset(down), pending, jobs)

    def to_json(self) -> dict[str, Any]:
        return {"t": self.t, "prod": sorted(self.prod), "harvested": self.harvested,
                "down": sorted(self.down), "pending_prod": self.pending_prod,
                "jobs": self.jobs}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Sample:
        return cls(float(d["t"]), frozenset(d["prod"]), dict(d["harvested"]),
                   frozenset(d.get("down", ())), int(d.get("pending_prod", 0)),
                   {str(k): int(v) for k, v in d.get("jobs", {}).items()})


def node_seconds(samples: Sequence[Sample], nodes: int) -> tuple[float, float]:
    """(idle, harvested) node-seconds: idle counts every node neither in prod work nor down,
    harvested the idle ones running an elastic task."""
    idle = harvested = 0.0
    for a, b in zip(samples, samples[1:]):
        dt = b.t - a.t
        idle += (nodes - len(a.prod | a.down)) * dt
        harvested += len(a.harvested) * dt
    return idle, harvested


def stepping_node_seconds(samples: Sequence[Sample],
                          steps: Mapping[str, Sequence[tuple[float, float]]],
                          join_s: float = STEP_JOIN_S) -> float:
    """Idle node-seconds in which a worker completed training steps: for every sampling
    interval and every node idle in it (neither in prod work nor down), the part of the
    interval covered by that node's completed steps (:func:`training_stretches`). Starting a
    worker, waiting to be placed, re-forming and a step cut short by a preemption count
    nothing."""
    total = 0.0
    stretches = {node: training_stretches(s, join_s) for node, s in steps.items()}
    for a, b in zip(samples, samples[1:]):
        busy = a.prod | a.down
        for node, spans in stretches.items():
            if node in busy:
                continue
            for start, end in spans:
                total += max(0.0, min(end, b.t) - max(start, a.t))
    return total



def _complement(busy: Iterable[Span], t0: float, t1: float) -> list[Span]:
    """The parts of ``[t0, t1]`` that no span of ``busy`` covers."""
    out: list[Span] = []
    cur = t0
    for start, end in sorted(busy):
        if end <= cur:
            continue
        if start > cur:
            out.append((cur, min(start, t1)))
        cur = max(cur, end)
        if cur >= t1:
            break
    if cur < t1:
        out.append((cur, t1))
    return [(a, b) for a, b in out if b > a]


def _intersect(xs: Sequence[Span], ys: Sequence[Span]) -> list[Span]:
    """The intersection of two sorted lists of disjoint spans."""
    out: list[Span] = []
    i = j = 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append((a, b))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def _idle_stretches(samples: Sequence[Sample], node: str,
                    prod_busy: Mapping[str, Sequence[Span]]) -> list[Span]:
    """The spans between the first and the last sample in which ``node`` held no prod job
    (``prod_busy``) and was not down at the sample before."""
    busy = list(prod_busy.get(node, ()))
    busy += [(a.t, b.t) for a, b in zip(samples, samples[1:]) if node in a.down]
    return _complement(busy, samples[0].t, samples[-1].t)


def exact_node_seconds(samples: Sequence[Sample], node_names: Iterable[str],
                       prod_busy: Mapping[str, Sequence[Span]],
                       steps: Mapping[str, Sequence[Span]] | None = None,
                       join_s: float = STEP_JOIN_S) -> tuple[float, float]:
    """(idle, harvested) node-seconds between the first and the last sample, with prod work
    from :func:`prod_busy_from_log` instead of the samples: a node is idle whenever no prod job
    holds it and it was not down at the sample before; harvested counts the idle seconds
    inside its worker's training stretches (:func:`training_stretches`; 0 without ``steps``)."""
    if len(samples) < 2:
        return 0.0, 0.0
    idle = harvested = 0.0
    for node in node_names:
        free = _idle_stretches(samples, node, prod_busy)
        idle += sum(b - a for a, b in free)
        if steps is not None and node in steps:
            stretches = training_stretches(steps[node], join_s)
            harvested += sum(b - a for a, b in _intersect(free, stretches))
    return idle, harvested


IDLE_PARTS = ("harvested", "start_up", "start_never_reached_a_step", "grant",
              "no_task_granted", "between_steps", "last_step_to_prod")


def idle_breakdown(samples: Sequence[Sample], node_names: Iterable[str],
                   prod_busy: Mapping[str, Sequence[Span]],
                   starts: Mapping[str, Sequence[float]],
                   steps: Mapping[str, Sequence[Span]],
                   join_s: float = STEP_JOIN_S) -> dict[str, float]:
    """Where the idle node-seconds of :func:`exact_node_seconds` went, node-seconds per part
    (:data:`IDLE_PARTS`; they add up to the idle total). Each stretch in which a node was idle
    (no prod job, not down) is cut at the first elastic task that started in it (``starts``,
    :func:`elastic_starts`) and at the first and last training stretch of its worker:
    ``grant`` (the prod job's end to that task's start), ``start_up`` (the task's start to its
    first step), ``harvested`` (inside training stretches), ``between_steps`` (pauses,
    re-forms and later starts between them), ``last_step_to_prod`` (the last step's end to the
    stretch's end: the step in flight, the kill, the next prod job's start).
    ``no_task_granted`` is a stretch no task started in, ``start_never_reached_a_step`` one
    whose task started but never completed a step."""
    out = dict.fromkeys(IDLE_PARTS, 0.0)
    if len(samples) < 2:
        return out
    for node in node_names:
        stretches = training_stretches(steps.get(node, ()), join_s)
        times = sorted(starts.get(node, ()))
        for a, b in _idle_stretches(samples, node, prod_busy):
            inside = _intersect([(a, b)], stretches)
            trained = sum(y - x for x, y in inside)
            out["harvested"] += trained
            first = next((t for t in times if a - 1e-3 <= t < b), None)
            if first is None:
                out["no_task_granted"] += b - a - trained
                continue
            first = max(a, first)
            if not inside:
                out["grant"] += first - a
                out["start_never_reached_a_step"] += b - first
                continue
            out["grant"] += min(first, inside[0][0]) - a
            out["start_up"] += max(0.0, inside[0][0] - first)
            out["between_steps"] += inside[-1][1] - inside[0][0] - trained
            out["last_step_to_prod"] += b - inside[-1][1]
    return {k: round(v, 1) for k, v in out.items()}


def startup_summary(startups: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """Count, median and p90 of the start-ups' totals, and the median of each part."""
    if not startups:
        return {"count": 0}
    totals = [s["total"] for s in startups]
    return {"count": len(startups), "median_s": round(statistics.median(totals), 2),
            "p90_s": round(_percentile(totals, 0.9), 2),
            "parts_median_s": {k: round(statistics.median(s[k] for s in startups), 2)
                               for k in STARTUP_PARTS}}


def idle_within_cap(samples: Sequence[Sample], nodes: int, cap_per_job: int) -> float:
    """Idle node-seconds the elastic jobs in the queue could hold at most (each job capped at
    ``cap_per_job`` nodes): the ceiling of the harvested node-seconds."""
    total = 0.0
    for a, b in zip(samples, samples[1:]):
        idle = nodes - len(a.prod | a.down)
        total += min(idle, cap_per_job * len(a.jobs)) * (b.t - a.t)
    return total


def scale_changes(samples: Sequence[Sample]) -> tuple[int, int]:
    """(rescales, preemptions) seen between consecutive samples (see the module doc)."""
    rescales = preemptions = 0
    for a, b in zip(samples, samples[1:]):
        for job, before in a.jobs.items():
            after = b.jobs.get(job, 0)
            if before > 0 and after > 0 and before != after:
                rescales += 1
        for node, job in a.harvested.items():
            if b.harvested.get(node) != job and node in b.prod:
                preemptions += 1
    return rescales, preemptions


@dataclass(frozen=True)
class ProdStart:
    """When a prod job became startable and when it started (Unix seconds)."""

    job: str
    name: str
    startable: float
    start: float

    @property
    def delay_s(self) -> float:
        return self.start - self.startable


def prod_starts(records: Iterable[Mapping[str, str]], log_text: str = "") -> list[ProdStart]:
    """Start times of the prod jobs that started, and when each became *startable*.

    A prod job is startable once it is eligible (``EligibleTime``: submitted, no begin time
    or dependency holding it) and every node it runs on has been released by the prod job
    that ran there before it (the latest ``EndTime`` ≤ its ``StartTime`` among the prod jobs
    sharing a node with it). That is the moment it would have started on a cluster without
    MalleTrain; the delay after it is what the preemption of elastic tasks (and Slurm's own
    scheduling latency) cost. The records' times are Slurm's, at one-second resolution; with
    ``log_text`` (slurmctld's log) each job's submission, start and end are taken from the
    log to the millisecond where it has them (a begin time later than the submission still
    counts, from the record).
    """
    submitted, started, ended = job_times(log_text)
    rows: list[tuple[str, str, float, float, float | None, set[str]]] = []
    for rec in records:
        if rec.get("Partition") != PROD_PARTITION:
            continue
        start = parse_time(rec.get("StartTime", ""))
        state = rec.get("JobState", "")
        nodelist = rec.get("NodeList", "")
        if start is None or state in ("PENDING", "") or nodelist in ("", "(null)"):
            continue
        eligible = parse_time(rec.get("EligibleTime", "")) or parse_time(
            rec.get("SubmitTime", "")) or start
        end = parse_time(rec.get("EndTime", ""))
        job = rec.get("JobId", "")
        if job in started:
            start = started[job]
            eligible = max(eligible, submitted.get(job, -math.inf))
            end = ended.get(job, end)
        rows.append((job, rec.get("JobName", ""), eligible, start, end,
                     set(expand(nodelist))))
    out = []
    for job, name, eligible, start, _end, nodes in rows:
        released = [e for j, _, _, s, e, ns in rows if j != job and e is not None
                    and s < start and e <= start and ns & nodes]
        out.append(ProdStart(job, name, max([eligible, *released]), start))
    return sorted(out, key=lambda p: p.start)


def prod_records(scontrol_text: str) -> list[dict[str, str]]:
    """The prod-partition records of ``scontrol -o show job`` output."""
    return [r for r in parse_scontrol_show_job(scontrol_text)
            if r.get("Partition") == PROD_PARTITION]


def _interval(samples: Sequence[Sample]) -> float:
    """The median time between two samples (0 with fewer than two)."""
    gaps = [b.t - a.t for a, b in zip(samples, samples[1:])]
    return statistics.median(gaps) if gaps else 0.0


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(samples: Sequence[Sample], prod_records: Iterable[Mapping[str, str]],
              counters: Mapping[str, Mapping[str, Any]], nodes: int,
              logged_preemptions: int | None = None,
              cap_per_job: int | None = None,
              steps: Mapping[str, Sequence[tuple[float, float]]] | None = None,
              prod_busy: Mapping[str, Sequence[Span]] | None = None,
              node_names: Sequence[str] = (), prod_log: str = "") -> dict[str, Any]:
    """The summary: exactly :data:`KEYS` first, then details. ``logged_preemptions`` (from
    slurmctld's log, exact) replaces the count seen in the samples when given; with
    ``cap_per_job`` (the elastic jobs' node maximum) the idle node-seconds within that cap are
    added. With ``steps`` (the workers' step logs, :func:`read_step_logs`) the harvested
    node-seconds are those in which a worker completed steps (:func:`stepping_node_seconds`),
    and the node-seconds an elastic task merely held (RUNNING in squeue) are a detail;
    without, they are the held ones. With ``prod_busy`` (:func:`prod_busy_from_log`, not
    empty) and ``node_names`` the idle and harvested node-seconds are exact
    (:func:`exact_node_seconds`); the figures from the samples stay as ``*_sampled``."""
    idle, held = node_seconds(samples, nodes)
    harvested = held if steps is None else stepping_node_seconds(samples, steps)
    sampled = {"idle_node_seconds_sampled": round(idle, 1),
               "harvested_node_seconds_sampled": round(harvested, 1),
               "harvested_share_sampled": round(harvested / idle, 4) if idle > 0 else 0.0}
    exact = bool(prod_busy) and bool(node_names) and steps is not None
    if exact:
        assert prod_busy is not None and steps is not None
        idle, harvested = exact_node_seconds(samples, node_names, prod_busy, steps)
    rescales, seen = scale_changes(samples)
    preemptions = seen if logged_preemptions is None else logged_preemptions
    starts = prod_starts(prod_records, prod_log)
    delays = [p.delay_s for p in starts]
    jobs = {job: {"samples": int(c.get("samples", 0)), "steps": int(c.get("steps", 0)),
                  "restarts": int(c.get("restarts", 0)),
                  "world_sizes": list(c.get("world_sizes", [])), "cell": c.get("cell", "")}
            for job, c in sorted(counters.items())}
    peak = {job: max((s.jobs.get(job, 0) for s in samples), default=0) for job in jobs}
    for job, info in jobs.items():
        info["max_running_tasks"] = peak[job]
    span = samples[-1].t - samples[0].t if len(samples) > 1 else 0.0
    return {
        "idle_node_seconds": round(idle, 1),
        "harvested_node_seconds": round(harvested, 1),
        "harvested_share": round(harvested / idle, 4) if idle > 0 else 0.0,
        "samples": sum(j["samples"] for j in jobs.values()),
        "rescales": rescales,
        "preemptions": preemptions,
        "prod_start_delay_s": round(statistics.median(delays), 2) if delays else None,
        "prod_start_delay_p90_s": round(_percentile(delays, 0.9), 2) if delays else None,
        "prod_jobs_started": len(starts),
        "prod_start_delay_counted_from": (
            "slurmctld.log: submission, start and end to the millisecond" if prod_log
            else "scontrol show job: Slurm's times, to the second"),
        "preemptions_seen_in_samples": seen,
        "nodes": nodes,
        "span_s": round(span, 1),
        "squeue_samples": len(samples),
        "worker_restarts": sum(j["restarts"] for j in jobs.values()),
        "harvest_counted_from": "squeue (elastic task RUNNING)" if steps is None else
        "workers' step logs (time inside completed steps)",
        "idle_counted_from": "slurmctld.log: prod jobs' start and end, to the millisecond"
        if exact else f"squeue every {_interval(samples):.0f} s",
        **(sampled if exact else {}),
        "held_node_seconds": round(held, 1),
        "idle_not_held_node_seconds": round(max(0.0, sampled["idle_node_seconds_sampled"]
                                                - held), 1),
        "held_not_training_node_seconds": round(
            max(0.0, held - sampled["harvested_node_seconds_sampled"]), 1),
        **({"where_idle_went": idle_breakdown(samples, node_names, prod_busy or {},
                                              elastic_starts(prod_log), steps or {})}
           if exact and prod_log else {}),
        **({} if cap_per_job is None else {
            "idle_node_seconds_within_cap": round(idle_within_cap(samples, nodes,
                                                                  cap_per_job), 1)}),
        "jobs": jobs,
    }
