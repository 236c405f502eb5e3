"""The Slurm backend's actions through pyslurm on a real cluster (24.11, 25.11; skipped on
22.05, for which no pyslurm exists): the job descriptor layout it writes matches the release's
slurm.h, a refused action fails as scontrol's does, and malletraind with ``slurm.pyslurm`` set
grows, holds, shrinks and finishes jobs without starting a single Slurm command process
(every exec of the daemon and its descendants is traced)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import pyslurm_helper
from slurm_helpers import command_shims, elastic, running, wait_agree, wait_task

from devtools.localcluster import LocalCluster
from devtools.localcluster.daemon import LocalDaemon
from devtools.localcluster.releases import CLIENTS
from malletrain_core.backends.slurm import parse as sp
from malletrain_core.backends.slurm.pyslurm_reader import PyslurmSource, series
from malletrain_core.backends.slurm.pyslurm_rpc import JOB_DESC
from malletrain_core.cli import main
from malletrain_core.errors import CommandError

PROBE = r"""#include <stddef.h>
#include <stdio.h>
#include <slurm/slurm.h>
#define OFF(f) printf("\"%s\": %zu, ", #f, offsetof(job_desc_msg_t, f))
int main(void) {
  printf("{");
  OFF(alloc_sid); OFF(begin_time); OFF(job_id_str); OFF(priority); OFF(req_nodes);
  OFF(time_limit);
  printf("\"size\": %zu, \"hold\": %llu, \"running\": %d, \"infinite\": %u}\n",
         sizeof(job_desc_msg_t), (unsigned long long)JOB_REQUEUE_HOLD, JOB_RUNNING, INFINITE);
  return 0;
}
"""


def test_the_job_descriptor_layout_is_the_releases(cluster: LocalCluster,
                                                   pyslurm_source: PyslurmSource,
                                                   tmp_path: Path) -> None:
    """JOB_DESC against offsetof() in the slurm.h pyslurm was built with (gcc in the chroot)."""
    rel = cluster.release
    include = "/usr/include" if rel.prefix == "/usr" else f"{rel.prefix}/include"
    (tmp_path / "probe.c").write_text(PROBE)
    root = str(rel.root)
    cluster.run(["chroot", root, "gcc", "-I", include, "-o", str(tmp_path / "probe"),
                 str(tmp_path / "probe.c")])
    got = json.loads(cluster.run(["chroot", root, str(tmp_path / "probe")]).stdout)
    assert (got.pop("hold"), got.pop("running"), got.pop("infinite")) == (
        2048, 1, 0xFFFFFFFF)  # JOB_REQUEUE_HOLD, JOB_RUNNING, INFINITE as in pyslurm_rpc
    assert JOB_DESC[series(pyslurm_source.slurm)] == got


def test_a_refused_action_fails_as_scontrols_does(cluster: LocalCluster,
                                                  pyslurm_source: PyslurmSource) -> None:
    job = elastic(cluster, "1-2")
    wait_task(cluster, f"{job}_1", "PENDING", reason="JobHeldUser")
    for verb in ("hold", "release", "requeuehold Incomplete"):
        jobs = f"{job}_[0-1],999999_0"
        with pytest.raises(CommandError) as mine:
            pyslurm_source.scontrol(verb, jobs)
        theirs = cluster.run(["scontrol", *verb.split(), jobs], check=False)
        assert theirs.returncode != 0
        failed = {k for k in sp.parse_scontrol_errors(mine.value.stderr) if k}
        assert failed == {k for k in sp.parse_scontrol_errors(theirs.stderr) if k}, (
            verb, mine.value.stderr, theirs.stderr)
    with pytest.raises(CommandError, match="nosuchnode|node name|Invalid"):
        pyslurm_source.grow(f"{job}_0", "nosuchnode", 10)
    pyslurm_source.grow(f"{job}_0", "n03", 10)
    pyslurm_source.scontrol("release", f"{job}_0")
    wait_task(cluster, f"{job}_0", "RUNNING")
    assert cluster.run(["squeue", "-h", "-j", f"{job}_0", "-o", "%N|%l"]).stdout.strip() == \
        "n03|10:00"
    pyslurm_source.scontrol("requeuehold Incomplete", f"{job}_0")
    wait_task(cluster, f"{job}_0", "PENDING", reason="job requeued in held state")
    pyslurm_source.cancel([job])
    cluster.wait_for("the array cancelled", lambda: not cluster.run(
        ["squeue", "-h", "-j", job, "-t", "PD,R,CG"]).stdout.strip(), 20)


STRACE = ("strace", "-f", "-qq", "-e", "trace=execve,execveat", "-e", "signal=none",
          "-s", "200", "-o")


def test_the_daemon_acts_through_pyslurm_and_starts_no_slurm_command(
        cluster: LocalCluster, tmp_path: Path) -> None:
    """malletraind with slurm.pyslurm = the chroot's helper, traced from its start: it grows a
    job onto every node, holds its running tasks, shrinks it for a second job and finishes that
    one when its training ends; no exec of the daemon or of any descendant names a Slurm
    command (and the commands' folder, shims that log a call, is never used)."""
    helper = pyslurm_helper(cluster)
    if shutil.which("strace") is None:
        pytest.fail("strace is not installed: scripts/setup-slurm-matrix.sh pyslurm installs it")
    trace = tmp_path / "exec.trace"
    bin_dir, spawned = command_shims(cluster, tmp_path)
    daemon = LocalDaemon(cluster, root=tmp_path / "malletraind",
                         settings={"slurm": {"bin_dir": str(bin_dir), "pyslurm": helper},
                                   "profiler": {"window_s": 2.0}},
                         launcher=[*STRACE, str(trace)])
    daemon.start()
    try:
        big = elastic(cluster, f"1-{cluster.nodes}")
        cluster.wait_for("the job on every node",
                         lambda: running(cluster, big) == cluster.nodes, 90)
        short = cluster.sbatch("--qos=malletrain", "-N", "1-2", "-o", "/dev/null",
                               "--chdir=/tmp", script="#!/bin/sh\nexec sleep 10\n")
        cluster.wait_for("the second job granted nodes (the first shrunk)",
                         lambda: running(cluster, short) >= 1, 90)
        assert running(cluster, big) < cluster.nodes
        cluster.wait_for("the second job finished and cancelled", lambda: not cluster.run(
            ["squeue", "-h", "-j", short, "-t", "PD,R,CG"]).stdout.strip(), 90)
        wait_agree(cluster, daemon)
        held = cluster.run(["squeue", "-h", "-r", "-j", big, "-t", "R", "-o", "%r"]).stdout
        assert set(held.split()) == {"JobHeldAdmin"}  # running tasks held by the daemon
        log = daemon.log_text()
    finally:
        daemon.stop()
    assert re.search(r"Slurm backend: pyslurm \S+ in helper .*: reads and actions", log), log
    execs = re.findall(r'exec(?:ve|veat)\((?:\d+, )?"([^"]+)"', trace.read_text())
    assert any(Path(p).name.startswith("python") for p in execs), execs  # traced from start
    slurm = sorted({p for p in execs if Path(p).name in CLIENTS})
    assert slurm == [], f"the daemon started Slurm commands: {slurm}"
    assert not spawned.exists(), spawned.read_text()


def test_admin_check_prints_the_path_the_daemon_takes(cluster: LocalCluster, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    helper = pyslurm_helper(cluster)
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf_path))
    config = tmp_path / "malletrain.toml"
    config.write_text(f'[slurm]\npyslurm = "{helper}"\n')
    main(["admin", "check", "--json", "--config", str(config)])
    by_name = {c["check"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    rel = re.escape(cluster.release.name)
    assert by_name["Slurm path"]["status"] == "OK"
    assert re.fullmatch(rf"pyslurm {rel}\.\d+ in helper '.+', Slurm {rel}\.\d+: reads and "
                        "actions", by_name["Slurm path"]["detail"]), by_name["Slurm path"]
