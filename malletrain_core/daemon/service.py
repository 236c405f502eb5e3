"""Read-only API ops for ``malletrain status|jobs|nodes|profile``, and the metrics endpoint.

Every user may read (like ``squeue`` without ``PrivateData``). Handlers run on the API
server's threads, so each holds the daemon's lock while it copies engine state into plain
JSON values; formatting is the CLI's business.

Wiring, from ``malletraind`` (:func:`attach`)::

    metrics = service.attach(daemon, dispatcher, config.daemon.metrics_port)
    ...
    if metrics is not None:
        metrics.close()
"""

from __future__ import annotations

import pwd
from collections.abc import Collection
from typing import Any

from .. import __version__
from ..engine.config import JobPhase, JobView
from ..engine.planner import Planner
from ..engine.router import trainers
from ..hostlist import fold
from ..wire.api import ApiError
from .api import Dispatcher
from .intake import HookListener, ReportListener
from .metrics import DaemonLike, MetricsServer, serve

PHASES = tuple(phase.value for phase in JobPhase)


def _drain(daemon: DaemonLike) -> dict[str, Any]:
    """The administrator's drain switch (``malletrain admin drain``)."""
    drain = daemon.drain
    return drain.state() if drain is not None else {"drained": False, "since": None}


def _trainers(engine: Planner) -> dict[str, dict[str, int]]:
    """Node and job counts per trainer (empty with a single engine)."""
    inner = trainers(engine)
    if inner is None:
        return {}
    return {name: {"free": len(one.idle_nodes), "held": len(one.node_map),
                   "jobs": len(one.jobs)} for name, one in inner.items()}


def _throughput(view: JobView) -> float | None:
    """Samples/s at the job's current scale: measured if it was, else the believed curve."""
    k = len(view.nodes)
    if k == 0:
        return None
    if k in view.measured:
        return float(view.measured[k])
    return None if view.curve is None else float(view.curve.at(k))


def job_record(view: JobView, trainer: str = "") -> dict[str, Any]:
    """One job as the ``jobs`` op returns it."""
    rate = _throughput(view)
    return {
        "job": view.id, "state": view.phase.value, "owner": view.owner, "model": view.model,
        "trainer": trainer,
        "nodes": len(view.nodes), "node_list": fold(view.nodes) if view.nodes else "",
        "min_nodes": view.min_nodes, "max_nodes": view.max_nodes,
        "submitted": view.submitted, "throughput": rate,
        "scale_up_s": view.scale_up_s, "scale_down_s": view.scale_down_s,
    }


class StatusService:
    """The read-only ops ``status``, ``jobs``, ``nodes`` and ``profile`` over one daemon.

    A user sees their own jobs only, as Slurm's ``PrivateData=jobs`` would show them: ``jobs``
    lists the caller's jobs, ``profile`` refuses another user's job and ``nodes`` names the
    holding job only where it is the caller's. Root and the admin users (the dispatcher's
    ``admin_uids``) see everything; ``status`` gives counts only, to everyone.
    """

    def __init__(self, daemon: DaemonLike, admin_uids: Collection[int] = frozenset({0})) -> None:
        self.daemon = daemon
        self.admin_uids = frozenset(admin_uids)
        self.started = self._now()

    def register(self, dispatcher: Dispatcher) -> None:
        """Add the ops to the daemon's API dispatcher (whose admin uids see every job)."""
        self.admin_uids = dispatcher.admin_uids
        dispatcher.register("status", self.status)
        dispatcher.register("jobs", self.jobs)
        dispatcher.register("nodes", self.nodes)
        dispatcher.register("profile", self.profile)

    def _viewer(self, uid: int) -> str | None:
        """The user name whose jobs ``uid`` may see; ``None``: every job (an admin)."""
        if uid in self.admin_uids:
            return None
        try:
            return pwd.getpwuid(uid).pw_name
        except KeyError:
            return f"uid {uid}"  # no account name: matches no job's owner

    def _now(self) -> float:
        return float(self.daemon.clock())

    def status(self, uid: int, args: dict[str, Any]) -> dict[str, Any]:
        """Versions, node and job counts, the daemon's and the engine's counters."""
        with self.daemon.lock:
            engine = self.daemon.engine
            phases = dict.fromkeys(PHASES, 0)
            for view in engine.jobs.values():
                phases[view.phase.value] += 1
            c = self.daemon.counters
            backend = self.daemon.backend
            return {
                "version": __version__,
                "backend": backend.name,
                "now": self._now(),
                "started": self.started,
                "nodes": {"free": len(engine.idle_nodes), "held": len(engine.node_map)},
                "jobs": phases,
                "daemon": {"cycles": c.cycles, "events": c.events,
                           "actions": dict(sorted(c.actions.items())),
                           "command_failures": c.command_failures,
                           "last_cycle_ms": c.last_cycle_ms,
                           "last_poll_time": c.last_poll_time,
                           "hook_to_action_ms": c.hook_latency(),
                           "grant_to_start_s": backend.grant_starts()},
                "engine": engine.stats.to_dict(),
                "trainers": _trainers(engine),
                "intake": _intake(self.daemon),
                "drain": _drain(self.daemon),
                "journal": _journal(self.daemon),
            }

    def jobs(self, uid: int, args: dict[str, Any]) -> dict[str, Any]:
        """Every job the caller may see (``args``: optional ``state`` and ``user`` filters)."""
        state = args.get("state")
        user = args.get("user")
        if state is not None and state not in PHASES:
            raise ApiError(f"unknown job state {state!r}; use one of {', '.join(PHASES)}")
        if user is not None and not isinstance(user, str):
            raise ApiError("jobs: 'user' must be a user name")
        viewer = self._viewer(uid)
        with self.daemon.lock:
            engine = self.daemon.engine
            records = [job_record(view, engine.trainer_of_job(view.id))
                       for view in engine.jobs.values()
                       if (state is None or view.phase.value == state)
                       and (user is None or view.owner == user)
                       and (viewer is None or view.owner == viewer)]
            return {"now": self._now(), "jobs": records}

    def nodes(self, uid: int, args: dict[str, Any]) -> dict[str, Any]:
        """Every offered idle node: free or held (by which job, if the caller may see it), and
        when its hole ends."""
        viewer = self._viewer(uid)
        with self.daemon.lock:
            engine = self.daemon.engine
            owner = dict(engine.node_map)
            if viewer is not None:  # another user's job stays anonymous: the node is "held"
                jobs = engine.jobs
                hidden = {j for j in set(owner.values())
                          if j not in jobs or jobs[j].owner != viewer}
                shown = {n: (j if j not in hidden else "") for n, j in owner.items()}
            else:
                shown = owner
            ends = engine.hole_ends
            names = set(engine.idle_nodes) | set(owner)
            records: list[dict[str, Any]] = [
                {"node": name, "state": "held" if name in owner else "free",
                 "job": shown.get(name, ""), "hole_end": ends.get(name),
                 "trainer": engine.trainer_of_node(name)}
                for name in names]
            now = self._now()
        records.sort(key=lambda r: _natural(r["node"]))
        return {"now": now, "nodes": records}

    def profile(self, uid: int, args: dict[str, Any]) -> dict[str, Any]:
        """One job's believed curve and its measured points (``args``: ``{"job": ID}``)."""
        job = args.get("job")
        if isinstance(job, int) and not isinstance(job, bool):
            job = str(job)
        if not isinstance(job, str) or not job:
            raise ApiError('profile needs a job id: {"job": "123"}')
        with self.daemon.lock:
            view = self.daemon.engine.jobs.get(job)
            viewer = self._viewer(uid)
            if view is not None and viewer is not None and view.owner != viewer:
                raise ApiError(f"job {job} belongs to another user; `malletrain profile` "
                               "shows your own jobs only (root and the SlurmUser see all)")
            if view is None:
                raise ApiError(f"job {job} is not known to malletraind; `malletrain jobs` "
                               "lists the jobs it knows")
            record = job_record(view)
            curve = view.curve
            record["measured"] = [[k, float(v)] for k, v in sorted(view.measured.items())]
            top = max(view.max_nodes, max(view.measured, default=0))
            # Only the scales the job can run at: the curve may extend beyond its maximum.
            points = [] if curve is None else [
                (k, float(p)) for k, p in zip(curve.nodes, curve.throughput) if k <= top]
            record["curve"] = None if curve is None else {
                "nodes": [k for k, _ in points], "throughput": [p for _, p in points]}
            record["table"] = [] if curve is None else [
                [k, float(p)] for k, p in enumerate(curve.table(top)) if k > 0]
            record["now"] = self._now()
        return record


def _journal(daemon: DaemonLike) -> dict[str, int]:
    """Events the state journal holds now, and the compactions since the daemon started."""
    return {"rows": daemon.store.rows, "compactions": daemon.compactions}


def _intake(daemon: DaemonLike) -> dict[str, dict[str, Any]]:
    """Received and dropped counts of the listeners the daemon watches (hooks, reports)."""
    mapping = daemon.selector.get_map()  # None once closed
    out: dict[str, dict[str, Any]] = {}
    for key in list(mapping.values()) if mapping is not None else []:
        listener = key.fileobj
        if isinstance(listener, (HookListener, ReportListener)):
            name = "hooks" if isinstance(listener, HookListener) else "reports"
            out[name] = {"received": listener.received,
                         "dropped": dict(sorted(listener.dropped.items()))}
    return out


def _natural(name: str) -> tuple[Any, ...]:
    """Sort key that puts n2 before n10."""
    head = name.rstrip("0123456789")
    tail = name[len(head):]
    return (head, int(tail) if tail else -1, name)


def attach(daemon: DaemonLike, dispatcher: Dispatcher, metrics_port: int,
           metrics_addr: str = "") -> MetricsServer | None:
    """Register the read-only ops and start the metrics endpoint (``metrics_port`` 0: off).

    Raises :class:`~malletrain_core.errors.ConfigError` (one line) if the port is taken.
    """
    StatusService(daemon).register(dispatcher)
    if not metrics_port:
        return None
    return serve(metrics_port, daemon, metrics_addr)
