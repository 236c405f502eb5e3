"""``malletrain admin drain`` / ``resume`` against a real daemon on the real local cluster.

Drained: every elastic task goes back to held (the jobs stay queued, nothing is cancelled),
no task starts while nodes sit idle, not even for a job submitted meanwhile, and a restarted
daemon is still drained. Resumed: the jobs grow again. Only root (or the SlurmUser) may flip
the switch. Assertions read Slurm (squeue), plus the daemon's status for the switch itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from slurm_helpers import elastic

from devtools.localcluster import REPO, LocalCluster
from devtools.localcluster.daemon import LocalDaemon

CLI = "import sys; from malletrain_core.cli import main; sys.exit(main())"


@pytest.fixture
def daemon(cluster: LocalCluster, tmp_path: Path) -> Iterator[LocalDaemon]:
    d = LocalDaemon(cluster, root=tmp_path / f"malletraind-{uuid.uuid4().hex[:8]}")
    d.start()
    yield d
    d.stop()


USER_CLIENT = """
import sys
from malletrain_core.munge import Munge
from malletrain_core.wire.api import ApiError
from malletrain_core.worker.client import TcpClient
host, port = sys.argv[1].rsplit(":", 1)
try:
    print(TcpClient(host, int(port), Munge(sys.argv[2]), timeout_s=10).call(sys.argv[3]))
except ApiError as exc:
    sys.exit(str(exc))
"""


def as_user(daemon: LocalDaemon, user: str, op: str) -> subprocess.CompletedProcess:
    """``op`` over the munge-authenticated TCP API, as ``user`` (the CLI's own path; the
    whole CLI needs numpy, which the user's Python may lack)."""
    for python in (sys.executable, "/usr/bin/python3"):
        res = subprocess.run(["runuser", "-u", user, "--", python, "-c", USER_CLIENT,
                              daemon.job_env["MALLETRAIN_DAEMON"],
                              daemon.job_env["MALLETRAIN_MUNGE_SOCKET"], op],
                             capture_output=True, text=True, timeout=60, check=False,
                             cwd=os.sep, env={"PATH": os.environ.get("PATH", ""),
                                              "PYTHONPATH": str(REPO)})
        if "Permission denied" not in res.stderr and "No module named" not in res.stderr:
            return res
    pytest.skip(f"no Python that {user} can run with this checkout importable")


def cli(daemon: LocalDaemon, *args: str) -> subprocess.CompletedProcess:
    env = {**daemon.cluster.env, "PYTHONPATH": str(REPO), **daemon.job_env}
    argv = [sys.executable, "-c", CLI, *args, "--config", str(daemon.config_path)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60,
                          cwd=os.sep, check=False)


def tasks(cluster: LocalCluster, job: str) -> dict[str, str]:
    out = cluster.run(["squeue", "-h", "-r", "-j", job, "-o", "%i %T"]).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def running(cluster: LocalCluster, *jobs: str) -> int:
    return sum(state == "RUNNING" for job in jobs for state in tasks(cluster, job).values())


def stays(what: str, check: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert check(), what
        time.sleep(0.5)


def test_drain_shrinks_to_zero_keeps_jobs_and_survives_a_restart(
        daemon: LocalDaemon, test_user: str) -> None:
    cluster = daemon.cluster
    first = elastic(cluster, "1-3", "--comment=profile=no", user=test_user)
    cluster.wait_for("3 tasks running", lambda: running(cluster, first) == 3, 60)

    res = cli(daemon, "admin", "drain", "--json")
    assert res.returncode == 0, res.stderr
    answer = json.loads(res.stdout)
    assert answer["drained"] is True and answer["changed"] is True
    cluster.wait_for("every task back to held", lambda: running(cluster, first) == 0, 60)
    assert len(tasks(cluster, first)) == 3  # the job is still queued, nothing cancelled
    second = elastic(cluster, "1-2", "--comment=profile=no", user=test_user)
    stays("nothing starts while drained", lambda: running(cluster, first, second) == 0, 8)
    status = daemon.query("status")
    assert status["drain"]["drained"] is True
    assert status["nodes"] == {"free": 0, "held": 0}

    again = cli(daemon, "admin", "drain")
    assert again.returncode == 0 and "already drained" in again.stdout

    daemon.stop()
    daemon.start()
    assert daemon.query("status")["drain"]["drained"] is True
    stays("still nothing after a restart", lambda: running(cluster, first, second) == 0, 8)

    refused = as_user(daemon, test_user, "resume")
    assert refused.returncode == 1
    assert len(refused.stderr.strip().splitlines()) == 1
    assert "'resume' is an administrator's operation" in refused.stderr
    assert daemon.query("status")["drain"]["drained"] is True

    res = cli(daemon, "admin", "resume", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["drained"] is False
    cluster.wait_for("the jobs grow again", lambda: running(cluster, first) >= 1
                     and running(cluster, second) >= 1, 60)
    assert daemon.query("status")["drain"]["drained"] is False
    again = cli(daemon, "admin", "resume")
    assert again.returncode == 0 and "not drained" in again.stdout
    cluster.run(["scancel", first, second])


def test_drain_without_a_daemon_is_one_line(cluster: LocalCluster, tmp_path: Path) -> None:
    d = LocalDaemon(cluster, root=tmp_path / "never-started")
    d.write_config()
    res = cli(d, "admin", "drain")
    assert res.returncode == 1
    assert len(res.stderr.strip().splitlines()) == 1 and "malletrain: error:" in res.stderr
