"""What the demo reads in slurmctld's log: each job's submission, start and end to the
millisecond, the nodes a prod job held, and the preemptions slurmctld logged.

The demo runs on the local Slurm cluster; these are the lines slurmctld 22.05 and later write
at its default log level (``sched: Allocate``, backfill's ``_start_job``, ``_job_complete``,
``_slurm_rpc_submit_batch_job``, ``preempted JobId=... has been requeued``). 26.05 writes
backfill's start only under ``DebugFlags=HetJob`` at the verbose level (``_start_job: HETJOB:
Started ...``), which its local cluster sets (devtools/localcluster/releases.py).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator

from malletrain_core.backends.slurm.parse import parse_time
from malletrain_core.hostlist import expand

PROD_PARTITION = "prod"
ELASTIC_PARTITION = "preemptable"

Span = tuple[float, float]

_LOG_STAMP = r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)\] "
_LOG_ALLOC = re.compile(_LOG_STAMP + r"sched: Allocate JobId=(\d+) NodeList=(\S+) .*"
                        r"Partition=(\S+)")
_LOG_BF_START = re.compile(_LOG_STAMP + r"sched/backfill: _start_job: (?:HETJOB: )?Started JobId=(\d+) "
                           r"in (\S+) on (\S+)")
_LOG_DONE = re.compile(_LOG_STAMP + r"_job_complete: JobId=(\d+) done")
_LOG_SUBMIT = re.compile(_LOG_STAMP + r"_slurm_rpc_submit_batch_job: JobId=(\d+) ")


def log_time(stamp: str) -> float:
    """slurmctld's log time (local, ``2026-11-25T02:42:54.288``) → Unix seconds: Slurm's own
    time format (:func:`parse_time`) and the milliseconds."""
    whole, _, millis = stamp.partition(".")
    return (parse_time(whole) or 0.0) + (float(f"0.{millis}") if millis else 0.0)


def job_lines(text: str) -> Iterator[tuple[str, float, str, str, str]]:
    """slurmctld's log lines about a job's life: ``(what, time, job, nodelist, partition)``
    with ``what`` one of ``submit``, ``start`` (main scheduler or backfill) and ``done``;
    nodelist and partition only for ``start``."""
    for line in text.splitlines():
        m = _LOG_ALLOC.match(line)
        if m:
            stamp, job, nodelist, partition = m.groups()
            yield "start", log_time(stamp), job, nodelist, partition
            continue
        m = _LOG_BF_START.match(line)
        if m:
            stamp, job, partition, nodelist = m.groups()
            yield "start", log_time(stamp), job, nodelist, partition
            continue
        for what, pattern in (("done", _LOG_DONE), ("submit", _LOG_SUBMIT)):
            m = pattern.match(line)
            if m:
                yield what, log_time(m.group(1)), m.group(2), "", ""
                break


def job_times(text: str) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """Each job's submission, (last) start and (last) end in slurmctld's log, to the ms."""
    times: dict[str, dict[str, float]] = {"submit": {}, "start": {}, "done": {}}
    for what, t, job, _, _ in job_lines(text):
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
    for what, t, job, nodelist, partition in job_lines(text):
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


_PREEMPTED = re.compile(r"preempted \S+ has been (?:requeued|killed) to reclaim resources")


def count_preemptions_in_log(text: str) -> int:
    """Preemptions slurmctld logged (``preempted JobId=... has been requeued to reclaim
    resources for JobId=...``)."""
    return sum(bool(_PREEMPTED.search(line)) for line in text.splitlines())


_ELASTIC_START = re.compile(
    _LOG_STAMP + r"(?:sched: Allocate JobId=\S+ NodeList=(\S+) .*Partition=" + ELASTIC_PARTITION
    + r"|sched/backfill: _start_job: (?:HETJOB: )?Started JobId=\S+ in " + ELASTIC_PARTITION
    + r" on (\S+))")


def elastic_starts(text: str) -> dict[str, list[float]]:
    """Per node, when elastic tasks (array tasks of the preemptable partition) started there,
    from slurmctld's log."""
    starts: dict[str, list[float]] = {}
    for line in text.splitlines():
        m = _ELASTIC_START.match(line)
        if m:
            for node in expand(m.group(2) or m.group(3)):
                starts.setdefault(node, []).append(log_time(m.group(1)))
    return starts
