"""LocalCluster's pure parts: configuration rendering, ports, paths, validation (no daemons;
tests/slurm/ runs the real cluster)."""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

import pytest

from devtools.localcluster import (
    SITE_TIMINGS,
    TEST_TIMINGS,
    LocalCluster,
    choose_port_base,
    munge_dir_for,
    pid_alive,
    port_free,
    render_job_submit,
)
from malletrain_core.errors import ConfigError


def conf_lines(cluster: LocalCluster) -> dict[str, str]:
    out = {}
    for line in cluster.render_config().splitlines():
        if line and not line.startswith("#") and not line.startswith(("NodeName=n",
                                                                      "PartitionName=")):
            key, _, value = line.partition("=")
            out[key] = value
    return out


def test_partition_mode_config(tmp_path: Path) -> None:
    cluster = LocalCluster(nodes=3, root=tmp_path, port_base=25000)
    text = cluster.render_config()
    conf = conf_lines(cluster)
    assert conf["SlurmctldPort"] == "25000"
    assert "NodeName=n01 NodeHostname=localhost NodeAddr=127.0.0.1 Port=25003" in text
    assert "NodeName=n03 NodeHostname=localhost NodeAddr=127.0.0.1 Port=25005" in text
    assert conf["PreemptType"] == "preempt/partition_prio"
    assert conf["AccountingStorageType"] == "accounting_storage/none"
    assert conf["JobSubmitPlugins"] == "lua"
    assert conf["EpilogSlurmctld"] == str(tmp_path.resolve() / "etc" / "epilog_slurmctld")
    assert "PrologSlurmctld" not in conf and "Epilog" not in conf  # no node Epilog by default
    assert conf["SchedulerParameters"] == "bf_interval=1,bf_resolution=1,batch_sched_delay=0"
    assert conf["AuthInfo"].endswith(f",cred_expire={TEST_TIMINGS.cred_expire_s}")
    assert conf["KillWait"] == str(TEST_TIMINGS.kill_wait_s)
    assert "CPUs=2" in conf["NodeName"]
    assert "PartitionName=prod Nodes=ALL Default=YES PriorityTier=10" in text
    assert "PartitionName=preemptable Nodes=ALL Default=NO PriorityTier=1 " \
           "PreemptMode=REQUEUE GraceTime=0" in text
    assert "${" not in text


def test_site_defaults_and_accounting(tmp_path: Path) -> None:
    cluster = LocalCluster(nodes=2, mode="accounting", site_defaults=True, root=tmp_path,
                           port_base=26000)
    conf = conf_lines(cluster)
    assert conf["SchedulerParameters"] == "bf_interval=30,bf_resolution=60,batch_sched_delay=3"
    assert conf["AuthInfo"].endswith(f",cred_expire={SITE_TIMINGS.cred_expire_s}")
    assert conf["PreemptType"] == "preempt/qos"
    assert conf["AccountingStorageType"] == "accounting_storage/slurmdbd"
    assert conf["AccountingStoragePort"] == "26001"


def test_a_node_epilog_on_request(tmp_path: Path) -> None:
    cluster = LocalCluster(nodes=2, root=tmp_path, port_base=27000, node_epilog_s=5)
    assert conf_lines(cluster)["Epilog"] == str(tmp_path.resolve() / "etc" / "node_epilog")
    assert cluster._settings()["node_epilog_s"] == 5.0  # a running cluster's own settings
    assert "node_epilog_s" not in LocalCluster(nodes=2, root=tmp_path)._settings()


def test_node_names_widen_with_count(tmp_path: Path) -> None:
    assert LocalCluster(nodes=9, root=tmp_path).node_names[-1] == "n09"
    assert LocalCluster(nodes=128, root=tmp_path).node_names[:2] == ["n001", "n002"]


@pytest.mark.parametrize("kwargs, says", [
    ({"nodes": 0}, "nodes=0"), ({"nodes": 600}, "nodes=600"),
    ({"mode": "qos"}, "choose one of partition, accounting"),
    ({"cpus_per_node": 0}, "cpus_per_node=0"),
    ({"node_epilog_s": -1}, "node_epilog_s=-1"),
])
def test_bad_settings_say_how_to_fix(tmp_path: Path, kwargs: dict[str, object],
                                     says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        LocalCluster(root=tmp_path, **kwargs)  # type: ignore[arg-type]


def test_port_base_skips_taken_ports() -> None:
    base = choose_port_base(5, random.Random(7))
    assert 20000 <= base < 32000
    with socket.socket() as taken:
        taken.bind(("", base + 2))
        taken.listen()
        assert not port_free(base + 2)
        other = choose_port_base(5, random.Random(7))  # same first candidate: now refused
    assert other != base
    assert not other <= base + 2 < other + 5


def test_munge_dir_moves_out_of_private_trees(tmp_path: Path) -> None:
    open_root = tmp_path / "open"
    open_root.mkdir()
    for p in (tmp_path, open_root):
        p.chmod(0o755)
    searchable = all(os.stat(p).st_mode & 0o001 for p in tmp_path.parents)
    if searchable:
        assert munge_dir_for(open_root) == open_root / "run" / "munge"
    tmp_path.chmod(0o700)
    try:
        moved = munge_dir_for(open_root)
        assert moved.name.startswith("malletrain-munge-") and open_root not in moved.parents
        assert moved == munge_dir_for(open_root)  # stable: stop() finds it again
    finally:
        tmp_path.chmod(0o755)


def test_pid_alive_checks_the_marker() -> None:
    me = os.getpid()
    assert pid_alive(me, "python")
    assert not pid_alive(me, "no-such-marker-in-this-process")
    assert not pid_alive(2**22 + 1, "python")


def test_job_submit_rendering() -> None:
    assert "local KEEP_QOS = true" in render_job_submit(keep_qos=True)
    assert "local KEEP_QOS = false" in render_job_submit(keep_qos=False)


def test_fragment_matches_the_tested_local_cluster(tmp_path: Path) -> None:
    """The admin's fragment says what the local cluster (and so the tests) run."""
    fragment = Path(__file__).resolve().parents[1] / "slurm_conf" / "slurm.conf.fragment"
    active = [line for line in fragment.read_text().splitlines()
              if line and not line.startswith("#")]
    keys = {line.split("=", 1)[0] for line in active}
    assert {"JobSubmitPlugins", "EpilogSlurmctld", "PreemptMode", "PreemptType",
            "PartitionName", "MaxArraySize", "MaxJobCount"} <= keys
    assert not any(line.startswith("PrologSlurmctld") for line in active)
    rendered = LocalCluster(nodes=2, root=tmp_path, port_base=25000).render_config()
    for line in active:
        if line.split("=", 1)[0] in ("JobSubmitPlugins", "PreemptMode", "PreemptType",
                                     "PartitionName"):
            assert line in rendered.splitlines(), line
