"""slurm_conf/local/start.sh and stop.sh: idempotent, side by side with another cluster, and
stopping only what they started."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from slurm_helpers import SCRIPT, cluster_root, wait_task

from devtools.localcluster import LocalCluster, pid_alive

SCRIPTS = Path(__file__).resolve().parents[2] / "slurm_conf" / "local"


def script(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPTS / name), *args], capture_output=True, text=True,
                          timeout=120, check=False)


def test_scripts_start_idempotently_beside_another_cluster_and_stop_only_theirs(
        slurm_cluster: LocalCluster) -> None:
    with cluster_root("script") as root:
        first = script("start.sh", "2", "--root", str(root))
        assert first.returncode == 0, first.stderr
        assert first.stdout.startswith("started 2 nodes (partition) in ")
        again = script("start.sh", "2", "--root", str(root))
        assert again.returncode == 0 and "is already running" in again.stdout
        other = script("start.sh", "3", "--root", str(root))
        assert other.returncode != 0 and "stop it first" in other.stderr

        mine = LocalCluster(nodes=2, root=root)
        base = json.loads((root / "cluster.json").read_text())["port_base"]
        assert base != json.loads((slurm_cluster.root / "cluster.json").read_text())["port_base"]
        assert mine.run(["sinfo", "-h", "-N", "-p", "prod", "-o", "%N"]).stdout.split() == \
            ["n01", "n02"]
        job = mine.sbatch("-N", "2", "-o", "/dev/null", script=SCRIPT)
        wait_task(mine, job, "RUNNING")
        pids = [(int(p.read_text()), p.name) for p in (root / "run" / "pids").glob("*.pid")]
        assert len(pids) == 4  # munged, slurmctld, 2 slurmd

        stopped = script("stop.sh", "--root", str(root))
        assert stopped.returncode == 0 and stopped.stdout.startswith("stopped in ")
        marker = str(root)
        assert [name for pid, name in pids if pid_alive(pid, marker)] == []
        assert slurm_cluster.is_running()
        assert not mine.is_running()
        assert "not running" in script("stop.sh", "--root", str(root)).stdout
