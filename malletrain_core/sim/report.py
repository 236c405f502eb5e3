"""Results of a simulation: per-policy figures over seeds, the table, results.json, plots."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .bounds import Bounds
from .replay import RunResult
from .traces import Trace

METRICS = ("net_samples", "trained_samples", "ub_oracle_share", "node_utilisation", "rescales",
           "preemption_loss", "completed_jobs", "mean_jct_s", "makespan_s", "wall_s")
WALL_FIELDS = ("wall_s",)
"""Fields that measure this machine, not the simulation: they differ between equal runs."""


def _mean_sd(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return None, None
    sd = float(np.std(xs, ddof=1)) if len(xs) > 1 else 0.0
    return float(np.mean(xs)), sd


def run_figures(run: RunResult, bounds: Bounds | None, idle_node_seconds: float) -> dict[str, Any]:
    """The table's figures for one policy on one seed."""
    return {
        "seed": run.seed,
        "net_samples": run.net_samples,
        "trained_samples": run.trained_samples,
        "ub_oracle_share": run.net_samples / bounds.ub_oracle if bounds and bounds.ub_oracle > 0
        else None,
        "node_utilisation": run.node_seconds / idle_node_seconds if idle_node_seconds > 0
        else None,
        "rescales": run.rescales,
        "rescale_loss": run.rescale_loss,
        "preemptions": run.preemptions,
        "preemption_loss": run.preemption_loss,
        "completed_jobs": run.completed_jobs,
        "mean_jct_s": run.mean_jct_s,
        "makespan_s": run.makespan_s,
        "invalid_actions": run.invalid_actions,
        "wall_s": run.wall_s,
        "engine": run.engine,
    }


def aggregate(meta: Mapping[str, Any], runs: Mapping[str, Sequence[RunResult]],
              bounds: Sequence[Bounds | None], idle_node_seconds: float,
              oracle_wall_s: float = 0.0, with_oracle: bool = False) -> dict[str, Any]:
    """results.json's content: means over seeds at each metric, spreads (sample standard
    deviation) under ``spread``, and every seed's figures under ``per_seed``."""
    known = [b for b in bounds if b is not None]
    ub, _ = _mean_sd([b.ub_oracle for b in known])
    ub_lin, _ = _mean_sd([b.ub_lin for b in known])
    out: dict[str, Any] = dict(meta)
    out.update({"ub_oracle": ub, "ub_lin": ub_lin, "idle_node_seconds": idle_node_seconds,
                "policies": {}})
    for policy, results in runs.items():
        per_seed = [run_figures(r, b, idle_node_seconds) for r, b in zip(results, bounds)]
        entry: dict[str, Any] = {}
        spread: dict[str, Any] = {}
        for key in METRICS:
            entry[key], spread[key] = _mean_sd([f[key] for f in per_seed])
        entry["spread"] = spread
        entry["per_seed"] = per_seed
        out["policies"][policy] = entry
    if with_oracle and known:
        shares = [1.0 for _ in known]
        entry = {key: None for key in METRICS}
        entry.update({"net_samples": ub, "ub_oracle_share": float(np.mean(shares)),
                      "wall_s": oracle_wall_s})
        entry["spread"] = {"net_samples": _mean_sd([b.ub_oracle for b in known])[1]}
        entry["per_seed"] = [{"net_samples": b.ub_oracle, "ub_lin": b.ub_lin} for b in known]
        out["policies"]["oracle"] = entry
    return out


def _num(x: float | None, sd: float | None, fmt: str, scale: float = 1.0) -> str:
    if x is None:
        return "-"
    text = format(x * scale, fmt)
    if sd:
        text += " ± " + format(sd * scale, fmt)
    return text


def format_table(results: Mapping[str, Any]) -> str:
    """The comparison table: one row per policy, mean ± spread over the seeds."""
    header = ("POLICY", "NET_SAMPLES", "UB_SHARE_%", "UTIL_%", "RESCALES", "PREEMPT_LOSS",
              "DONE", "MEAN_JCT_H", "MAKESPAN_H", "WALL_S")
    rows = [header]
    for name, p in results["policies"].items():
        sd = p.get("spread", {})
        rows.append((
            name,
            _num(p["net_samples"], sd.get("net_samples"), ".4g"),
            _num(p["ub_oracle_share"], sd.get("ub_oracle_share"), ".1f", 100),
            _num(p["node_utilisation"], sd.get("node_utilisation"), ".1f", 100),
            _num(p["rescales"], sd.get("rescales"), ".0f"),
            _num(p["preemption_loss"], sd.get("preemption_loss"), ".3g"),
            _num(p["completed_jobs"], sd.get("completed_jobs"), ".1f"),
            _num(p["mean_jct_s"], sd.get("mean_jct_s"), ".1f", 1 / 3600),
            _num(p.get("makespan_s"), sd.get("makespan_s"), ".1f", 1 / 3600),
            _num(p["wall_s"], None, ".1f"),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                       enumerate(zip(r, widths))).rstrip() for r in rows]
    foot = []
    if results.get("ub_oracle") is not None:
        foot.append(f"UB_oracle {results['ub_oracle']:.4g} samples, UB_lin "
                    f"{results['ub_lin']:.4g}")
    foot.append(f"idle node-seconds {results['idle_node_seconds']:.4g}; free nodes taken in "
                f"{results.get('node_order', 'name')} order")
    return "\n".join(lines + foot)


def _clean(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, np.generic):
        return _clean(obj.item())
    return obj


def to_json(results: Mapping[str, Any]) -> str:
    return json.dumps(_clean(results), indent=2, sort_keys=False)


def write_results(results: Mapping[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "results.json"
    path.write_text(to_json(results) + "\n")
    return path


def write_plots(out_dir: Path, trace: Trace, runs: Mapping[str, RunResult],
                bounds: Bounds | None) -> list[Path]:
    """nodes.png (idle and used nodes over time) and throughput.png (samples/s per policy,
    with F(N) of the oracle when defined), for one seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    day = 86400.0
    paths = []

    fig, ax = plt.subplots(figsize=(10, 4))
    plot_nodes(ax, trace, runs, "used: {}")
    ax.set_xlabel("days since trace start")
    ax.set_ylabel("nodes")
    ax.set_title(f"Idle and used nodes, {trace.name}")
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    paths.append(out_dir / "nodes.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(10, 4))
    for name, run in runs.items():
        t, rate = _rates(run.sample_times, run.sample_net, trace.start)
        ax.plot((t - trace.start) / day, rate, lw=1, label=name)
    if bounds is not None and runs:
        sample_times = next(iter(runs.values())).sample_times
        edges = np.append(bounds.times, trace.end)
        cum = np.concatenate(([0.0], np.cumsum(np.diff(edges) * bounds.oracle_rate)))
        at = np.interp(sample_times, edges, cum)
        t, rate = _rates(sample_times, at, trace.start)
        ax.plot((t - trace.start) / day, rate, lw=1, color="k", ls="--", label="oracle F(N)")
    ax.set_xlabel("days since trace start")
    ax.set_ylabel("net samples / s")
    ax.set_title(f"Throughput per policy, {trace.name}")
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    paths.append(out_dir / "throughput.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


def plot_nodes(ax: Any, trace: Trace, runs: Mapping[str, RunResult], label: str) -> None:
    """Idle nodes over time (a grey step) and, per run, the nodes its jobs held (``label``
    formatted with the run's name), on a matplotlib axis; x in days since the trace start."""
    day = 86400.0
    starts, counts = trace.idle_counts()
    ax.step((np.append(starts, trace.end) - trace.start) / day, np.append(counts, counts[-1]),
            where="post", color="0.6", lw=0.8, label="idle nodes")
    for name, run in runs.items():
        t, used = _rates(run.sample_times, run.sample_node_s, trace.start)
        ax.plot((t - trace.start) / day, used, lw=1, label=label.format(name))


def _rates(times: np.ndarray, cumulative: np.ndarray, start: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-bin average rate of a cumulative series sampled at ``times`` (bins start at
    ``start``); plotted at bin centres."""
    edges = np.concatenate(([start], times))
    values = np.concatenate(([0.0], cumulative))
    width = np.diff(edges)
    width[width <= 0] = np.nan
    return (edges[:-1] + edges[1:]) / 2, np.diff(values) / width
