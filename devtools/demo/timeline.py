"""The demo's timeline as a PNG: idle vs harvested nodes over time, and each elastic job's
scale (RUNNING tasks), both from the squeue/sinfo samples."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .summary import Sample


def draw(samples: Sequence[Sample], nodes: int, path: str | Path,
         title: str = "MalleTrain on a local Slurm cluster") -> Path:
    """Write the two-panel timeline to ``path`` (Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    path = Path(path)
    if not samples:
        raise ValueError("no samples to draw")
    t0 = samples[0].t
    t = [s.t - t0 for s in samples]
    idle = [nodes - len(s.prod | s.down) for s in samples]
    harvested = [len(s.harvested) for s in samples]
    prod = [len(s.prod) for s in samples]
    jobs = sorted({j for s in samples for j in s.jobs}, key=lambda j: (len(j), j))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    top.step(t, prod, where="post", color="0.55", lw=1.2, label="prod (main queue)")
    top.fill_between(t, 0, idle, step="post", color="#f2c14e", alpha=0.45,
                     label="idle (free for harvesting)")
    top.fill_between(t, 0, harvested, step="post", color="#2a7f62", alpha=0.85,
                     label="harvested by elastic jobs")
    top.set_ylim(0, nodes + 0.5)
    top.set_ylabel("nodes")
    top.set_title(title)
    top.legend(loc="upper right", fontsize=8, ncol=3)
    top.grid(alpha=0.3)
    for job in jobs:
        bottom.step(t, [s.jobs.get(job, 0) for s in samples], where="post", lw=1.5,
                    label=f"job {job}")
    peak = max((k for s in samples for k in s.jobs.values()), default=1)
    bottom.set_ylim(0, peak + 0.5)
    bottom.yaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.set_ylabel("running tasks")
    bottom.set_xlabel("seconds since the workload started")
    if jobs:
        bottom.legend(loc="upper right", fontsize=8, ncol=min(6, len(jobs)))
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
