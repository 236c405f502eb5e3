"""A stand-in batch system with random churn, for long runs of the real daemon.

Each poll draws, from one seeded generator, what a busy site shows the daemon: nodes falling
idle (some with a known hole end) and taken back, elastic jobs submitted and ending, workers
lost, and a progress report of every job that holds nodes. Grows and shrinks are carried out
at once and confirmed by worker events, as the Slurm backend's next poll would. It implements
the :class:`~malletrain_core.backends.base.Backend` protocol, so a
:class:`~malletrain_core.daemon.core.Daemon` drives it exactly as it drives Slurm; the journal
compaction tests and ``bench/journal.py`` use it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from ..events import (
    Action,
    EndReason,
    Event,
    Grow,
    IdleNode,
    JobEnded,
    JobRequest,
    JobSubmitted,
    NodesIdle,
    NodesReclaimed,
    ProgressReport,
    Shrink,
    WorkerStarted,
    WorkerStopped,
)
from ..interfaces import Backend
from ..model import Curve

MODELS = ("resnet50", "bert", "vit", "")


class ChurnBackend(Backend):
    """``nodes`` nodes, ``jobs_alive`` elastic jobs kept in the system on average."""

    name = "churn"

    def __init__(self, seed: int, nodes: int = 48, jobs_alive: int = 8) -> None:
        self.rng = random.Random(seed)
        self.names = [f"n{i:03d}" for i in range(nodes)]
        self.jobs_alive = jobs_alive
        self.offered: set[str] = set()
        self.owner: dict[str, str] = {}
        self.alive: dict[str, tuple[float, int]] = {}  # job → (samples so far, epoch)
        self.rate = {}  # type: dict[str, float]
        self.next_id = 1
        self.last = 0.0

    def _held(self, job: str) -> int:
        return sum(1 for owner in self.owner.values() if owner == job)

    def poll(self, now: float) -> list[Event]:
        rng = self.rng
        out: list[Event] = []
        if len(self.alive) < self.jobs_alive and rng.random() < 0.5:
            lo = rng.randint(1, 3)
            hi = rng.randint(lo, 12)
            curve = None
            if rng.random() < 0.2:
                curve = Curve.of(list(range(1, hi + 1)),
                                 [100.0 * k ** 0.8 for k in range(1, hi + 1)])
            jid = str(self.next_id)
            self.next_id += 1
            req = JobRequest(jid, lo, hi, owner=f"u{rng.randint(1, 4)}",
                             model=rng.choice(MODELS), curve=curve,
                             profile=rng.random() < 0.8)
            out.append(JobSubmitted(now, req))
            self.alive[jid] = (0.0, 0)
            self.rate[jid] = rng.uniform(50.0, 200.0)
        free = [n for n in self.names if n not in self.offered]
        if free and rng.random() < 0.4:
            picked = rng.sample(free, min(len(free), rng.randint(1, 6)))
            self.offered.update(picked)
            out.append(NodesIdle(now, tuple(
                IdleNode(n, None if rng.random() < 0.5 else now + rng.uniform(30, 3600))
                for n in sorted(picked))))
        if self.offered and rng.random() < 0.3:
            gone = rng.sample(sorted(self.offered), min(len(self.offered), rng.randint(1, 4)))
            for n in gone:
                self.offered.discard(n)
                self.owner.pop(n, None)
            out.append(NodesReclaimed(now, tuple(sorted(gone))))
        if self.alive and rng.random() < 0.08:
            jid = rng.choice(sorted(self.alive))
            del self.alive[jid]
            for n in [n for n, j in self.owner.items() if j == jid]:
                del self.owner[n]
            out.append(JobEnded(now, jid, rng.choice(list(EndReason))))
        if self.owner and rng.random() < 0.03:
            node = rng.choice(sorted(self.owner))
            out.append(WorkerStopped(now, self.owner.pop(node), node))
        dt = max(0.0, now - self.last)
        self.last = now
        for jid in sorted(self.alive):
            k = self._held(jid)
            if k == 0:
                continue
            samples, epoch = self.alive[jid]
            samples += self.rate[jid] * k ** 0.8 * dt * rng.uniform(0.9, 1.1)
            if rng.random() < 0.02:
                samples *= 0.9  # a rollback to a checkpoint
                epoch += 1
            self.alive[jid] = (samples, epoch)
            out.append(ProgressReport(now, jid, samples, k, epoch))
        return out

    def execute(self, actions: Sequence[Action], now: float) -> list[Event]:
        out: list[Event] = []
        for action in actions:
            if isinstance(action, Shrink):
                for n in action.nodes:
                    if self.owner.get(n) == action.job_id:
                        del self.owner[n]
                        out.append(WorkerStopped(now, action.job_id, n))
            elif isinstance(action, Grow):
                for n in action.nodes:
                    if n in self.offered and n not in self.owner and \
                            action.job_id in self.alive:
                        self.owner[n] = action.job_id
                        out.append(WorkerStarted(now, action.job_id, n))
        return out
