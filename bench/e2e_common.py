"""What the Slurm and PBS end-to-end benches share (bench/e2e.py, bench/e2e_pbs.py): the
timed wait, the epoch watcher over the workers' output files, the 95th percentile and the
timing rows of their tables. Its own module so that the two benches import it and not each
other."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from devtools.waiting import wait_until

STEP = re.compile(r"^step=\d+ epoch=(\d+) world=(\d+) ")


class EpochWatcher:
    """When each (epoch, world size) first printed a training step, from the output files."""

    def __init__(self, outdir: Path, job: str) -> None:
        self.outdir, self.job = outdir, job
        self.offsets: dict[Path, int] = {}
        self.first: dict[int, tuple[int, float]] = {}  # epoch -> (world, first seen)

    def poll(self) -> None:
        now = time.monotonic()
        for path in self.outdir.glob(f"task-{self.job}_*.out"):
            with open(path, "rb") as fh:
                fh.seek(self.offsets.get(path, 0))
                data = fh.read()
            cut = data.rfind(b"\n") + 1
            self.offsets[path] = self.offsets.get(path, 0) + cut
            for line in data[:cut].decode(errors="replace").splitlines():
                m = STEP.match(line)
                if m and int(m.group(1)) not in self.first:
                    self.first[int(m.group(1))] = (int(m.group(2)), now)

    def wait_world(self, world: int, after: float, timeout_s: float) -> float:
        """The monotonic time the first epoch with ``world`` started after ``after``."""
        def started() -> float | None:
            self.poll()
            hits = [t for w, t in self.first.values() if w == world and t >= after]
            return min(hits) if hits else None
        return wait_until(f"training at world size {world}", started, timeout_s)


def wait(what: str, check: Any, timeout_s: float, interval_s: float = 0.05) -> float:
    """When (monotonic) ``check`` first held: the benches time from it."""
    wait_until(what, check, timeout_s, interval_s)
    return time.monotonic()


def p95(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(0.95 * len(s)))]


def timing_rows(r: dict[str, Any]) -> list[str]:
    """The grow, shrink and hook → action rows of an e2e table (Slurm's and PBS's alike)."""
    return [
        f"| node idle → training at the larger world size (grow) | {r['grow_s']:.1f} s | "
        f"{', '.join(f'{x:.1f}' for x in r['grow_s_all'])} s |",
        f"| preemption → training resumed at the smaller size (shrink) | {r['shrink_s']:.1f} s"
        f" | {', '.join(f'{x:.1f}' for x in r['shrink_s_all'])} s |",
        f"| hook datagram → batch-system command (daemon's own count, n = "
        f"{r['hook_to_action_count']}) | {r['hook_to_action_ms']:.0f} ms | "
        f"{r['hook_to_action_ms_p95']:.0f} ms |",
    ]
