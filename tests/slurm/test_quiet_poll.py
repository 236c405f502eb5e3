"""Quiet polling against the real slurmctld: a daemon with nothing to do costs slurmctld
(almost) no RPCs, and the hooks still bring it at once: job_submit.lua's datagram for a new
elastic job, the EpilogSlurmctld's for a preemption. RPCs are counted with ``sdiag`` (root's,
minus what slurmd/slurmstepd send); everything else the test does runs as the test user."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_helpers import elastic, elastic_nodes

from devtools.localcluster import LocalCluster
from devtools.localcluster.daemon import LocalDaemon
from malletrain_core.backends.slurm import parse as sp
from malletrain_core.wire.hooks import HookSocket, JobSubmit


def _lua_socket() -> bool:
    """Whether Lua 5.1 (the Lua Debian's slurmctld links) finds the socket module."""
    lua = shutil.which("lua5.1")
    return lua is not None and subprocess.run(
        [lua, "-e", 'require("socket.unix")'], capture_output=True, check=False).returncode == 0


pytestmark = pytest.mark.skipif(
    not _lua_socket(), reason="Lua's socket module (lua-socket) is not installed: "
    "job_submit.lua cannot wake the daemon (scripts/setup-machine.sh installs it)")


@pytest.fixture
def quiet_daemon(cluster: LocalCluster, tmp_path: Path) -> Iterator[LocalDaemon]:
    if cluster.release.name != "22.05":
        pytest.skip("lua-socket is installed for the host's Slurm only")
    daemon = LocalDaemon(cluster, root=tmp_path / "daemon", settings={
        "daemon": {"poll_interval_s": 1.0, "idle_poll_interval_s": 120.0}})
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.stop()


def daemon_rpcs(cluster: LocalCluster, seconds: float) -> int:
    cluster.run(["sdiag", "--reset"])
    time.sleep(seconds)
    return sp.sdiag_daemon_share(sp.parse_sdiag_rpcs(cluster.run(["sdiag"]).stdout))["count"]


def test_quiet_daemon_costs_no_rpcs_and_hooks_wake_it(quiet_daemon: LocalDaemon,
                                                      test_user: str) -> None:
    cluster = quiet_daemon.cluster
    time.sleep(3.0)  # its first polls
    idle = daemon_rpcs(cluster, 10.0)
    # Polling every second would be about 60 RPCs (sinfo and two squeues, 6 RPCs a poll).
    assert idle == 0, f"{idle} RPCs in 10 s of nothing"
    job = elastic(cluster, "1-2", "--comment=profile=no", user=test_user)
    started = cluster.wait_for("the job on 2 nodes", lambda: len(elastic_nodes(cluster)) == 2,
                               30.0)
    assert started < 20.0  # the submit hook woke it: not the 120 s idle poll
    time.sleep(5.0)  # its follow-up polls (admin holds) settle
    held = daemon_rpcs(cluster, 10.0)
    assert held <= 6, f"{held} RPCs in 10 s while harvesting, nothing changing"
    # A prod job takes every node: the epilog of the preempted tasks wakes the daemon, which
    # sees them back held; when the prod job ends, it grows the job again.
    prod = cluster.sbatch("-p", "prod", "-N", str(cluster.nodes), "-o", "/dev/null",
                          "--chdir=/tmp", "--wrap", "sleep 4", user=test_user)
    cluster.wait_for("the job shrunk to 0", lambda: not elastic_nodes(cluster), 30.0)
    cluster.wait_for(f"prod job {prod} ended", lambda: cluster.run(
        ["squeue", "-h", "-j", prod, "-o", "%T"], check=False).stdout.strip() in ("", "COMPLETED"),
        60.0)
    regrown = cluster.wait_for("the job back on 2 nodes",
                               lambda: len(elastic_nodes(cluster)) == 2, 60.0)
    assert regrown < 30.0, "the prod job's end did not wake the daemon"
    log = quiet_daemon.log_text()
    assert " ERROR " not in log
    cluster.run(["scancel", job])


def test_a_production_submission_names_the_nodes_it_is_confined_to(
        cluster: LocalCluster, hook_listener: HookSocket) -> None:
    """job_submit.lua's datagram for a job it does not convert carries its -w nodes and node
    counts; the daemon reads the job as confined to them only when it may take no others."""
    if cluster.release.name != "22.05":
        pytest.skip("lua-socket is installed for the host's Slurm only")

    def submitted(*args: str) -> JobSubmit:
        cluster.sbatch("-p", "prod", "-H", "-o", "/dev/null", *args, "--wrap", "true")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(socket.timeout):
                got = hook_listener.receive(timeout_s=1.0).message
                if isinstance(got, JobSubmit):
                    return got
        raise AssertionError("no job_submit datagram within 10 s")

    pinned = submitted("-w", "n[02-03]")
    assert (pinned.elastic, pinned.only_nodes) == (False, ("n02", "n03"))
    assert submitted("-N", "2", "-w", "n02,n03").only_nodes == ("n02", "n03")
    assert submitted("-N", "3", "-w", "n02").only_nodes == ()  # may take two others
    assert submitted("-N", "1").only_nodes == ()
