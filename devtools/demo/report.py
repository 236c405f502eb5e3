"""The demo's summary as text: the terminal table and the BENCHMARKS.md section."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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
          != summary.get("harvested_node_seconds") and "where_idle_went" not in summary
          else []),
        *(["where the idle went    " + ", ".join(
            f"{k.replace('_', ' ')} {v:.0f}" for k, v in went.items())
            + " node-seconds (per idle stretch of each node)"]
          if (went := summary.get("where_idle_went")) else []),
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
