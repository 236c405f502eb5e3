"""Two trainers side by side in one malletraind on the real local cluster: each allocates its
own node set, and a job runs only on the nodes of the trainer it names. Assertions read Slurm
(squeue), and the daemon's API for the trainer it reports."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from ClusterShell.NodeSet import NodeSet
from slurm_helpers import elastic

from devtools.localcluster import LocalCluster
from devtools.localcluster.daemon import LocalDaemon

pytestmark = [pytest.mark.slurm]


def running(cluster: LocalCluster, job: str) -> set[str]:
    out = cluster.run(["squeue", "-h", "-r", "-j", job, "-t", "R", "-o", "%N"],
                      check=False).stdout
    return {n for line in out.splitlines() if line.strip() for n in NodeSet(line.strip())}


def test_two_trainers_allocate_their_own_nodes(cluster: LocalCluster, tmp_path: Path) -> None:
    nodes = sorted(cluster.node_names)
    half = len(nodes) // 2
    a_set, b_set = set(nodes[:half]), set(nodes[half:])
    daemon = LocalDaemon(cluster, root=tmp_path / f"malletraind-{uuid.uuid4().hex[:8]}",
                         trainers=[{"name": "left", "nodes": str(NodeSet.fromlist(nodes[:half]))},
                                   {"name": "right", "nodes": str(NodeSet.fromlist(nodes[half:])),
                                    "solver": "milp"}])
    daemon.start()
    try:
        a = elastic(cluster, f"1-{len(nodes)}", "--comment=trainer=left,profile=no")
        b = elastic(cluster, f"1-{len(nodes)}", "--comment=trainer=right,profile=no")
        cluster.wait_for("each job on its trainer's whole node set", lambda: (
            running(cluster, a) == a_set and running(cluster, b) == b_set), 90)
        out = subprocess.run([sys.executable, "-m", "malletrain_core", "jobs", "--json",
                              "--config", str(daemon.config_path)],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        assert {j["job"]: j["trainer"] for j in json.loads(out)} == {a: "left", b: "right"}
        # a preemption on the right: the left job does not move onto the freed trainer
        victim = sorted(b_set)[0]
        prod = cluster.sbatch("-p", "prod", "-w", victim, "-t", "1", "-o", "/dev/null",
                              "--wrap", "sleep 8")
        cluster.wait_for("the prod job running", lambda: cluster.run(
            ["squeue", "-h", "-j", prod, "-t", "R", "-o", "%i"]).stdout.strip() != "", 60)
        cluster.wait_for("the right job back on all its nodes after the prod job", lambda: (
            running(cluster, b) == b_set), 90)
        assert running(cluster, a) <= a_set
    finally:
        daemon.stop()
