"""malletraind's wiring: the backend comes from daemon.batch_system, the engine from the file."""

from __future__ import annotations

import pytest

from malletrain_core.backends.pbs.backend import PbsBackend
from malletrain_core.backends.slurm.backend import SlurmBackend
from malletrain_core.config import load
from malletrain_core.daemon import main as daemon_main
from malletrain_core.errors import MalleTrainError
from malletrain_core.model import Objective


def config_file(tmp_path, text):
    path = tmp_path / "malletrain.toml"
    path.write_text(text)
    return load(path, env={})


def test_slurm_backend_by_default(tmp_path):
    backend = daemon_main.make_backend(config_file(tmp_path, "[slurm]\npartition = \"elastic\"\n"))
    assert isinstance(backend, SlurmBackend) and backend.partition == "elastic"


def test_pbs_backend_from_config(tmp_path):
    cfg = config_file(tmp_path, "[daemon]\nbatch_system = \"pbs\"\n[pbs]\nqueue = \"mt_q\"\n")
    backend = daemon_main.make_backend(cfg)
    assert isinstance(backend, PbsBackend) and backend.queue == "mt_q"


def test_every_registered_batch_system_builds_from_the_defaults():
    from malletrain_core.backends.registry import BATCH_SYSTEMS
    from malletrain_core.config import Config, DaemonConfig

    assert set(BATCH_SYSTEMS) >= {"slurm", "pbs"}
    for name in BATCH_SYSTEMS:
        backend = daemon_main.make_backend(Config(daemon=DaemonConfig(batch_system=name)))
        assert backend.name == name


def test_an_unregistered_batch_system_is_one_line_naming_the_choices(tmp_path):
    from malletrain_core.errors import ConfigError

    cfg = config_file(tmp_path, "[daemon]\nbatch_system = \"lsf\"\n")
    with pytest.raises(ConfigError, match="'lsf' is not supported; use one of 'slurm', 'pbs'"):
        daemon_main.make_backend(cfg)


def test_engine_config_from_file(tmp_path):
    cfg = config_file(tmp_path, "[allocator]\nlookahead_s = 600\nobjective = \"speedup\"\n"
                                "max_running_jobs = 4\nuser_max_nodes = { alice = 8 }\n"
                                "[profiler]\nenabled = false\nwindow_s = 30\n")
    ec = daemon_main.engine_config(cfg)
    assert (ec.lookahead_s, ec.objective, ec.max_running_jobs, ec.profiling,
            ec.profile_window_s) == (600.0, Objective.SPEEDUP, 4, False, 30.0)
    assert dict(ec.constraints.user_max_nodes) == {"alice": 8}
    assert daemon_main.engine_config(load(env={})).max_running_jobs is None


def test_a_trainers_lookahead_is_its_lifetime_predictors_horizon_too(tmp_path):
    """With allocator.lifetime on, a [[trainer]]'s look-ahead reaches both its engine and its
    reclaim predictor (the predictor once got the allocator's)."""
    cfg = config_file(tmp_path, "[allocator]\nlookahead_s = 120\nlifetime = true\n"
                                "[[trainer]]\nname = \"a\"\nlookahead_s = 600\nnodes = \"n[01-04]\"\n"
                                "[[trainer]]\nname = \"b\"\n")
    a, b = (daemon_main.engine_config(cfg, t) for t in cfg.trainer)
    assert (a.lookahead_s, a.lifetime.horizon_s) == (600.0, 600.0)
    assert (b.lookahead_s, b.lifetime.horizon_s) == (120.0, 120.0)
    assert daemon_main.engine_config(cfg).lifetime.horizon_s == 120.0


def test_the_time_limit_of_an_open_hole_comes_from_the_batch_systems_entry(tmp_path):
    """Slurm's default_time_limit_s reaches the engine under Slurm only; PBS and the toy leave
    the engine's default (the daemon once applied [slurm]'s setting to every batch system)."""
    from malletrain_core.engine import EngineConfig

    body = "[slurm]\ndefault_time_limit_s = 7200\n"
    assert daemon_main.engine_config(config_file(tmp_path, body)).default_time_limit_s == 7200.0
    for name in ("pbs", "toy"):
        cfg = config_file(tmp_path, f"[daemon]\nbatch_system = \"{name}\"\n" + body)
        assert daemon_main.engine_config(cfg).default_time_limit_s == \
            EngineConfig().default_time_limit_s


def test_the_daemon_and_the_simulator_build_the_same_engine():
    """One builder: the simulator's engine for a configured policy has the daemon's settings
    but for what the replay sets itself (finished jobs kept, its look-ahead)."""
    import dataclasses

    from malletrain_core.config import Config
    from malletrain_core.sim.policies import make_engine

    daemon = daemon_main.engine_config(Config())
    sim = make_engine("malletrain", 300.0).config
    differ = {f.name for f in dataclasses.fields(daemon)
              if getattr(daemon, f.name) != getattr(sim, f.name)}
    assert differ == {"done_retention_s", "lookahead_s"}
    assert sim.done_retention_s is None and sim.lookahead_s == 300.0


def test_bad_config_is_one_line_exit_2(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text("[daemon]\nbatch_systen = \"pbs\"\n")
    assert daemon_main.main(["--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("malletraind: error:") and "batch_systen" in err and "\n" not in err


def test_once_runs_one_cycle_against_a_missing_slurm(tmp_path, capsys, monkeypatch):
    # No Slurm commands on PATH: the poll fails with a typed error, the cycle is skipped,
    # the daemon exits cleanly and its state directory exists.
    monkeypatch.setenv("PATH", str(tmp_path))
    path = tmp_path / "cfg.toml"
    path.write_text(f"[daemon]\nstate_dir = \"{tmp_path / 'state'}\"\n"
                    f"hook_socket = \"{tmp_path / 'hook.sock'}\"\n"
                    f"api_socket = \"{tmp_path / 'api.sock'}\"\napi_port = 0\n")
    assert daemon_main.main(["--config", str(path), "--once"]) == 0
    assert (tmp_path / "state" / "state.db").exists()


def test_lifetime_allocation_is_enabled_from_the_config(tmp_path):
    import numpy as np

    from malletrain_core.engine import Engine
    from malletrain_core.events import Grow, IdleNode, JobRequest, JobSubmitted, NodesIdle
    from malletrain_core.model import Curve

    assert daemon_main.engine_config(load(env={})).lifetime is None  # off by default
    np.save(tmp_path / "frag.npy", np.array([30.0, 40.0, 50.0, 600.0, 900.0]))
    cfg = config_file(tmp_path, "[allocator]\nlifetime = true\nlifetime_fragments = "
                                f"\"{tmp_path / 'frag.npy'}\"\n[profiler]\nenabled = false\n")
    ec = daemon_main.engine_config(cfg)
    assert ec.lifetime is not None and ec.lifetime.horizon_s == 120.0
    life, risk = ec.lifetime.predict([0.0], [None])
    assert life[0] < 120.0 and 0.0 < risk[0] < 1.0  # learned: most fragments end within 120 s
    # A job that is running does not grow onto a node whose hole (from the plan) ends in 5 s.
    engine = Engine(ec)
    curve = Curve.of([1, 2], [100.0, 200.0])
    engine.handle_many([NodesIdle(0.0, (IdleNode("n1", None, None),)),
                        JobSubmitted(0.0, JobRequest("7", 1, 2, "alice", "", curve,
                                                     scale_up_s=20.0, scale_down_s=10.0))])
    assert len(engine.jobs["7"].nodes) == 1
    actions = engine.handle_many([NodesIdle(1.0, (IdleNode("n2", 6.0, None),))])
    assert not any(isinstance(a, Grow) for a in actions), actions
    actions = engine.handle_many([NodesIdle(2.0, (IdleNode("n3", 4000.0, None),))])
    assert [a.nodes for a in actions if isinstance(a, Grow)] == [("n3",)]  # a long hole: grow


@pytest.mark.parametrize("body, message", [
    ("lifetime = true\nmin_share = 0.5\n", "cannot honour min_share"),
    ("lifetime_fragments = \"x.npy\"\n", "allocator.lifetime is false"),
    ("lifetime = true\nlifetime_fragments = \"/nonexistent/frag.npy\"\n",
     "allocator.lifetime_fragments: cannot read"),
])
def test_bad_lifetime_settings_are_one_line(tmp_path, body, message):
    with pytest.raises(MalleTrainError) as err:
        daemon_main.engine_config(config_file(tmp_path, "[allocator]\n" + body))
    assert message in str(err.value) and "\n" not in str(err.value)
