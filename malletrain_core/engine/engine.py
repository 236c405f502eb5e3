"""The Engine: events in, actions out; pure and deterministic (time comes from the events).

State: the pool of idle nodes MalleTrain was offered (each with the end of its hole when known),
which job holds which node, the queue, the admitted jobs, the Job Monitor and the Job
Profiling Advisor's runs. A re-plan (on new idle nodes, a reclaim of held nodes, a new job, a
job's end, or when a profiling step is due) advances profiling, admits queued jobs FCFS up to
the cap (a job whose model is being profiled right now waits for that curve without holding up
the others), lets the advisor extend a short curve, asks the policy for node counts of the
running jobs, places them by the keep rule and returns the difference as actions: checkpoints
first, then shrinks, then grows. Nodes reclaimed by the batch system are simply gone: their
workers were already stopped, so no action names them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, MutableMapping, Sequence
from types import MappingProxyType
from typing import Any

from .. import events as ev
from ..allocator.lifetime import solve as lifetime_solve
from ..allocator.placement import place_moves
from ..errors import SolverError, ValidationError
from ..model import Curve, Node, Problem
from .config import EngineConfig, EngineStats, JobPhase, JobView, Policy
from .jobs import JobRecord, Source, curve_state, load_curve
from .monitor import Monitor
from .policy import checked_counts, default_policy
from .pool import NodePool
from .profiler import Advisor


class Engine:
    """One allocator over one set of nodes (see the module docstring).

    ``curve_store`` maps a declared model name to its measured curve; pass one mapping to
    several engines (or a persistent one) to share what was measured.
    """

    def __init__(self, config: EngineConfig | None = None, policy: Policy | None = None,
                 name: str = "default",
                 curve_store: MutableMapping[str, Curve] | None = None) -> None:
        self.config = config if config is not None else EngineConfig()
        self.name = name
        self._policy = policy if policy is not None else default_policy(self.config.solver)
        self._store: MutableMapping[str, Curve] = curve_store if curve_store is not None else {}
        self._monitor = Monitor(self.config.profile_window_s)
        self._pool = NodePool()
        self._jobs: dict[str, JobRecord] = {}
        self._queue: list[str] = []
        self._admitted: dict[str, None] = {}
        self._ended: dict[str, float] = {}  # finished job -> engine time it ended, in order
        self._stats = EngineStats()
        self._advisor = Advisor(self.config, self._pool, self._monitor, self._jobs, self._store,
                                self._stats)
        self._next_order = 0
        self._now = -math.inf

    # ----------------------------------------------------------------- public views
    @property
    def jobs(self) -> Mapping[str, JobView]:
        """Every job the engine has seen, as read-only snapshots."""
        return {jid: job.view(self._monitor, self.config) for jid, job in self._jobs.items()}

    def knows(self, job_id: str) -> bool:
        """Whether the job is in the engine's state (a finished job is, for its retention)."""
        return job_id in self._jobs

    @property
    def node_map(self) -> Mapping[str, str]:
        """Node → id of the job holding it (a live read-only view)."""
        return MappingProxyType(self._pool.owner)

    @property
    def idle_nodes(self) -> frozenset[str]:
        """Idle nodes no job holds."""
        return frozenset(self._pool.free)

    @property
    def hole_ends(self) -> Mapping[str, float | None]:
        """Offered node → end of its idle hole (``None`` when unknown); a live read-only view."""
        return MappingProxyType(self._pool.hole_end)

    def trainer_of_job(self, job_id: str) -> str:
        """A single engine has no trainers to tell apart: ``""``."""
        return ""

    def trainer_of_node(self, node: str) -> str:
        """A single engine has no trainers to tell apart: ``""``."""
        return ""

    @property
    def stats(self) -> EngineStats:
        """A copy of the engine's counters."""
        return EngineStats(**vars(self._stats))

    @property
    def monitor(self) -> Monitor:
        """The Job Monitor (throughput per scale and rescale costs of every admitted job)."""
        return self._monitor

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Everything the events built, as plain data (JSON-ready): not the configuration,
        the policy or what is kept only to save work. The reclaim predictor's counts, learned
        from events though kept in the configuration, are in it. A fresh engine of the same
        configuration given it by :meth:`load_state_dict` decides as this one does."""
        lifetime = self.config.lifetime
        return {"now": None if self._now == -math.inf else self._now,
                "next_order": self._next_order,
                "jobs": {jid: job.state_dict() for jid, job in self._jobs.items()},
                "queue": list(self._queue), "admitted": list(self._admitted),
                "ended": dict(self._ended),
                "store": {model: curve_state(curve) for model, curve in self._store.items()},
                "pool": self._pool.state_dict(), "monitor": self._monitor.state_dict(),
                "profiler": self._advisor.state_dict(), "stats": self._stats.to_dict(),
                "lifetime": None if lifetime is None else lifetime.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the state :meth:`state_dict` wrote (into a fresh engine: its configuration and
        policy stay); raises KeyError, TypeError or ValueError on one it cannot read."""
        if "engines" in state:
            raise ValueError(f"the state is of a router of trainers {sorted(state['engines'])}, "
                             "not of one engine")
        now = state["now"]
        self._now = -math.inf if now is None else float(now)
        self._next_order = int(state["next_order"])
        self._pool.load_state_dict(state["pool"])
        self._monitor.load_state_dict(state["monitor"])
        self._jobs.clear()  # in place: the profiler holds this mapping, the store and counters
        for jid, job in state["jobs"].items():
            self._jobs[jid] = JobRecord.from_state(job, self._pool.holding(jid))
        self._store.clear()
        self._store.update({model: load_curve(curve) for model, curve in state["store"].items()})
        self._stats.load_state_dict(state["stats"])
        self._advisor.load_state_dict(state["profiler"])
        self._queue = [str(jid) for jid in state["queue"]]
        self._admitted = dict.fromkeys(str(jid) for jid in state["admitted"])
        self._ended = {str(jid): float(t) for jid, t in state["ended"].items()}
        lifetime = self.config.lifetime
        if lifetime is not None and state["lifetime"] is not None:
            lifetime.load_state_dict(state["lifetime"])

    # ----------------------------------------------------------------- events
    def handle(self, event: ev.Event) -> list[ev.Action]:
        """Take one event; re-plan if it calls for it."""
        return self.handle_many((event,))

    def handle_many(self, events: Sequence[ev.Event]) -> list[ev.Action]:
        """Take a burst of events and re-plan at most once, at the latest event's time."""
        actions: list[ev.Action] = []
        replan = False
        for event in events:
            if not isinstance(event, ev.Event) or not math.isfinite(t := event.time):
                raise ValidationError(f"engine {self.name!r}", "event",
                                      f"{event!r} is not a malletrain_core.events event with a "
                                      "finite time; send one of those classes")
            if t > self._now > -math.inf:  # node-seconds harvested since then
                self._stats.held_node_s += len(self._pool.owner) * (t - self._now)
            self._now = max(self._now, float(t))
            replan |= self._apply(event, actions)
        if replan:
            actions.extend(self._replan(self._now))
        if self._ended and self.config.done_retention_s is not None:
            self._forget(self._now - self.config.done_retention_s)
        return actions

    def _forget(self, before: float) -> None:
        """Drop the finished jobs that ended before ``before`` (event time): nothing
        refers to a finished job any more (its nodes, queue place, monitor track and profiling
        run went when it ended); a repeat of its end or reports is ignored as for any unknown
        job, and the counters keep it."""
        while self._ended:
            jid, ended = next(iter(self._ended.items()))
            if ended >= before:
                return
            del self._ended[jid]
            self._jobs.pop(jid, None)
            self._pool.held.pop(jid, None)  # its (empty) node set
            self._stats.forgotten += 1

    def _apply(self, event: ev.Event, out: list[ev.Action]) -> bool:
        # The most frequent kinds first (reports, then a worker's confirmation per node moved);
        # no event class derives from another, so the order decides nothing else.
        if isinstance(event, ev.ProgressReport):
            self._monitor.report(event)
            return self._advisor.report_due(event.job_id, event.time)
        if isinstance(event, ev.WorkerStarted):
            return False
        if isinstance(event, ev.WorkerStopped):
            return self._on_worker_stopped(event)
        if isinstance(event, ev.NodesIdle):
            return self._pool.offer(event.nodes, event.time)
        if isinstance(event, ev.NodesReclaimed):
            return self._on_reclaimed(event)
        if isinstance(event, ev.JobSubmitted):
            return self._on_submitted(event)
        if isinstance(event, ev.JobEnded):
            return self._on_ended(event, out)
        if isinstance(event, ev.Tick):
            return self._advisor.due(event.time)
        raise ValidationError(f"engine {self.name!r}", "event",
                              f"unknown event type {type(event).__name__}; send one of the "
                              "malletrain_core.events classes")

    def _on_reclaimed(self, event: ev.NodesReclaimed) -> bool:
        if self.config.lifetime is not None:  # each reclaim ends an idle fragment: learn it
            for name in event.nodes:
                since = self._pool.since.get(name)
                if since is not None:
                    self.config.lifetime.observe(event.time - since)
        hit = self._pool.reclaim(event.nodes)
        for jid in hit:
            job = self._jobs[jid]
            job.last_interrupted = event.time
            self._stats.preemptions += 1
            self._monitor.rescale(jid, event.time, len(job.nodes), preempted=True)
        # Losing free nodes leaves the current plan feasible and still optimal: no re-plan.
        return bool(hit)

    def _on_submitted(self, event: ev.JobSubmitted) -> bool:
        req = event.job
        if not isinstance(req, ev.JobRequest):
            raise ValidationError(f"engine {self.name!r}", "job", f"{req!r} is not a JobRequest")
        JobRecord.validate(req)
        if req.id in self._jobs:
            return False  # a repeat (a backend re-discovering the job): nothing new
        self._jobs[req.id] = JobRecord(req, self._next_order, float(event.time),
                                       nodes=self._pool.holding(req.id))
        self._next_order += 1
        self._queue.append(req.id)
        return True

    def _on_ended(self, event: ev.JobEnded, out: list[ev.Action]) -> bool:
        job = self._jobs.get(event.job_id)
        if job is None or job.phase is JobPhase.DONE:
            return False
        if job.phase is JobPhase.QUEUED:
            self._queue.remove(job.id)
        self._advisor.remember(job)
        self._advisor.drop(job.id)
        job.curve = job.believed(self._monitor, self.config.profiling)
        self._pool.drop(job.id)
        job.phase = JobPhase.DONE
        self._admitted.pop(job.id, None)
        self._monitor.remove(job.id)
        self._ended[job.id] = self._now
        out.append(ev.Finish(job.id))
        return True

    def _on_worker_stopped(self, event: ev.WorkerStopped) -> bool:
        """A worker the engine did not stop (a task that failed, a grant the batch system did
        not carry out): the job lost that node, which stays idle, so the allocation is made
        again at once (it was not: a node freed so stayed idle until some other event, 4 min
        in bench/e2e.py). True when the plan changed."""
        if self._pool.owner.get(event.node) != event.job_id:
            return False  # the confirmation of a shrink, or of a reclaim already applied
        job = self._jobs[event.job_id]
        self._pool.drop(event.job_id, (event.node,))
        job.last_interrupted = event.time
        self._monitor.rescale(event.job_id, event.time, len(job.nodes), preempted=True)
        return True

    # ----------------------------------------------------------------- re-planning
    def _replan(self, now: float) -> list[ev.Action]:
        self._stats.replans += 1
        self._pool.take_delta()
        self._advisor.advance(now)
        self._requeue()
        self._admit(now)
        self._requeue()
        self._advisor.extend(now)
        self._allocate(now)
        if self._pool.free:  # nodes nobody is given: a cut step back up, or measure a
            self._advisor.restore(now)  # doubtful estimate again
        if self._pool.free:
            self._advisor.remeasure(now)
        return self._emit(now)

    def _requeue(self) -> None:
        sent_back = self._advisor.sent_back
        for jid in reversed(sent_back):
            self._admitted.pop(jid, None)
            self._queue.insert(0, jid)
        sent_back.clear()

    def _admit(self, now: float) -> None:
        cap = self.config.max_running_jobs
        slots = math.inf if cap is None else cap - len(self._admitted)
        i = 0
        while i < len(self._queue) and slots > 0:
            job = self._jobs[self._queue[i]]
            req = job.req
            if req.id in self._pool.delta:
                break  # sent back to the queue in this very re-plan: not again at once
            if req.curve is not None:
                job.set_source(Source.USER, req.curve)
                job.phase = JobPhase.RUNNING
            elif req.model and req.model in self._store:
                job.set_source(Source.STORE, self._store[req.model])
                job.phase = JobPhase.RUNNING
            elif self._advisor.profiling_model(req.model):
                i += 1  # its model's curve is being measured: wait for it, hold up nobody
                continue
            elif not self._advisor.start(job, now):
                break  # FCFS: the head waits for nodes to profile on, and so do the others
            del self._queue[i]
            self._admitted[req.id] = None
            self._monitor.add(req.id)
            self._stats.admitted += 1
            slots -= 1

    def _allocate(self, now: float) -> None:
        running = [self._jobs[jid] for jid in self._admitted
                   if self._jobs[jid].phase is JobPhase.RUNNING]
        if not running:
            return
        jobs = []
        held = 0
        for job in running:
            cur = len(job.nodes)
            held += cur
            top = job.req.max_nodes
            if job.id in self._pool.delta:  # lent nodes to profiling just now: may only shrink
                top = max(cur, job.req.min_nodes)
            jobs.append(job.allocator_job(self._monitor, self.config, top))
        problem = Problem(len(self._pool.free) + held, tuple(jobs), self.config.lookahead_s,
                          self.config.objective, self.config.constraints)
        lives = self._lives(now, running) if self.config.lifetime is not None else None
        try:
            solution = self._policy(problem) if lives is None else lifetime_solve(
                problem, {job.id: [lives[n] for n in job.nodes] for job in running},
                [lives[n] for n in self._pool.free])
        except SolverError:
            self._stats.solver_failures += 1
            return  # keep the current map
        self._stats.solve_ms += solution.solve_ms
        self._stats.solves += 1
        counts = checked_counts(problem, solution)
        if all(counts[j.id] == j.current_nodes for j in jobs):
            return
        moved = [job for job in running if counts[job.id] != len(job.nodes)]  # place_moves
        shrinking = [name for job in moved if counts[job.id] < len(job.nodes)
                     for name in job.nodes]
        known = dict(zip(shrinking, self._pool.nodes(shrinking, now)))
        free = self._pool.nodes(self._pool.free, now)
        if lives is not None:  # placement keeps and hands out the longest predicted lives
            known = {n: Node(n, node.group, lives[n][0]) for n, node in known.items()}
            free = [Node(node.name, node.group, lives[node.name][0]) for node in free]
        result = place_moves(counts, {job.id: job.nodes for job in running}, free, known)
        targets = [(job.id, job, set(result.get(job.id, ()))) for job in moved]
        for jid, job, new in targets:  # every release first: growers take released nodes
            for name in job.nodes - new:
                self._pool.release(jid, name)
        for jid, job, new in targets:
            for name in new - job.nodes:
                self._pool.assign(jid, name)

    def _lives(self, now: float, running: Sequence[JobRecord]) -> dict[str, tuple[float, float]]:
        """(life, risk) of every free or held node from the lifetime predictor."""
        assert self.config.lifetime is not None
        names = list(self._pool.free)
        names.extend(n for job in running for n in job.nodes)
        since = self._pool.since
        ends = self._pool.hole_end
        ages = [now - since.get(n, now) for n in names]
        holes = [None if ends.get(n) is None else self._pool.remaining(n, now) for n in names]
        life, risk = self.config.lifetime.predict(ages, holes)
        return dict(zip(names, zip(life.tolist(), risk.tolist())))

    def _emit(self, now: float) -> list[ev.Action]:
        checkpoints: list[ev.Action] = []
        shrinks: list[ev.Action] = []
        grows: list[ev.Action] = []
        delta = self._pool.take_delta()
        for jid in sorted(delta, key=lambda j: self._jobs[j].order):
            before, removed, added = delta[jid]
            if not removed and not added:
                continue
            job = self._jobs[jid]
            if before > 0:
                checkpoints.append(ev.Checkpoint(jid))
                job.last_interrupted = now
            if removed:
                shrinks.append(ev.Shrink(jid, tuple(sorted(removed))))
            if added:
                # One grow per time limit: a node without a hole end (or with a long one) is
                # not held back by another node's short hole, which the backend may refuse.
                by_limit = self._pool.by_time_limit(sorted(added), now,
                                                    self.config.default_time_limit_s)
                grows += [ev.Grow(jid, tuple(names), limit)
                          for limit, names in sorted(by_limit.items(), reverse=True)]
            self._monitor.rescale(jid, now, len(job.nodes))
        self._stats.checkpoints += len(checkpoints)
        self._stats.shrinks += len(shrinks)
        self._stats.grows += len({g.job_id for g in grows})  # jobs grown, not grow actions
        return checkpoints + shrinks + grows
