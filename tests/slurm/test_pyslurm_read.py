"""The poll's reads through pyslurm agree with the commands' on a real cluster, and a poll
through pyslurm spawns no sinfo/squeue/scontrol (releases with a pyslurm: 24.11, 25.11; built by
``scripts/setup-slurm-matrix.sh pyslurm``; skipped on 22.05, for which no pyslurm exists). The
actions, and the daemon traced for any Slurm command: test_pyslurm_act.py."""

from __future__ import annotations

import re
import time

import pytest
from conftest import Recording
from slurm_helpers import elastic, grow, wait_task

from devtools.localcluster import LocalCluster
from malletrain_core.backends.slurm import parse as sp
from malletrain_core.backends.slurm.backend import SlurmBackend
from malletrain_core.backends.slurm.pyslurm_reader import PyslurmSource
from malletrain_core.runner import CommandRunner


@pytest.fixture
def source(pyslurm_source: PyslurmSource) -> PyslurmSource:
    return pyslurm_source


def commands_view(cluster: LocalCluster) -> dict[str, str]:
    run = cluster.run
    return {"sinfo": run(["sinfo", "-h", "-N", "-p", "preemptable", "-o",
                          sp.SINFO_FORMAT]).stdout,
            "squeue": run(["squeue", "-h", "-r", "-t", "all", "-p", "preemptable", "-O",
                           sp.SQUEUE_FORMAT]).stdout,
            "plan": run(["squeue", "-h", "-t", "PD", "--start", "-o", sp.PLAN_FORMAT]).stdout}


def parsed(texts: dict[str, str]) -> tuple[object, ...]:
    nodes = {n: r.state_code for n, r in sp.parse_sinfo(texts["sinfo"]).items()}
    tasks = sorted((r.key, r.state, r.nodes, r.time_limit_s, r.restarts, r.held, r.user,
                    r.reason, r.admin_comment) for r in sp.parse_squeue(texts["squeue"]))
    plan = sp.parse_plan(texts["plan"])
    # Other partitions' waiting jobs (what holds grants back); 25.11's squeue folds an array's
    # pending tasks into one line, with their reasons joined, where pyslurm gives one each.
    waiting = sorted((r.partition, r.reason, r.submit) for r in plan
                     if r.partition != "preemptable")
    return nodes, tasks, sp.hole_ends(plan), waiting


def assert_same(cluster: LocalCluster, source: PyslurmSource) -> None:
    for _ in range(5):  # a job may change state between the two reads: read again
        before = parsed(commands_view(cluster))
        mine = parsed(source.snapshot("preemptable"))
        after = parsed(commands_view(cluster))
        if before == after:
            assert mine == before
            return
        time.sleep(0.5)
    raise AssertionError("the cluster never held still for a comparison")


def test_pyslurm_reads_what_the_commands_read(cluster: LocalCluster,
                                               source: PyslurmSource) -> None:
    assert_same(cluster, source)  # all idle, empty queue
    assert source.version.startswith(cluster.release.name)
    job = elastic(cluster, "1-3")
    wait_task(cluster, f"{job}_2", "PENDING", reason="JobHeldUser")
    assert_same(cluster, source)  # a held array, never split
    grow(cluster, f"{job}_0", "n02", time_limit="30")
    wait_task(cluster, f"{job}_0", "RUNNING")
    cluster.run(["scontrol", "hold", f"{job}_0"])
    assert_same(cluster, source)  # running, admin-held
    cluster.sbatch("-p", "prod", "-w", "n02", "-t", "30", "-o", "/dev/null", "--chdir=/tmp",
                   "--wrap", "sleep 600")
    wait_task(cluster, f"{job}_0", "PENDING", reason="JobHeldAdmin")
    assert_same(cluster, source)  # preempted, back held with a restart
    cluster.sbatch("-p", "prod", "-N", str(cluster.nodes), "-t", "30", "-o", "/dev/null",
                   "--chdir=/tmp", "--wrap", "sleep 600")
    cluster.sbatch("--hold", "-p", "prod", "-N", "1", "-o", "/dev/null", "--chdir=/tmp",
                   "--wrap", "true")  # never planned: its reason and submit time are read
    cluster.wait_for("a node planned", lambda: "planned" in cluster.run(
        ["sinfo", "-h", "-N", "-p", "preemptable", "-o", "%T"]).stdout, 30)
    assert_same(cluster, source)  # PLANNED nodes and the plan's start times


def rpc_counts(cluster: LocalCluster) -> dict[str, int]:
    """sdiag's RPC counts by message type (its own REQUEST_STATS_INFO left out)."""
    out = cluster.run(["sdiag"]).stdout
    section = out[out.index("by message type"):out.index("by user")]
    return {m.group(1): int(m.group(2)) for m in re.finditer(
        r"^\s*(\w+)\s+\(\s*\d+\) count:(\d+)", section, re.MULTILINE)
        if m.group(1) != "REQUEST_STATS_INFO"}


def polls_cost(cluster: LocalCluster, backend: SlurmBackend, n: int) -> tuple[float, float]:
    """(milliseconds, slurmctld RPCs) per poll, over ``n`` polls."""
    before = rpc_counts(cluster)
    t0 = time.monotonic()
    for _ in range(n):
        backend.poll(time.time())
    elapsed = time.monotonic() - t0
    after = rpc_counts(cluster)
    rpcs = sum(after.values()) - sum(before.values())
    return elapsed * 1000 / n, rpcs / n


def test_a_poll_through_pyslurm_spawns_no_slurm_command(cluster: LocalCluster,
                                                         source: PyslurmSource) -> None:
    job = elastic(cluster, "1-2")
    wait_task(cluster, f"{job}_1", "PENDING", reason="JobHeldUser")
    runner = Recording(cluster.env)
    backend = SlurmBackend(runner, source=source)
    reference = SlurmBackend(CommandRunner(env=cluster.env))
    now = time.time()
    mine, theirs = backend.poll(now), reference.poll(now)
    assert mine == theirs and mine, "the two paths disagree"
    assert runner.calls == []
    py_ms, py_rpcs = polls_cost(cluster, backend, 20)
    cmd_ms, cmd_rpcs = polls_cost(cluster, reference, 20)
    assert runner.calls == []
    print(f"\nSlurm {cluster.release.name}, one poll: pyslurm {py_ms:.1f} ms, {py_rpcs:g} RPCs; "
          f"commands {cmd_ms:.1f} ms, {cmd_rpcs:g} RPCs")
    assert py_rpcs < cmd_rpcs
