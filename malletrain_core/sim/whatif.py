"""What MalleTrain would harvest on a site, from the site's own accounting.

The answer an admin needs before enabling the plugin: over a window of the site's history
(``sacct`` or a PBS accounting log, see :mod:`.accounting`), how many node-hours were idle, and
what share of them the production engine would have trained on under each rescale-cost model
(:mod:`.costs`), with how many samples per second of the profiled workload. Each cost model is
one replay of the same saturated job set (drawn from the measured profiles by the seed) on the
same trace, with the real Engine (:func:`.replay.replay`); UB_oracle (:mod:`.bounds`) is the
most any policy could train. ``harvested`` counts the node-seconds the jobs held, start-ups and
rescale pauses included; the samples figures charge those costs.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import shortcuts
from ..errors import ConfigError
from ..model import DEFAULT_LOOKAHEAD_S, Curve
from .accounting import AccountingFilter, AccountingLog, load_accounting
from .bounds import BoundJob, compute_bounds
from .compare import Progress
from .costs import COST_MODELS
from .measured import load_profiles
from .perfmodel import PerfParams
from .replay import RunResult, replay
from .report import plot_nodes
from .traces import Trace
from .workloads import SimJob, make_workload, model_curves

HOUR = 3600.0
AUTO = "auto"
NODE_KINDS = {AUTO: "", "gpu": "inplace-gpu", "cpu": "inplace"}
"""The cost model of a site's own nodes: in place, with the start-up and pauses measured on
GPU nodes (an H100) or on CPU nodes."""
PROGRESS_EVERY_S = 1.0
"""How often the replays' progress is read while they run in other processes."""


@dataclass(frozen=True)
class WhatIfOptions:
    """The site's trace and the job set to imagine on its idle nodes."""

    trace: str
    accounting: AccountingFilter = field(default_factory=AccountingFilter)
    days: float | None = None
    workload: str = "imagenet"
    jobs: int = 50
    seed: int = 0
    cost_models: tuple[str, ...] = ()
    """The cost models replayed; none given: the site's own (:func:`site_cost_model`)."""
    nodes: str = AUTO
    """``gpu`` or ``cpu`` nodes, or ``auto``: from the accounting (see :func:`site_cost_model`)."""
    policy: str = "malletrain"
    lookahead_s: float = DEFAULT_LOOKAHEAD_S
    noise: float = 0.03

    def __post_init__(self) -> None:
        unknown = [c for c in self.cost_models if c not in COST_MODELS]
        if unknown:
            raise ConfigError(f"--cost-models {','.join(self.cost_models)}: choose among "
                              f"{', '.join(COST_MODELS)}")
        if self.nodes not in NODE_KINDS:
            raise ConfigError(f"--nodes {self.nodes}: give {', '.join(NODE_KINDS)}")
        if self.days is not None and not self.days > 0:
            raise ConfigError(f"--days {self.days}: give a number of days > 0")


@dataclass
class WhatIf:
    """The trace, one replay per cost model and the report's figures."""

    trace: Trace
    runs: dict[str, RunResult]
    report: dict[str, Any]


_done: Any = None
"""In a replay process: the shared array of each cost model's done share (:func:`_share`)."""


def _share(done: Any) -> None:
    """The process pool's initializer: where each replay writes how far it is."""
    global _done
    _done = done


def _replay_one(trace: Trace, jobs: Sequence[SimJob], catalogue: dict[str, Curve],
                opts: WhatIfOptions, cost: str, checked: bool = False,
                slot: int | None = None, told: Callable[[], None] | None = None) -> RunResult:
    """One cost model's replay; its done share goes to ``_done[slot]`` (then ``told()``)."""
    shortcuts.CHECKED = checked
    shortcuts.counts.clear()
    done = _done

    def note(share: float) -> None:
        done[slot] = share
        if told is not None:
            told()

    run = replay(trace, jobs, opts.policy, seed=opts.seed, lookahead_s=opts.lookahead_s,
                 params=PerfParams(noise=opts.noise, rescale_cost=cost), catalogue=catalogue,
                 progress=None if done is None or slot is None else note)
    if checked:
        run.engine["shortcuts_checked"] = dict(shortcuts.counts)
    return run


def site_cost_model(nodes: str, log: AccountingLog) -> tuple[str, str]:
    """The one cost model of the site's own nodes and why: ``gpu`` or ``cpu`` as given, or
    (``auto``) ``gpu`` when any run of the accounting held GPUs (sacct's ``AllocTRES``
    ``gres/gpu``, ``tres.allocated`` in its JSON, PBS's ``Resource_List.ngpus``), else
    ``cpu``."""
    if nodes != AUTO:
        return NODE_KINDS[nodes], f"--nodes {nodes}"
    gpu = log.gpu_runs
    if gpu:
        return NODE_KINDS["gpu"], f"{gpu:,} of the log's {len(log.runs):,} runs held GPUs"
    return NODE_KINDS["cpu"], (f"no run of the log's {len(log.runs):,} says it held a GPU "
                               "(give --nodes gpu if its nodes have them)")


def default_workers(cost_models: int) -> int:
    """One process per cost model wherever there are at least two cores: the replays are
    independent and each is single-threaded Python. Three cost models on two cores then share
    the cores and end together, after about 1.5 replays' time; in two processes (one per core)
    the third waited for the first to end, after 2 replays' time. One core: one process."""
    return max(1, cost_models if (os.cpu_count() or 1) >= 2 else 1)


def what_if(opts: WhatIfOptions, workers: int | None = None, checked: bool = False,
            progress: Progress | None = None) -> WhatIf:
    """Read the trace, replay the job set under every cost model (in ``workers`` processes,
    :func:`default_workers` when ``None``), and sum it up. ``checked``: every exact shortcut
    taken is compared with the full computation (:mod:`malletrain_core.shortcuts`; slower),
    and each model's ``shortcuts_checked`` says how many were. ``progress`` (one unit per cost
    model) is told how far each replay is, every :data:`PROGRESS_EVERY_S`."""
    t0 = time.perf_counter()
    if progress is not None:
        progress.update(0.0, "reading the accounting")
    trace, log = load_accounting(opts.trace, opts.accounting)
    trace = trace.window(opts.days, 0)
    read_s = time.perf_counter() - t0
    if opts.cost_models:
        names, why = opts.cost_models, "--cost-models" if len(opts.cost_models) < len(
            COST_MODELS) else "every cost model (--compare)"
    else:
        model, why = site_cost_model(opts.nodes, log)
        names = (model,)
    workers = default_workers(len(names)) if workers is None else \
        max(1, min(workers, len(names)))
    if progress is not None:
        progress.total = len(names)
    profiles = load_profiles(opts.workload)
    extra = load_profiles("imagenet") if opts.workload != "imagenet" else profiles
    jobs = make_workload(opts.workload, opts.jobs, seed=opts.seed, start=trace.start,
                         end=trace.end, profiles=profiles)
    catalogue = model_curves(jobs, extra)
    bounds = compute_bounds(trace, [BoundJob(j.curve, j.min_nodes, j.max_nodes) for j in jobs])
    t1 = time.perf_counter()
    context = multiprocessing.get_context()
    shares = context.Array("d", len(names), lock=False)  # each replay's done share
    if workers > 1 and len(names) > 1:
        with ProcessPoolExecutor(max_workers=min(workers, len(names)), mp_context=context,
                                 initializer=_share, initargs=(shares,)) as pool:
            futures = [pool.submit(_replay_one, trace, jobs, catalogue, opts, c, checked, i)
                       for i, c in enumerate(names)]
            while wait(futures, timeout=PROGRESS_EVERY_S).not_done:
                _tell(progress, names, shares)
            done = [f.result() for f in futures]
    else:
        _share(shares)
        try:
            done = [_replay_one(trace, jobs, catalogue, opts, c, checked, i,
                                lambda: _tell(progress, names, shares))
                    for i, c in enumerate(names)]
        finally:
            shortcuts.CHECKED = False
            _share(None)
    if progress is not None:
        shares[:] = [1.0] * len(names)
        _tell(progress, names, shares)
        progress.close()
    runs = dict(zip(names, done, strict=True))
    replay_s = time.perf_counter() - t1
    idle = trace.idle_node_seconds()
    span = max(trace.span_s, 1e-9)
    machine = len(trace.node_names) * span
    models = {}
    for cost, run in runs.items():
        models[cost] = {
            "harvested_node_hours": run.node_seconds / HOUR,
            "harvested_share": run.node_seconds / idle if idle > 0 else None,
            "net_samples": run.net_samples,
            "samples_per_s": run.net_samples / span,
            "ub_oracle_share": run.net_samples / bounds.ub_oracle if bounds.ub_oracle > 0
            else None,
            "rescales": run.rescales,
            "preemptions": run.preemptions,
            "replay_wall_s": run.wall_s,
            "replay_cpu_s": run.cpu_s,
            "replans": run.engine.get("replans"),
        }
        if checked:
            models[cost]["shortcuts_checked"] = run.engine.get("shortcuts_checked", {})
    report = {
        "trace": {"name": trace.name, "nodes": len(trace.node_names), "start": trace.start,
                  "end": trace.end, "days": span / 86400.0, "steps": trace.steps,
                  "filter": opts.accounting.describe()},
        "idle_node_hours": idle / HOUR,
        "idle_share_of_machine": idle / machine if machine > 0 else None,
        "mean_idle_nodes": idle / span,
        "workload": {"name": opts.workload, "jobs": opts.jobs, "seed": opts.seed,
                     "policy": opts.policy, "saturated": True},
        "ub_oracle_samples": bounds.ub_oracle,
        "ub_oracle_samples_per_s": bounds.ub_oracle / span,
        "cost_models": models,
        "cost_model_choice": {"models": list(names), "why": why},
        "timing_s": {"read": read_s, "replays": replay_s,
                     "total": time.perf_counter() - t0, "workers": workers},
    }
    return WhatIf(trace, runs, report)


def _tell(progress: Progress | None, models: Sequence[str], shares: Any) -> None:
    """One progress line: the replays' done shares together, and each one's."""
    if progress is not None:
        progress.update(float(sum(shares)), " ".join(
            f"{c} {100 * share:.0f}%" for c, share in zip(models, shares)))


def _hours(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def format_report(report: Mapping[str, Any]) -> str:
    """The admin's answer in a few lines and a table (also the body of whatif.md)."""
    tr = report["trace"]
    head = [
        f"{tr['name']}: {tr['nodes']} nodes, {tr['days']:.3g} days ({tr['filter']})",
        f"idle node-hours        {_hours(report['idle_node_hours'])} "
        f"({100 * (report['idle_share_of_machine'] or 0):.1f} % of the machine; "
        f"{report['mean_idle_nodes']:.1f} nodes idle on average)",
        f"workload               {report['workload']['jobs']} {report['workload']['name']} "
        f"jobs from the measured profiles (seed {report['workload']['seed']}), saturated, "
        f"policy {report['workload']['policy']}; UB_oracle "
        f"{report['ub_oracle_samples_per_s']:,.0f} samples/s",
        *([f"cost model{'s' if len(choice['models']) > 1 else ' '}            "
           f"{', '.join(choice['models'])} ({choice['why']})"]
          if (choice := report.get("cost_model_choice")) else []),
        "",
        "| cost model | harvested node-hours | share of idle | samples/s | share of UB_oracle "
        "| rescales |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for cost, m in report["cost_models"].items():
        head.append(f"| {cost} | {_hours(m['harvested_node_hours'])} | "
                    f"{100 * (m['harvested_share'] or 0):.1f} % | {m['samples_per_s']:,.0f} | "
                    f"{100 * (m['ub_oracle_share'] or 0):.1f} % | {m['rescales']} |")
    t = report["timing_s"]
    head += ["", f"read {t['read']:.1f} s, replays {t['replays']:.1f} s ({t['workers']} "
             f"worker{'s' if t['workers'] != 1 else ''}), total {t['total']:.1f} s"]
    return "\n".join(head)


def write_plots(out_dir: Path, result: WhatIf) -> list[Path]:
    """idle.png (idle nodes, and the nodes each cost model's jobs held, over time) and
    share.png (harvested share of the idle node-hours and samples/s per cost model)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    trace = result.trace
    fig, ax = plt.subplots(figsize=(10, 4))
    plot_nodes(ax, trace, result.runs, "held by MalleTrain: {}")
    ax.set_xlabel("days since the window's start")
    ax.set_ylabel("nodes")
    ax.set_title(f"Idle nodes and what MalleTrain would hold, {trace.name}")
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    paths = [out_dir / "idle.png"]
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    models = result.report["cost_models"]
    names = list(models)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.5))
    a1.bar(names, [100 * (models[n]["harvested_share"] or 0) for n in names], color="tab:blue")
    a1.set_ylabel("% of idle node-hours held")
    a1.set_ylim(0, 100)
    a2.bar(names, [models[n]["samples_per_s"] for n in names], color="tab:green")
    a2.axhline(result.report["ub_oracle_samples_per_s"], color="k", ls="--", lw=1,
               label="UB_oracle")
    a2.set_ylabel("net samples / s")
    a2.legend(fontsize=7)
    fig.suptitle("What MalleTrain would harvest, per rescale-cost model")
    fig.tight_layout()
    paths.append(out_dir / "share.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths
