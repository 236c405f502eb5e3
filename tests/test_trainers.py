"""Several trainers in malletraind: [[trainer]] tables, disjoint node sets, jobs routed by
the trainer they name, and the trainer shown by the API and the metrics."""

from __future__ import annotations

import pytest

from malletrain_core.config import from_mapping
from malletrain_core.daemon import main as daemon_main
from malletrain_core.daemon.core import Daemon
from malletrain_core.daemon.service import StatusService
from malletrain_core.daemon.store import Store
from malletrain_core.engine.router import Router
from malletrain_core.errors import ConfigError
from malletrain_core.events import IdleNode, JobRequest, JobSubmitted, NodesIdle
from malletrain_core.interfaces import Backend

TWO = {"trainer": [{"name": "a100", "nodes": "n[01-04]", "lookahead_s": 600.0},
                   {"name": "h100", "nodes": "n[05-08]", "solver": "milp"}]}


def test_trainer_tables_are_read_with_their_own_settings():
    cfg = from_mapping(TWO).validate()
    assert [t.name for t in cfg.trainer] == ["a100", "h100"]
    engine = daemon_main.make_engine(cfg)
    assert isinstance(engine, Router) and list(engine.engines) == ["a100", "h100"]
    a, h = engine.engines["a100"].config, engine.engines["h100"].config
    assert (a.lookahead_s, a.solver) == (600.0, "auto")
    assert (h.lookahead_s, h.solver) == (120.0, "milp")


def test_without_trainer_tables_there_is_one_engine():
    engine = daemon_main.make_engine(from_mapping({}).validate())
    assert not isinstance(engine, Router)


@pytest.mark.parametrize("trainers, message", [
    ([{"name": "a", "nodes": "n[01-04]"}, {"name": "b", "nodes": "n[04-06]"}],
     "node n04 is also trainer a's; node sets must be disjoint"),
    ([{"name": "a"}, {"name": "b"}], "at most one trainer may take the nodes"),
    ([{"name": "a"}, {"name": "a", "nodes": "n1"}], "'a' is used twice"),
    ([{"name": "", "nodes": "n1"}], "give each trainer a name"),
    ([{"name": "a", "nodes": "n[1-"}], "trainer a: nodes:"),
    ([{"name": "a", "solver": "pernode"}], "slow reference"),
    ([{"name": "a", "lookahead_s": -1.0}], "must be a finite number ≥ 0"),
    ([{"name": "a", "colour": "red"}], "unknown key 'colour'"),
])
def test_bad_trainer_tables_are_one_line(trainers, message):
    with pytest.raises(ConfigError, match=message) as err:
        from_mapping({"trainer": trainers}).validate()
    assert "\n" not in str(err.value)


def test_trainer_must_be_an_array_of_tables():
    with pytest.raises(ConfigError, match=r"write each trainer as a \[\[trainer\]\]"):
        from_mapping({"trainer": {"name": "a"}})


def route(engine: Router) -> None:
    engine.handle_many([
        JobSubmitted(0.0, JobRequest("1", min_nodes=1, max_nodes=8, trainer="h100")),
        JobSubmitted(0.0, JobRequest("2", min_nodes=1, max_nodes=8)),
        JobSubmitted(0.0, JobRequest("3", min_nodes=1, max_nodes=8, trainer="nope")),
        NodesIdle(0.0, tuple(IdleNode(f"n0{i}", None) for i in range(1, 10))),
    ])


def test_nodes_and_jobs_stay_in_their_trainer(caplog):
    engine = daemon_main.make_engine(from_mapping(TWO).validate())
    assert isinstance(engine, Router)
    route(engine)
    assert engine.trainer_of_job("1") == "h100"
    assert engine.trainer_of_job("2") == engine.trainer_of_job("3") == "a100"
    assert "asks for trainer 'nope'" in caplog.text
    held = engine.node_map
    assert {n for n, j in held.items() if j == "1"} <= {f"n0{i}" for i in range(5, 9)}
    assert {n for n, j in held.items() if j in ("2", "3")} <= {f"n0{i}" for i in range(1, 5)}
    assert "n09" not in held and "n09" not in engine.idle_nodes  # in no trainer's set
    assert engine.trainer_of_node("n09") == "" and engine.trainer_of_node("n05") == "h100"


def test_a_trainer_without_nodes_takes_the_rest():
    cfg = from_mapping({"trainer": [{"name": "small", "nodes": "n[01-02]"},
                                    {"name": "rest"}]}).validate()
    engine = daemon_main.make_engine(cfg)
    assert isinstance(engine, Router)
    route(engine)
    assert engine.trainer_of_node("n09") == "rest" and engine.trainer_of_node("n01") == "small"


class _Backend(Backend):
    name = "none"

    def poll(self, now):
        return []

    def execute(self, actions, now):
        return []


def _daemon(engine, tmp_path):
    return Daemon(engine, _Backend(), Store(tmp_path / "state"), clock=lambda: 1.0)


def test_status_jobs_nodes_and_metrics_show_the_trainer(tmp_path):
    engine = daemon_main.make_engine(from_mapping(TWO).validate())
    route(engine)
    service = StatusService(_daemon(engine, tmp_path))
    status = service.status(0, {})
    assert set(status["trainers"]) == {"a100", "h100"}
    assert status["trainers"]["a100"]["jobs"] == 2 and status["trainers"]["h100"]["jobs"] == 1
    assert {j["job"]: j["trainer"] for j in service.jobs(0, {})["jobs"]} == {
        "1": "h100", "2": "a100", "3": "a100"}
    nodes = {n["node"]: n["trainer"] for n in service.nodes(0, {})["nodes"]}
    assert nodes["n01"] == "a100" and nodes["n08"] == "h100"
    pytest.importorskip("prometheus_client")
    from malletrain_core.daemon.metrics import DaemonCollector

    families = {f.name: f for f in DaemonCollector(_daemon(engine, tmp_path / "again")).collect()}
    samples = {(s.labels["trainer"], s.labels["state"]): s.value
               for s in families["malletrain_trainer_nodes"].samples}
    assert samples[("h100", "held")] + samples[("h100", "free")] == 4


def test_a_router_snapshot_restores_every_trainer_and_the_routes():
    from malletrain_core.daemon import snapshot as snapshots
    from malletrain_core.events import NodesReclaimed, Tick

    cfg = from_mapping(TWO).validate()
    live = daemon_main.make_engine(cfg)
    route(live)
    restored = daemon_main.make_engine(cfg)
    snapshots.restore(restored, snapshots.snapshot(live))
    assert snapshots.canonical(restored) == snapshots.canonical(live)
    later = [NodesReclaimed(30.0, ("n02", "n06")), Tick(60.0),
             JobSubmitted(61.0, JobRequest("4", min_nodes=1, max_nodes=2, trainer="h100"))]
    assert restored.handle_many(later) == live.handle_many(later)
    other = daemon_main.make_engine(from_mapping({"trainer": [{"name": "x"}]}).validate())
    with pytest.raises(snapshots.SnapshotError, match=r"holds trainers \['a100', 'h100'\]"):
        snapshots.restore(other, snapshots.snapshot(live))
