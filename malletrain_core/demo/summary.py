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

import json
import math
import re
import statistics
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..backends.slurm.parse import parse_scontrol_show_job, parse_time
from ..hostlist import expand

PROD_PARTITION = "prod"
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


STEP_JOIN_S = 0.25
"""Completed steps of one node less than this apart count as one stretch of training (the
bookkeeping between two steps); a longer pause (a re-form, a restart) is not counted."""


def read_step_logs(paths: Iterable[Path], until: float | None = None
                   ) -> dict[str, list[tuple[float, float]]]:
    """Per node, the ``(start, end)`` of every completed step, from the workers' step logs
    (``steps/<node>.log``: one ``START END`` line per completed step; the node is the file's
    name), only steps that ended by ``until`` when given (to read the logs again as they were
    read then). Malformed lines (a process killed mid-write) are skipped."""
    out: dict[str, list[tuple[float, float]]] = {}
    for path in paths:
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        steps = out.setdefault(Path(path).stem, [])
        for line in text.splitlines():
            parts = line.split()
            try:
                start, end = float(parts[0]), float(parts[1])
            except (IndexError, ValueError):
                continue
            if len(parts) == 2 and end >= start and (until is None or end <= until):
                steps.append((start, end))
    return out


def training_stretches(steps: Iterable[tuple[float, float]],
                       join_s: float = STEP_JOIN_S) -> list[tuple[float, float]]:
    """The union of the steps' spans, joining spans less than ``join_s`` apart."""
    out: list[list[float]] = []
    for start, end in sorted(steps):
        if out and start - out[-1][1] < join_s:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


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


Span = tuple[float, float]

_LOG_STAMP = r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)\] "
_LOG_ALLOC = re.compile(_LOG_STAMP + r"sched: Allocate JobId=(\d+) NodeList=(\S+) .*"
                        r"Partition=(\S+)")
_LOG_BF_START = re.compile(_LOG_STAMP + r"sched/backfill: _start_job: Started JobId=(\d+) "
                           r"in (\S+) on (\S+)")
_LOG_DONE = re.compile(_LOG_STAMP + r"_job_complete: JobId=(\d+) done")
_LOG_SUBMIT = re.compile(_LOG_STAMP + r"_slurm_rpc_submit_batch_job: JobId=(\d+) ")


def _log_time(stamp: str) -> float:
    """slurmctld's log time (local, ``2026-11-25T02:42:54.288``) → Unix seconds: Slurm's own
    time format (:func:`parse_time`) and the milliseconds."""
    whole, _, millis = stamp.partition(".")
    return (parse_time(whole) or 0.0) + (float(f"0.{millis}") if millis else 0.0)


def _log_job_lines(text: str) -> Iterator[tuple[str, float, str, str, str]]:
    """slurmctld's log lines about a job's life: ``(what, time, job, nodelist, partition)``
    with ``what`` one of ``submit``, ``start`` (main scheduler or backfill) and ``done``;
    nodelist and partition only for ``start``."""
    for line in text.splitlines():
        m = _LOG_ALLOC.match(line)
        if m:
            stamp, job, nodelist, partition = m.groups()
            yield "start", _log_time(stamp), job, nodelist, partition
            continue
        m = _LOG_BF_START.match(line)
        if m:
            stamp, job, partition, nodelist = m.groups()
            yield "start", _log_time(stamp), job, nodelist, partition
            continue
        for what, pattern in (("done", _LOG_DONE), ("submit", _LOG_SUBMIT)):
            m = pattern.match(line)
            if m:
                yield what, _log_time(m.group(1)), m.group(2), "", ""
                break


def _log_job_times(text: str) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """Each job's submission, (last) start and (last) end in slurmctld's log, to the ms."""
    times: dict[str, dict[str, float]] = {"submit": {}, "start": {}, "done": {}}
    for what, t, job, _, _ in _log_job_lines(text):
        times[what][job] = t
    return times["submit"], times["start"], times["done"]


def prod_busy_from_log(text: str) -> dict[str, list[Span]]:
    """Per node, the spans in which a prod job held it, from slurmctld's log: from the job's
    start (``sched: Allocate JobId=N NodeList=... Partition=prod``, or backfill's
    ``_start_job: Started JobId=N in prod on ...``) to its end (``_job_complete: JobId=N
    done``); a job with no end in the log holds its nodes for good (``inf``). Jobs of other
    partitions are left out; an empty result means the log had no such line."""
    started: dict[str, tuple[float, list[str]]] = {}
    busy: dict[str, list[Span]] = {}
    for what, t, job, nodelist, partition in _log_job_lines(text):
        if what == "start" and partition == PROD_PARTITION:
            started[job] = (t, expand(nodelist))
        elif what == "done" and job in started:
            start, nodes = started.pop(job)
            for node in nodes:
                busy.setdefault(node, []).append((start, t))
    for start, nodes in started.values():
        for node in nodes:
            busy.setdefault(node, []).append((start, math.inf))
    return busy


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
    t0, t1 = samples[0].t, samples[-1].t
    idle = harvested = 0.0
    for node in node_names:
        busy = list(prod_busy.get(node, ()))
        busy += [(a.t, b.t) for a, b in zip(samples, samples[1:]) if node in a.down]
        free = _complement(busy, t0, t1)
        idle += sum(b - a for a, b in free)
        if steps is not None and node in steps:
            stretches = training_stretches(steps[node], join_s)
            harvested += sum(b - a for a, b in _intersect(free, stretches))
    return idle, harvested


_STARTUP = re.compile(r"first step ([0-9.]+) s after the task started: launcher ([0-9.]+) s, "
                      r"torch and model ([0-9.]+) s, ready to placed and formed ([0-9.]+) s")
STARTUP_PARTS = ("launcher", "torch_and_model", "placed_and_formed")


def read_startups(paths: Iterable[Path]) -> list[dict[str, float]]:
    """Every worker start-up the tasks' output names (``examples/standin_nas.py`` writes one
    line to stderr at its first completed step): ``total`` from the task's start to the first
    step, and its parts (:data:`STARTUP_PARTS`). Unreadable files and other lines are skipped."""
    out = []
    for path in paths:
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:
            continue
        for m in _STARTUP.finditer(text):
            values = [float(v) for v in m.groups()]
            out.append({"total": values[0], **dict(zip(STARTUP_PARTS, values[1:]))})
    return out


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
    submitted, started, ended = _log_job_times(log_text)
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


_PREEMPTED = re.compile(r"preempted \S+ has been (?:requeued|killed) to reclaim resources")


def count_preemptions_in_log(text: str) -> int:
    """Preemptions slurmctld logged (``preempted JobId=... has been requeued to reclaim
    resources for JobId=...``)."""
    return sum(bool(_PREEMPTED.search(line)) for line in text.splitlines())


def read_counters(paths: Iterable[Path]) -> dict[str, dict[str, Any]]:
    """Each elastic job's counter file (unreadable or partial files are skipped)."""
    out: dict[str, dict[str, Any]] = {}
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "samples" in data:
            out[str(data.get("job") or Path(path).parent.name)] = data
    return out


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
        **({} if cap_per_job is None else {
            "idle_node_seconds_within_cap": round(idle_within_cap(samples, nodes,
                                                                  cap_per_job), 1)}),
        "jobs": jobs,
    }


def format_summary(summary: Mapping[str, Any]) -> str:
    """A few human lines."""
    delay = summary.get("prod_start_delay_s")
    lines = [
        f"compute                {summary.get('compute', 'cpu')}: "
        f"{summary.get('compute_note', 'real training on the host cores')}",
        f"idle node-seconds      {summary['idle_node_seconds']:.0f} over "
        f"{summary.get('span_s', 0):.0f} s on {summary.get('nodes', '?')} nodes"
        + (f" ({summary['idle_counted_from']})" if summary.get("idle_counted_from") else ""),
        f"harvested              {summary['harvested_node_seconds']:.0f} node-seconds "
        f"({100 * summary['harvested_share']:.1f} % of idle; "
        f"{summary.get('harvest_counted_from', 'squeue')}; held by elastic tasks "
        f"{summary.get('held_node_seconds', summary['harvested_node_seconds']):.0f})",
        f"samples trained        {summary['samples']}",
        *([f"where the rest went    {summary['idle_not_held_node_seconds']:.0f} node-seconds "
           "idle with no task running, "
           f"{summary['held_not_training_node_seconds']:.0f} held by a task not inside a "
           "completed step (start-up, re-forms, steps cut short)"
           + (" (2-s samples)" if "idle_node_seconds_sampled" in summary else "")]
          if "idle_not_held_node_seconds" in summary and summary.get("held_node_seconds")
          != summary.get("harvested_node_seconds") else []),
        *([f"worker start-ups       {st['count']}, task start → first step median "
           f"{st['median_s']:.2f} s (p90 {st['p90_s']:.2f}): "
           + ", ".join(f"{k.replace('_', ' ')} {v:.2f} s"
                       for k, v in st["parts_median_s"].items())]
          if (st := summary.get("startups") or {}).get("count") else []),
        f"rescales / preemptions {summary['rescales']} / {summary['preemptions']}",
        "prod start delay       " + ("n/a (no prod job started)" if delay is None else
                                     f"median {delay:.1f} s, p90 "
                                     f"{summary.get('prod_start_delay_p90_s', 0):.1f} s over "
                                     f"{summary.get('prod_jobs_started', 0)} jobs"),
    ]
    for job, info in summary.get("jobs", {}).items():
        lines.append(f"  job {job}: {info['samples']} samples, {info['restarts']} restarts, "
                     f"up to {info['max_running_tasks']} nodes, {info['cell']}")
    return "\n".join(lines)


def markdown(summary: Mapping[str, Any], command: str) -> str:
    """The BENCHMARKS.md paragraph and table for one demo run."""
    delay = summary.get("prod_start_delay_s")
    standin = summary.get("compute") == "standin"
    rows = [
        ("compute", "STOOD IN: each step's accelerator compute is a timed wait of "
                    f"{summary.get('compute_s', 0):g} s" if standin else "real, on the CPU cores"),
        ("idle node-seconds (not in prod work)", f"{summary['idle_node_seconds']:.0f}"
         + (f" ({summary['idle_counted_from']})" if summary.get("idle_counted_from") else "")),
        ("harvested node-seconds (inside completed training steps)"
         if summary.get("held_node_seconds") is not None else "harvested node-seconds",
         f"{summary['harvested_node_seconds']:.0f} "
         f"({100 * summary['harvested_share']:.1f} % of idle)"),
        ("samples trained (workers' counters)", f"{summary['samples']}"),
        ("rescales (RUNNING task count changed)", f"{summary['rescales']}"),
        ("preemptions (slurmctld log)", f"{summary['preemptions']}"),
        ("prod start delay, median / p90", "n/a" if delay is None else
         f"{delay:.1f} s / {summary.get('prod_start_delay_p90_s', 0):.1f} s over "
         f"{summary.get('prod_jobs_started', 0)} prod jobs"),
    ]
    held = summary.get("held_node_seconds")
    if held is not None:
        rows.insert(3, ("node-seconds elastic tasks held (RUNNING in squeue)", f"{held:.0f}"))
    if "idle_not_held_node_seconds" in summary:
        idle = summary.get("idle_node_seconds_sampled", summary["idle_node_seconds"]) or 1.0
        of = " of the 2-s samples' idle" if "idle_node_seconds_sampled" in summary else ""
        rows += [("idle, no elastic task running (node-seconds)",
                  f"{summary['idle_not_held_node_seconds']:.0f} "
                  f"({100 * summary['idle_not_held_node_seconds'] / idle:.1f} %{of})"),
                 ("held, not inside a completed step (start-up, re-forms, cut steps)",
                  f"{summary['held_not_training_node_seconds']:.0f} "
                  f"({100 * summary['held_not_training_node_seconds'] / idle:.1f} %{of})")]
    st = summary.get("startups") or {}
    if st.get("count"):
        parts = st["parts_median_s"]
        rows.append(("worker start-ups: task start → first step, median (p90)",
                     f"{st['median_s']:.2f} s ({st['p90_s']:.2f} s) over {st['count']}: "
                     f"launcher {parts['launcher']:.2f} s, torch import and model "
                     f"{parts['torch_and_model']:.2f} s, placed and group formed "
                     f"{parts['placed_and_formed']:.2f} s"))
    capped = summary.get("idle_node_seconds_within_cap")
    if capped and not standin:
        rows.insert(2, ("idle node-seconds the queued elastic jobs could hold (node caps)",
                        f"{capped:.0f} ({100 * summary['harvested_node_seconds'] / capped:.1f} "
                        "% of it harvested)"))
    table = ["| measure | value |", "| --- | --- |", *(f"| {a} | {b} |" for a, b in rows)]
    return "\n".join([
        f"`{command}`: a {summary.get('nodes')}-node local Slurm cluster (one slurmd per "
        f"virtual node on one host) and `malletraind`; {summary.get('span_s', 0):.0f} s of a "
        f"main-queue workload on `prod` ({summary.get('prod_jobs_planned', '?')} jobs, "
        f"{summary.get('big_jobs_planned', '?')} of them big jobs that wait and leave planned "
        "holes) whose idle gaps are drawn from the Summit fragment lengths, one trace hour "
        f"compressed to {3600 / float(summary.get('compress', 60.0)):.0f} s; " + (
            f"{summary.get('elastic_jobs', 4)} elastic jobs (`sbatch --qos=malletrain -N "
            f"1-{summary.get('max_nodes', 16)} examples/nas_standin.sbatch`, rescaling in place) "
            "each training a random NAS-Bench-101 cell whose accelerator compute is STOOD IN by "
            f"a timed wait of {summary.get('compute_s', 0):g} s per step, while the gradients of "
            "a small real cell are all-reduced over gloo between the job's nodes"
            if standin else
            "elastic jobs (`sbatch --qos=malletrain -N 1-2 examples/nas.sbatch`) training "
            "random NAS-Bench-101 cells with torch DDP (gloo) on the host's CPU cores") +
        ". Computed from Slurm's records (squeue/sinfo every 2 s, `scontrol show job`, "
        "slurmctld's log) and the workers' counter files and step logs, not from the daemon's "
        "plan:",
        "",
        *table,
        "",
        "The prod start delay is each prod job's StartTime minus the moment it became "
        "startable: eligible, and every node it runs on released by the prod job before it "
        "(its end), from slurmctld's log to the millisecond. It is what preempting elastic "
        "tasks cost the main queue (KillWait is 2 s in the local cluster's test timings). " + (
            "Harvested node-seconds count only time inside training steps that completed "
            "(each worker logs the start and end of every step it completed); a task's "
            "start-up (launcher, torch import, joining the group), re-form pauses and a step "
            "cut short by a preemption count as idle."
            if standin else
            "The harvested share is bounded by the elastic jobs' node caps (at most "
            "`--elastic-jobs` × `--max-nodes` = 6 torch workers, for 2 shared cores) and by "
            "gaps shorter than a task start."),
    ])
