"""bench.whatif's arithmetic: the wall time the replays need on idle cores, and the figures
that --verify compares (the report without its timings)."""

from __future__ import annotations

from bench.whatif import figures, makespan


def test_three_replays_on_two_cores_share_them() -> None:
    assert makespan([10.0, 10.0, 10.0], 2, cores=2) == 20.0  # the third waits for a process
    assert makespan([10.0, 10.0, 10.0], 3, cores=2) == 15.0  # three processes share two cores
    assert makespan([30.0, 1.0, 1.0], 3, cores=2) == 30.0  # never less than the longest
    assert makespan([10.0, 10.0, 10.0], 1, cores=4) == 30.0


def test_figures_leave_out_the_timings_only() -> None:
    report = {"idle_node_hours": 5.0, "timing_s": {"total": 1.0},
              "cost_models": {"restart": {"harvested_share": 0.5, "replay_wall_s": 2.0,
                                          "replay_cpu_s": 1.5, "shortcuts_checked": {"x": 1}}}}
    assert figures(report) == {"idle_node_hours": 5.0,
                               "cost_models": {"restart": {"harvested_share": 0.5}}}


def test_split_counts_each_part_once_and_puts_the_engine_back(tmp_path) -> None:
    from bench.whatif import split_cpu, write_sacct
    from malletrain_core.engine.engine import Engine
    from malletrain_core.sim.backend import SimBackend

    before = (Engine._replan, Engine.handle_many, SimBackend.poll, SimBackend.execute)
    path = tmp_path / "sacct.txt"
    write_sacct(path, nodes=256, days=2, load=0.9, seed=1)
    split = split_cpu(path, jobs=4, seed=1, cost="restart")
    parts = ("replans_cpu_s", "engine_other_cpu_s", "sim_backend_cpu_s", "rest_cpu_s")
    assert split["replans_cpu_s"] > 0 and split["sim_backend_cpu_s"] > 0
    assert all(split[k] >= 0 for k in parts)
    assert abs(sum(split[k] for k in parts) - split["total_cpu_s"]) < 0.05
    assert (Engine._replan, Engine.handle_many, SimBackend.poll,
            SimBackend.execute) == before


def test_the_generators_hostlists_are_folds() -> None:
    """bench.whatif writes each job's nodes with its own folding; it is ClusterShell's."""
    import numpy as np

    from bench.whatif import _fold_nids
    from malletrain_core.hostlist import fold

    rng = np.random.default_rng(3)
    for size in (1, 2, 3, 17, 400, 4000):
        picked = sorted(rng.choice(4000, size, replace=False).tolist())
        assert _fold_nids(picked) == fold(f"nid{i:04d}" for i in picked)
    assert _fold_nids([0, 1, 2, 5, 9999]) == "nid[0000-0002,0005,9999]"
