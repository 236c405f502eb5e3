"""What bench/sim_to_real.py reads off a real run: the per-node training rate and step time
(the workers' step logs), the grant delays and elastic task starts (slurmctld's log), the
workers' start-ups (their output), and two losses the cost model does not charge: running
workers' pauses between steps and the hand-over at a preemption. Pure functions of the saved
files, tested in tests/test_bench_sim_to_real.py."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from devtools.demo import summary, worker_logs
from devtools.demo.slurmctld_log import Span, elastic_starts

BATCH = 8
"""Samples per worker and step of examples/standin_nas.py (its --batch default)."""


def step_stats(steps: dict[str, list[tuple[float, float]]], t0: float,
               t1: float) -> dict[str, float]:
    """Per-node training rate inside completed steps and the step time, from the step logs,
    over the window."""
    count = 0
    inside = 0.0
    durations = []
    for spans in steps.values():
        kept = [(a, b) for a, b in spans if a >= t0 and b <= t1]
        count += len(kept)
        durations += [b - a for a, b in kept]
        inside += sum(b - a for a, b in summary.training_stretches(kept))
    return {"steps": count, "stretch_node_s": inside,
            "rate_per_node": BATCH * count / inside if inside > 0 else 0.0,
            "step_s_median": statistics.median(durations) if durations else 0.0}


def step_samples(paths: list[Path], window: tuple[float, float],
                 until: float | None = None) -> dict[str, int]:
    """Samples the step logs say the jobs trained inside the window: ``kept`` and
    ``rolled_back`` (trained, then undone by a resume from the checkpoint after the job lost
    every node), as :func:`devtools.demo.worker_logs.kept_and_rolled_back` decides, and how
    many such ``resumes`` there were."""
    records = worker_logs.read_step_records(paths, until=until)
    kept, rolled = worker_logs.kept_and_rolled_back(records, BATCH, window)
    inside = [r for r in records if window[0] <= r.end <= window[1]]
    return {"kept": kept, "rolled_back": rolled, "resumes": worker_logs.count_resumes(inside)}


def grant_delays(log_text: str, window: tuple[float, float]) -> list[float]:
    """For each node a prod job released inside the window and an elastic task took before
    the next prod job: seconds from the release to that task's start (slurmctld's log, to the
    millisecond) — the daemon's poll, its scontrol and Slurm's scheduling tick."""
    prod = summary.prod_busy_from_log(log_text)
    starts = elastic_starts(log_text)
    out = []
    for node, spans in prod.items():
        times = sorted(starts.get(node, ()))
        spans = sorted(spans)
        for (_, end), (following, _) in zip(spans, spans[1:] + [(math.inf, math.inf)]):
            after = [t for t in times if end <= t < following]  # before prod takes it again
            if window[0] < end < window[1] and after:
                out.append(after[0] - end)
    return out


def measure_costs(out: Path, window: tuple[float, float]) -> dict[str, Any]:
    """What the replay charges, from this run's own records: grant delays (slurmctld's log)
    and every worker's start-up, task start → first step (the tasks' output)."""
    log = out / "logs" / "slurmctld.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    delays = grant_delays(text, window)
    startups = [s["total"] for s in summary.read_startups(sorted(out.glob("jobs/nas-*.out")))]
    starts = elastic_starts(text)
    started = sum(window[0] <= t <= window[1] for ts in starts.values() for t in ts)
    steps = summary.read_step_logs(sorted(out.glob("jobs/checkpoints-*/steps/*.log")))
    prod = summary.prod_busy_from_log(text)
    stalls, handovers = step_gaps(steps, prod, starts, window)
    return {"grant_delays_s": [round(d, 3) for d in delays],
            "startups_s": [round(s, 3) for s in startups], "elastic_task_starts": started,
            "startups_censored_s": censored_starts(steps, prod, starts, window),
            "member_stalls_s": stalls, "handovers_s": handovers}


def censored_starts(steps: dict[str, list[tuple[float, float]]], prod: dict[str, list[Span]],
                    starts: dict[str, list[float]], window: tuple[float, float]) -> list[float]:
    """Task starts inside the window that never reached a completed step: for each, the time
    the task had (its start to the node's next prod job, next task or the window's end), a
    lower bound on its start-up. The workers' own start-ups leave these out, and they are the
    long ones, so a mean of what was seen alone is too short."""
    out = []
    for node, times in starts.items():
        times = sorted(times)
        busy = [s for s, _ in prod.get(node, [])]
        spans = steps.get(node, [])
        for i, t in enumerate(times):
            if not window[0] <= t < window[1]:
                continue
            until = min([window[1], *(x for x in busy if x > t), *times[i + 1:i + 2]])
            if not any(t <= a and b <= until for a, b in spans):
                out.append(round(until - t, 3))
    return out


def start_quantiles(seen: list[float], censored: list[float], n: int = 200
                    ) -> tuple[float, ...]:
    """``n`` equally likely start-ups (the quantiles of the Kaplan-Meier estimate) from the
    start-ups ``seen`` and the ``censored`` ones (known only to exceed the value). The mass the
    estimate leaves beyond the longest one seen goes to the longest censored value above it, a
    lower bound; with nothing censored, the quantiles of what was seen."""
    if not seen:
        return ()
    points = sorted([(x, True) for x in seen] + [(x, False) for x in censored])
    survival, at_risk = 1.0, len(points)
    mass: list[tuple[float, float]] = []
    for x, event in points:
        if event:
            mass.append((x, survival / at_risk))
            survival -= survival / at_risk
        at_risk -= 1
    if survival > 1e-12:
        mass.append((max(x for x, _ in points), survival))
    out, acc, i = [], 0.0, 0
    for k in range(n):
        q = (k + 0.5) / n
        while i < len(mass) - 1 and acc + mass[i][1] < q:
            acc += mass[i][1]
            i += 1
        out.append(round(mass[i][0], 3))
    return tuple(out)


def step_gaps(steps: dict[str, list[tuple[float, float]]], prod: dict[str, list[Span]],
              starts: dict[str, list[float]], window: tuple[float, float]
              ) -> tuple[list[float], list[float]]:
    """Two losses the step logs show: a running worker's pauses between two completed steps
    (≥ the summary's join threshold, no prod job and no new task on the node in between:
    re-forms, stalls), and the hand-over at a preemption (the last completed step's end to
    the prod job's start, when under 10 s: the step in flight and the kill)."""
    stalls, handovers = [], []
    for node, spans in steps.items():
        spans = sorted(x for x in spans if x[0] >= window[0] and x[1] <= window[1])
        busy = prod.get(node, [])
        for (_, end0), (start1, _) in zip(spans, spans[1:]):
            gap = start1 - end0
            held = any(s < start1 and e > end0 for s, e in busy)
            restarted = any(end0 <= t <= start1 for t in starts.get(node, ()))
            if gap >= summary.STEP_JOIN_S and not held and not restarted:
                stalls.append(round(gap, 3))
        ends = [e for _, e in spans]
        for s, _ in busy:
            before = [e for e in ends if e <= s]
            if window[0] < s < window[1] and before and s - before[-1] < 10.0:
                handovers.append(round(s - before[-1], 3))
    return stalls, handovers
