"""Prometheus metrics of a running daemon, read at scrape time.

A custom collector reads the engine's state and counters and the daemon's cycle counters
under the daemon's lock; nothing is updated on the hot path for the sake of metrics. The
counters come from the engine's own statistics, which a restarted daemon rebuilds by replaying
its journal, so they do not fall back to zero after a restart.

Exposed (all prefixed ``malletrain_``):

* ``nodes{state}`` — offered idle nodes, ``free`` or ``held`` by an elastic job;
* ``jobs{state}`` — jobs by phase: ``queued``, ``profiling``, ``running``, ``done``;
* ``rescales_total{direction}`` — grows (``up``) and shrinks (``down``) ordered;
* ``preemptions_total`` — jobs that lost nodes to the batch system taking them back;
* ``solver_duration_seconds`` — a summary (count and sum) of the allocation solves;
* ``harvested_node_seconds_total`` — node-seconds that elastic jobs held idle nodes;
* the daemon's ``cycles_total``, ``events_total``, ``actions_total{type}``,
  ``command_failures_total``, ``last_cycle_seconds`` and ``last_poll_timestamp_seconds``.
"""

from __future__ import annotations

import logging
import selectors
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.exposition import start_http_server

from ..engine.config import JobPhase
from ..engine.planner import Planner
from ..engine.router import trainers
from ..errors import ConfigError
from ..interfaces import Backend
from .core import Counters
from .drain import Drain
from .store import Store

log = logging.getLogger(__name__)


class DaemonLike(Protocol):
    """What the collector and the read-only API ops (:mod:`.service`) read of a
    :class:`~malletrain_core.daemon.core.Daemon`; the ops hold ``lock`` while they read."""

    engine: Planner
    backend: Backend
    counters: Counters
    lock: Any
    clock: Callable[[], float]
    drain: Drain | None
    store: Store
    compactions: int
    selector: selectors.BaseSelector


class DaemonCollector:
    """Reads one daemon at every scrape (a ``prometheus_client`` custom collector)."""

    def __init__(self, daemon: DaemonLike) -> None:
        self.daemon = daemon

    def describe(self) -> list[Metric]:
        return []  # families are only known by collecting; scrapes never need this

    def collect(self) -> Iterator[Metric]:
        with self.daemon.lock:
            engine = self.daemon.engine
            held = len(engine.node_map)
            free = len(engine.idle_nodes)
            phases = {phase.value: 0 for phase in JobPhase}
            for view in engine.jobs.values():
                phases[view.phase.value] += 1
            stats = engine.stats
            counters = self.daemon.counters
            cycles, events = counters.cycles, counters.events
            actions = dict(counters.actions)
            failures, last_ms = counters.command_failures, counters.last_cycle_ms
            last_poll = counters.last_poll_time
            inner: Mapping[str, Planner] = trainers(engine) or {engine.name: engine}
            per_trainer = [(str(name), len(one.idle_nodes), len(one.node_map),
                            Counter(v.phase.value for v in one.jobs.values()))
                           for name, one in inner.items()]

        nodes = GaugeMetricFamily("malletrain_nodes", "Idle nodes offered to MalleTrain, by "
                                  "state (free, or held by an elastic job)", labels=["state"])
        nodes.add_metric(["free"], free)
        nodes.add_metric(["held"], held)
        yield nodes
        jobs = GaugeMetricFamily("malletrain_jobs", "Elastic jobs by phase", labels=["state"])
        for phase, n in phases.items():
            jobs.add_metric([phase], n)
        yield jobs
        t_nodes = GaugeMetricFamily("malletrain_trainer_nodes", "Idle nodes by trainer and "
                                    "state (free, or held by an elastic job)",
                                    labels=["trainer", "state"])
        t_jobs = GaugeMetricFamily("malletrain_trainer_jobs", "Elastic jobs by trainer and "
                                   "phase", labels=["trainer", "state"])
        for name, t_free, t_held, t_phases in per_trainer:
            t_nodes.add_metric([name, "free"], t_free)
            t_nodes.add_metric([name, "held"], t_held)
            for phase in phases:
                t_jobs.add_metric([name, phase], t_phases.get(phase, 0))
        yield t_nodes
        yield t_jobs
        rescales = CounterMetricFamily("malletrain_rescales", "Rescales ordered, by direction",
                                       labels=["direction"])
        rescales.add_metric(["up"], stats.grows)
        rescales.add_metric(["down"], stats.shrinks)
        yield rescales
        yield CounterMetricFamily("malletrain_preemptions", "Jobs that lost nodes to the batch "
                                  "system taking them back", value=stats.preemptions)
        yield CounterMetricFamily("malletrain_checkpoints", "Checkpoints ordered before "
                                  "rescales", value=stats.checkpoints)
        yield SummaryMetricFamily("malletrain_solver_duration_seconds", "Time spent in the "
                                  "allocation solver", count_value=stats.solves,
                                  sum_value=stats.solve_ms / 1e3)
        yield CounterMetricFamily("malletrain_solver_failures", "Solves that failed (the "
                                  "allocation was kept)", value=stats.solver_failures)
        yield CounterMetricFamily("malletrain_replans", "Re-plans of the engine",
                                  value=stats.replans)
        yield CounterMetricFamily("malletrain_harvested_node_seconds", "Node-seconds of idle "
                                  "nodes held by elastic jobs", value=stats.held_node_s)
        yield CounterMetricFamily("malletrain_daemon_cycles", "Daemon cycles (poll, decide, "
                                  "act)", value=cycles)
        yield CounterMetricFamily("malletrain_events", "Events taken by the engine",
                                  value=events)
        kinds = CounterMetricFamily("malletrain_actions", "Actions executed, by type",
                                    labels=["type"])
        for kind in sorted(actions):
            kinds.add_metric([kind.lower()], actions[kind])
        yield kinds
        yield CounterMetricFamily("malletrain_command_failures", "Batch-system commands that "
                                  "failed (the cycle was skipped)", value=failures)
        yield GaugeMetricFamily("malletrain_last_cycle_seconds", "Duration of the last daemon "
                                "cycle", value=last_ms / 1e3)
        yield GaugeMetricFamily("malletrain_last_poll_timestamp_seconds", "Time of the last "
                                "successful poll of the batch system", value=last_poll)


class MetricsServer:
    """The HTTP endpoint serving ``/metrics`` on a background thread."""

    def __init__(self, httpd: Any, thread: threading.Thread) -> None:
        self._httpd = httpd
        self._thread = thread

    @property
    def port(self) -> int:
        """The port actually bound (useful with port 0)."""
        return int(self._httpd.server_port)

    def close(self) -> None:
        """Stop serving and release the port."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def registry_for(daemon: DaemonLike) -> CollectorRegistry:
    """A registry holding only this daemon's collector (not the process-wide default)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DaemonCollector(daemon))
    return registry


def serve(port: int, daemon: DaemonLike, addr: str = "") -> MetricsServer:
    """Serve the daemon's metrics at ``http://addr:port/metrics`` (``addr=""``: every
    interface; ``port=0``: an ephemeral port, see :attr:`MetricsServer.port`)."""
    try:
        httpd, thread = start_http_server(port, addr or "0.0.0.0", registry_for(daemon))
    except OSError as exc:
        raise ConfigError(f"daemon.metrics_port: cannot listen on {addr or '*'}:{port}: "
                          f"{exc.strerror or exc}; choose a free port, or 0 in the "
                          "configuration to turn metrics off") from None
    server = MetricsServer(httpd, thread)
    log.info("metrics on http://%s:%d/metrics", addr or "*", server.port)
    return server
