"""pyslurm on a Slurm release it was not built for. No pyslurm exists for 26.05 (PyPI's newest
is 25.11.2, built against 25.11's C API): there a site may still have 25.11's. The daemon's
choice refuses such a pyslurm with one line, and malletraind then reads and acts through the
commands; ``malletrain admin check`` prints the same line. Never a crash, never a read through
the wrong pyslurm. Each chrooted release of the matrix is given another release's pyslurm
(26.05 and 24.11: 25.11's; 25.11: 24.11's)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from slurm_helpers import command_shims, elastic, running

from devtools.localcluster import LocalCluster
from devtools.localcluster.daemon import LocalDaemon
from devtools.localcluster.releases import pyslurm_helper
from malletrain_core.backends.slurm.pyslurm_reader import choose
from malletrain_core.cli import main

OTHER = {"24.11": "25.11", "25.11": "24.11", "26.05": "25.11"}


@pytest.fixture
def other(cluster: LocalCluster) -> tuple[str, str]:
    """(the series of a pyslurm built for another release, its ``slurm.pyslurm`` setting)."""
    name = cluster.release.name
    if name not in OTHER:
        pytest.skip(f"the pyslurm helpers run in the matrix's chroot, beside 24.11-26.05 "
                    f"(not Slurm {name})")
    helper = pyslurm_helper(OTHER[name])
    if helper is None:
        pytest.fail(f"no pyslurm for Slurm {OTHER[name]}: run scripts/setup-slurm-matrix.sh "
                    "pyslurm (make setup-matrix does)")
    return OTHER[name], helper


def refusal(series: str, cluster: LocalCluster) -> re.Pattern[str]:
    """The one line of a refused pyslurm: its version and the cluster's must both be named."""
    mine, theirs = re.escape(series), re.escape(cluster.release.name)
    return re.compile(
        rf"commands \((pyslurm {mine}\.\d+ in helper '[^']+' does not match Slurm {theirs}"
        rf"\.\d+: MAJOR\.MINOR must be equal|no pyslurm in helper '[^']+': .*pyslurm {mine}\.\d+ "
        rf"ended its process on loading \(code \d+\): .*version \({theirs}\.\d+\).*)\)")


def test_the_choice_refuses_it_in_one_line(cluster: LocalCluster,
                                           other: tuple[str, str]) -> None:
    series, helper = other
    src, line = choose(helper, cluster.env)
    assert src is None, line
    assert "\n" not in line and refusal(series, cluster).fullmatch(line), line


def test_admin_check_says_so(cluster: LocalCluster, other: tuple[str, str], tmp_path: Path,
                             capsys: pytest.CaptureFixture[str],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    series, helper = other
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf_path))
    config = tmp_path / "malletrain.toml"
    config.write_text(f'[slurm]\npyslurm = "{helper}"\n')
    assert main(["admin", "check", "--json", "--config", str(config)]) == 1
    checks = json.loads(capsys.readouterr().out)["checks"]
    assert [c["check"] for c in checks if c["status"] != "OK"] == ["Slurm path"]
    (path,) = [c for c in checks if c["check"] == "Slurm path"]
    assert refusal(series, cluster).fullmatch(path["detail"]) and path["fix"], path
    main(["admin", "check", "--config", str(config)])
    lines = [x for x in capsys.readouterr().out.splitlines() if "Slurm path" in x]
    assert len(lines) == 1 and lines[0].startswith("WRONG"), lines


def test_the_daemon_runs_on_the_commands(cluster: LocalCluster, other: tuple[str, str],
                                         tmp_path: Path) -> None:
    """malletraind given the other release's pyslurm: one warning at start, then it grows a
    job onto every node through the commands (shims on its Slurm command folder log each
    call), with no traceback in its log."""
    series, helper = other
    bin_dir, spawned = command_shims(cluster, tmp_path)
    daemon = LocalDaemon(cluster, root=tmp_path / "malletraind",
                         settings={"slurm": {"bin_dir": str(bin_dir), "pyslurm": helper}})
    daemon.start()
    try:
        job = elastic(cluster, f"1-{cluster.nodes}")
        cluster.wait_for("the job on every node",
                         lambda: running(cluster, job) == cluster.nodes, 90)
        log = daemon.log_text()
    finally:
        daemon.stop()
    said = [x for x in log.splitlines() if "Slurm backend:" in x]
    assert len(said) == 1 and "WARNING" in said[0], said
    assert refusal(series, cluster).search(said[0]), said
    assert "Traceback" not in log
    calls = spawned.read_text().splitlines()
    assert any(c.startswith("squeue ") for c in calls) and any(
        c.startswith("sinfo ") for c in calls), calls
    assert any(c.startswith("scontrol update JobId=") for c in calls), calls  # the grows
