"""The arithmetic of the fault campaign (bench/campaign.py), apart from any cluster: the
training steps read from the workers' step logs, when a job trained again after a fault and
what it rolled back, the summary over the rows and the markdown table.

A step line is one JSON object per completed step that tests/workers/inplace_train.py prints
(``t``: the step's end, ``step``: the global step count after it, ``epoch``, ``world``,
``failed``: a step dropped because a peer was lost). Ranks print the same global step: a step
counts once, at the last rank's end.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools.runlogs.jsonlines import json_line

RUN = 5
"""Consecutive global steps, in one epoch, that say a job trains again."""
MARKERS = {"slurm": ("<!-- campaign:begin -->", "<!-- campaign:end -->"),
           "pbs": ("<!-- campaign-pbs:begin -->", "<!-- campaign-pbs:end -->")}
GAP_S = 5.0
"""The largest gap between two of those steps (a step takes about 0.1-0.3 s here)."""
HOW = {
    "daemon_kill": "SIGKILL malletraind, started again 1-5 s later",
    "launcher_kill": "SIGKILL one task's malletrain-run",
    "train_kill": "SIGKILL one training process",
    "slurmd_kill": "SIGKILL a node's slurmd, started again 3-10 s later",
    "slurmctld_restart": "slurmctld stopped (SIGTERM), started 1-4 s later",
    "ckpt_full": "the job's checkpoint tmpfs full (ENOSPC) for 12 s",
    "sigstop": "SIGSTOP one training process for 30 s, then SIGCONT",
}


@dataclass(frozen=True)
class Step:
    """One global step: when its last rank ended it, its count after it, epoch and world."""

    t: float
    step: int
    epoch: int
    world: int


class StepReader:
    """The step lines of one job's output files (``task-JOB_*.out``), read incrementally."""

    def __init__(self, outdir: Path, job: str) -> None:
        self.outdir, self.job = outdir, job
        self.offsets: dict[Path, int] = {}
        self.latest: dict[tuple[int, int], Step] = {}  # (epoch, step) -> its last end

    def poll(self) -> list[Step]:
        """Every global step so far, in time order."""
        for path in sorted(self.outdir.glob(f"task-{self.job}_*.out")):
            try:
                with open(path, "rb") as fh:
                    fh.seek(self.offsets.get(path, 0))
                    data = fh.read()
            except OSError:
                continue
            cut = data.rfind(b"\n") + 1
            self.offsets[path] = self.offsets.get(path, 0) + cut
            self.add(data[:cut].decode(errors="replace").splitlines())
        return sorted(self.latest.values(), key=lambda s: s.t)

    def add(self, lines: Iterable[str]) -> None:
        for line in lines:
            rec = json_line(line)
            if rec is None or "t" not in rec or rec.get("failed") or "step" not in rec:
                continue
            key = (int(rec["epoch"]), int(rec["step"]))
            old = self.latest.get(key)
            if old is None or rec["t"] > old.t:
                self.latest[key] = Step(float(rec["t"]), key[1], key[0], int(rec["world"]))


def first_run(steps: list[Step], after: float, run: int = RUN,
              gap_s: float = GAP_S) -> int | None:
    """The index in ``steps`` of the first of ``run`` consecutive global steps of one epoch,
    each ended after ``after`` and at most ``gap_s`` after the one before; None if none."""
    later = [i for i, s in enumerate(steps) if s.t > after]
    for n, i in enumerate(later):
        chain = [steps[j] for j in later[n:n + run]]
        if len(chain) < run:
            return None
        if all(b.epoch == a.epoch and b.step == a.step + 1 and b.t - a.t <= gap_s
               for a, b in zip(chain, chain[1:])):
            return i
    return None


def recovery(steps: list[Step], t_fault: float, t_release: float,
             batch: int) -> dict[str, Any]:
    """What the step log says about one fault: ``recovered`` (a run of steps after the fault
    was undone), ``to_training_s`` (fault → the end of the first step of the first run after
    it), ``steps_rolled_back`` and ``samples_lost`` (the steps the job trained before that run
    and trained again in it: from the step it resumed from to the last one reached, each
    ``batch × world``), ``samples_kept`` (trained between the fault and that run and kept)."""
    i = first_run(steps, t_fault)
    healthy = first_run(steps, max(t_fault, t_release))
    if i is None or healthy is None:
        return {"recovered": False, "to_training_s": None, "steps_rolled_back": None,
                "samples_lost": None, "samples_kept": None}
    resumed = steps[i].step - 1                  # the count the first step of the run began at
    before = steps[:i]
    world: dict[int, int] = {s.step: s.world for s in before}  # the latest of each count
    reached = before[-1].step if before else resumed
    lost = range(resumed + 1, reached + 1)
    kept = {s.step: s.world for s in before if s.t > t_fault and s.step <= resumed}
    return {"recovered": True, "to_training_s": round(steps[i].t - t_fault, 2),
            "steps_rolled_back": len(lost),
            "samples_lost": sum(batch * world.get(k, 1) for k in lost),
            "samples_kept": sum(batch * w for w in kept.values())}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals over the rows (each row: ``fault``, ``injected``, ``recovered``,
    ``to_training_s``, ``samples_lost``, ``tasks_lost``, ``stalled_nodes``) and one entry per
    fault class."""
    done = [r for r in rows if r["injected"]]
    classes: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(r["fault"] for r in rows):
        mine = [r for r in rows if r["fault"] == name]
        inj = [r for r in mine if r["injected"]]
        times = [r["to_training_s"] for r in inj if r.get("to_training_s") is not None]
        lost = [r["samples_lost"] for r in inj if r.get("samples_lost") is not None]
        classes[name] = {
            "faults": len(inj), "not_injected": len(mine) - len(inj),
            "recovered": sum(1 for r in inj if r["recovered"]),
            "to_training_s_median": round(statistics.median(times), 2) if times else None,
            "to_training_s_max": max(times) if times else None,
            "samples_lost": sum(lost), "samples_lost_max": max(lost) if lost else None,
            "samples_kept": sum(r.get("samples_kept") or 0 for r in inj),
            "tasks_lost": sum(r["tasks_lost"] for r in mine),
            "stalled_nodes": sum(r["stalled_nodes"] for r in mine)}
    return {"faults": len(done), "not_injected": len(rows) - len(done),
            "recovered": sum(1 for r in done if r["recovered"]),
            "tasks_lost": sum(r["tasks_lost"] for r in rows),
            "stalled_nodes": sum(r["stalled_nodes"] for r in rows),
            "samples_lost": sum(r["samples_lost"] or 0 for r in done),
            "classes": classes}


def _s(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f} s"


def table(summary: dict[str, Any], rows: list[dict[str, Any]], what: dict[str, str]) -> str:
    """One markdown row per fault class (``what``: how each class was injected), then the
    faults that did not recover or were not injected, each with its reason."""
    out = ["| fault | how | injected | recovered | fault → training, median / max | samples "
           "rolled back, total / max | samples kept | tasks lost | stalled nodes |",
           "|---|---|---|---|---|---|---|---|---|"]
    for name, c in summary["classes"].items():
        skipped = f" (+{c['not_injected']} not injected)" if c["not_injected"] else ""
        out.append(f"| {name} | {what.get(name, '')} | {c['faults']}{skipped} | "
                   f"{c['recovered']} | {_s(c['to_training_s_median'])} / "
                   f"{_s(c['to_training_s_max'])} | {c['samples_lost']:,} / "
                   f"{c['samples_lost_max'] if c['samples_lost_max'] is not None else '–'} | "
                   f"{c['samples_kept']:,} | {c['tasks_lost']} | {c['stalled_nodes']} |")
    s = summary
    kept = sum(c["samples_kept"] for c in s["classes"].values())
    out.append(f"| **all** | | {s['faults']} | {s['recovered']} | | {s['samples_lost']:,} | "
               f"{kept:,} | {s['tasks_lost']} | {s['stalled_nodes']} |")
    odd = [r for r in rows if not r["injected"] or not r["recovered"] or r["tasks_lost"]
           or r["stalled_nodes"] or r.get("by_design")]
    if odd:
        out += ["", "Faults that did not recover, were not injected, lost a task, left a "
                "node stalled or met a limit by design:", ""]
        out += [f"* #{r['n']} {r['fault']} on job {r.get('job', '?')}"
                f"{' (' + r['target'] + ')' if r.get('target') else ''}: "
                f"{r.get('reason') or r.get('by_design') or 'not recovered'}"
                f"{'; tasks lost: ' + ', '.join(r.get('lost', [])) if r['tasks_lost'] else ''}"
                f"{'; stalled: ' + ', '.join(r.get('stalled', [])) if r['stalled_nodes'] else ''}"
                for r in odd]
    return "\n".join(out)


def section(r: dict[str, Any]) -> str:
    begin, end = MARKERS[r["backend"]]
    what = ("local Slurm cluster" if r["backend"] == "slurm" else "local OpenPBS complex")
    return "\n".join([
        begin,
        f"Measured {r['date']} on {r['machine']}, with `{r['command']}` (seed {r['seed']}, "
        f"{r['wall_s'] / 60:.0f} min): a {what} of {r['nodes']} nodes, {r['jobs']} in-place "
        f"jobs, {r['prod_jobs']} prod jobs preempting them meanwhile. {r['faults']} faults "
        f"injected, {r['recovered']} recovered, {r['tasks_lost']} tasks lost, "
        f"{r['stalled_nodes']} nodes idle past the grant deadline.",
        "",
        table(summarize(r["rows"]), r["rows"], HOW),
        "",
        "Fault → training: from the injection to the end of the first of five consecutive "
        "global steps of one epoch (a fault that does not stop training reads as one step); "
        "the job must also train after the fault is undone. Samples rolled back: the steps "
        "the job had trained beyond the step it went on from, × 8 samples × world size, from "
        "the workers' step lines; samples kept: trained between the fault and that run and not "
        "trained again. A prod preemption that meets a fault's window is in its figures.",
        *slow_lines(r["rows"]),
        end])


def slow_lines(rows: list[dict[str, Any]]) -> list[str]:
    """For each fault whose logs were kept (slower than 5 s, or not recovered): where its
    time went (bench/campaign_evidence.py), slowest first."""
    slow = sorted((r for r in rows if r.get("where")),
                  key=lambda r: -(r["to_training_s"] or float("inf")))
    if not slow:
        return []
    out = ["", "Faults slower than 5 s, with the longest wait in each (their logs were kept):", ""]
    for r in slow:
        w = r["where"]
        took = f"{r['to_training_s']:.1f} s" if r["to_training_s"] is not None else \
            "not recovered"
        out.append(f"* #{r['n']} {r['fault']} ({r.get('target', '')}): {took}; {w['wait_s']} s "
                   f"from {w['at_s']:.1f} s after the fault, after \"{w['after']}\", until "
                   f"\"{w['until']}\"")
    return out
