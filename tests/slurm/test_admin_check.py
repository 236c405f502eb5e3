"""``malletrain admin check`` against the real local Slurm cluster (partition mode)."""

from __future__ import annotations

import json

from devtools.localcluster import LocalCluster
from malletrain_core.cli import main


def test_the_local_cluster_is_set_up_right(cluster: LocalCluster, tmp_path, capsys,
                                           monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf_path))
    config = tmp_path / "malletrain.toml"
    config.write_text("")
    code = main(["admin", "check", "--json", "--config", str(config)])
    report = json.loads(capsys.readouterr().out)
    failed = [c for c in report["checks"] if c["status"] != "OK"]
    assert (code, failed) == (0, [])
    by_name = {c["check"]: c["detail"] for c in report["checks"]}
    assert by_name["slurmctld"].startswith(f"Slurm {cluster.release.name}.")
    assert by_name["Slurm release"].endswith(": tested with this MalleTrain")
    assert by_name["higher tier"] == "prod preempts preemptable (PriorityTier > 1)"
    assert by_name["EpilogSlurmctld"].endswith("plugin/epilog_slurmctld")  # wrapper followed


def test_tasks_in_the_queue_count_against_max_job_count(cluster: LocalCluster, tmp_path,
                                                        capsys, monkeypatch):
    cluster.sbatch("--qos=malletrain", "-N", "2-5", "--output=/dev/null", script="#!/bin/sh\nexec sleep 600\n")
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf_path))
    config = tmp_path / "malletrain.toml"
    config.write_text("")
    main(["admin", "check", "--config", str(config)])
    lines = {line.split()[1]: line for line in capsys.readouterr().out.splitlines()}
    assert "10000, 5 queued" in lines["MaxJobCount"]


def test_no_slurmctld_is_one_wrong_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing" / "slurm.conf"))
    config = tmp_path / "malletrain.toml"
    config.write_text("")
    assert main(["admin", "check", "--config", str(config)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("WRONG   slurmctld") and len(out.splitlines()) == 1
