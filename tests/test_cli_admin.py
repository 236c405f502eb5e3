"""``malletrain admin check`` on canned Slurm 22.05 output (the subprocess boundary is faked;
slurm.conf, job_submit.lua and the epilog are real files)."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from malletrain_core.backends.checks import Check
from malletrain_core.backends.slurm.backend import epilog_margin_for
from malletrain_core.backends.slurm.checks import (
    SlurmChecker,
    check_epilog_margin,
    check_grant_timeout,
    check_hole_margin,
    scheduler_parameter,
)
from malletrain_core.backends.slurm.settings import lua_settings, parse_records, parse_show_config
from malletrain_core.cli import main
from malletrain_core.cli.admin import format_checks
from malletrain_core.config import Config
from malletrain_core.runner import CommandRunner

HERE = Path(__file__).parent
GOLDEN = HERE / "golden" / "cli"
PLUGIN = HERE.parent / "plugin"
SLURM_CONF = """JobSubmitPlugins=lua
EpilogSlurmctld=@ETC@/epilog_slurmctld
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=prod Nodes=ALL Default=YES PriorityTier=10
"""
QOS = "malletrain||requeue|00:00:00\nnormal|malletrain|cluster|00:00:00\n"


class Canned(CommandRunner):
    """Answers the commands admin check runs from canned text (keyed by their first three
    words; others fail with 127) and records the argument lists."""

    def __init__(self, answers: dict[str, str]) -> None:
        super().__init__()
        self.answers = answers
        self.calls: list[list[str]] = []

    def _spawn(self, argv, timeout_s, input):
        self.calls.append(argv)
        out = self.answers.get(" ".join(argv[:3]))
        return subprocess.CompletedProcess(argv, 127 if out is None else 0, out or "",
                                           "error: boom" if out is None else "")


@dataclass
class Site:
    """slurm.conf, job_submit.lua and the epilog in ``etc``, and what the commands print."""

    etc: Path
    config: str
    answers: dict[str, str]
    calls: list[list[str]] = field(default_factory=list)

    def checks(self, show_config: str | None = None, partitions: str | None = None,
               **config_kwargs) -> tuple[dict[str, Check], list[Check]]:
        answers = dict(self.answers)
        if show_config is not None:
            answers["scontrol show config"] = show_config
        if partitions is not None:
            answers["scontrol show partition"] = partitions
        runner = Canned(answers)
        result = SlurmChecker(runner, Config(**config_kwargs)).checks()
        self.calls = runner.calls
        return {c.check: c for c in result}, result


@pytest.fixture
def site(tmp_path):
    etc = tmp_path / "etc"
    etc.mkdir()
    etc.chmod(0o755)
    (etc / "slurm.conf").write_text(SLURM_CONF.replace("@ETC@", str(etc)))
    shutil.copy(PLUGIN / "job_submit.lua", etc / "job_submit.lua")
    shutil.copy(PLUGIN / "epilog_slurmctld", etc / "epilog_slurmctld")
    (etc / "epilog_slurmctld").chmod(0o755)
    me = pwd.getpwuid(os.getuid()).pw_name  # the files' owner plays SlurmUser
    config = (GOLDEN / "scontrol_show_config.txt").read_text().replace("@ETC@", str(etc))
    config = config.replace("root(0)", f"{me}({os.getuid()})")
    return Site(etc, config, {
        "scontrol show config": config,
        "scontrol show partition": (GOLDEN / "scontrol_show_partition.txt").read_text(),
        "squeue --noheader --array": "5_[0-3]\n7\n",
        "sacctmgr -nP show": QOS,
    })


def test_parsers():
    conf = parse_show_config("Configuration data as of x\nMaxArraySize            = 1001\n"
                             "SlurmUser               = slurm(64030)\n")
    assert conf == {"MaxArraySize": "1001", "SlurmUser": "slurm(64030)"}
    assert parse_records("PartitionName=a Nodes=n[1-2] PriorityTier=1\n") == [
        {"PartitionName": "a", "Nodes": "n[1-2]", "PriorityTier": "1"}]
    assert lua_settings((PLUGIN / "job_submit.lua").read_text()) == {
        "QOS_NAME": "malletrain", "KEEP_QOS": "false", "PARTITION": "preemptable",
        "MAX_NODES": "1000"}


def test_a_good_site_passes_every_check(site):
    by_name, checks = site.checks()
    assert [c.status for c in checks] == ["OK"] * len(checks), format_checks(checks)
    assert list(by_name) == ["slurmctld", "Slurm release", "Slurm path", "slurm.conf",
                             "JobSubmitPlugins", "job_submit.lua",
                             "EpilogSlurmctld", "PrologSlurmctld", "PreemptType",
                             "PreemptMode", "partition", "higher tier", "MaxArraySize",
                             "MaxJobCount", "hole margin", "epilog margin",
                                 "grant timeout"]
    text = format_checks(checks).replace(str(site.etc), "ETC")
    text = text.replace(f"{pwd.getpwuid(os.getuid()).pw_name}", "USER")
    golden = GOLDEN / "admin_check.txt"
    if os.environ.get("MALLETRAIN_UPDATE_GOLDEN"):
        golden.write_text(text + "\n")
    assert text + "\n" == golden.read_text()
    assert ["squeue", "--noheader", "--array", "--all", "--format=%i"] in site.calls


def test_what_is_missing_or_wrong(site):
    broken = (site.config
              .replace("JobSubmitPlugins        = lua", "JobSubmitPlugins        = (null)")
              .replace("PrologSlurmctld         = (null)", "PrologSlurmctld         = /bin/true")
              .replace("MaxArraySize            = 1001", "MaxArraySize            = 500")
              .replace("MaxJobCount             = 10000", "MaxJobCount             = 1001")
              .replace("SchedulerParameters     = bf_interval=1,batch_sched_delay=0",
                       "SchedulerParameters     = bf_interval=1,bf_resolution=120")
              .replace("PreemptMode             = REQUEUE", "PreemptMode             = OFF")
              .replace("Epilog                  = (null)",
                       "Epilog                  = /etc/slurm/healthcheck.sh"))
    (site.etc / "slurm.conf").write_text("PreemptMode=OFF\nMaxArraySize=500\n")
    by_name, checks = site.checks(broken)
    status = {name: c.status for name, c in by_name.items()}
    assert status == {
        "slurmctld": "OK", "Slurm release": "OK", "Slurm path": "OK",
        "slurm.conf": "OK",
        "JobSubmitPlugins": "MISSING",
        "job_submit.lua": "OK", "EpilogSlurmctld": "OK", "PrologSlurmctld": "WRONG",
        "PreemptType": "OK", "PreemptMode": "WRONG", "partition": "OK", "higher tier": "OK",
        "MaxArraySize": "WRONG", "MaxJobCount": "WRONG", "hole margin": "WRONG",
        "epilog margin": "WRONG", "grant timeout": "OK"}
    assert "set MaxArraySize=1001" in by_name["MaxArraySize"].fix
    assert "1001 with 2 jobs and tasks queued" in by_name["MaxJobCount"].detail
    assert all(c.fix for c in checks if not c.ok)
    assert all("\n" not in line for line in format_checks(checks).splitlines())


@pytest.mark.parametrize("version, status, note", [
    ("22.05.8", "OK", "22.05.8: tested with this MalleTrain"),
    ("24.11.5", "OK", "24.11.5: tested with this MalleTrain"),
    ("25.11.7", "OK", "25.11.7: tested with this MalleTrain"),
    ("26.05.3", "OK", "26.05.3: tested with this MalleTrain"),
    ("24.05.3", "OK", "24.05.3: supported, not tested (tested: 22.05, 24.11, 25.11, 26.05)"),
    ("21.08.8", "WRONG", "21.08.8: older than 22.05, not supported"),
    ("26.11.1", "WRONG", "26.11.1: newer than 26.05, not tested with this MalleTrain"),
    ("banana", "WRONG", "cannot read the version 'banana'")])
def test_the_release_is_reported_with_its_support(site, version, status, note):
    config = re.sub(r"SLURM_VERSION\s*=.*", f"SLURM_VERSION           = {version}", site.config)
    by_name, _ = site.checks(config)
    assert (by_name["Slurm release"].status, by_name["Slurm release"].detail) == (status, note)
    assert status == "OK" or by_name["Slurm release"].fix


def test_scripts_listed_per_index_from_24_11(site):
    """24.11 prints EpilogSlurmctld[0] = ...: still found, the slurm.conf one matches."""
    config = site.config.replace("EpilogSlurmctld         =", "EpilogSlurmctld[0]      =")
    assert "EpilogSlurmctld[0]" in config
    by_name, _ = site.checks(config)
    assert by_name["EpilogSlurmctld"].status == "OK", by_name["EpilogSlurmctld"]
    assert by_name["slurm.conf"].status == "OK", by_name["slurm.conf"]
    assert parse_show_config("Epilog[0] = /a\nEpilog[1] = /b\n") == {"Epilog": "/a,/b"}


def test_stale_slurm_conf(site):
    (site.etc / "slurm.conf").write_text("MaxArraySize=2001\nPreemptMode=REQUEUE\n")
    by_name, _ = site.checks()
    assert by_name["slurm.conf"].status == "WRONG"
    assert "differs from the running slurmctld in MaxArraySize" in by_name["slurm.conf"].detail


def test_foreign_lua_and_unsafe_epilog(site):
    (site.etc / "job_submit.lua").write_text("function slurm_job_submit() end\n")
    (site.etc / "epilog_slurmctld").chmod(0o777)
    by_name, _ = site.checks()
    assert by_name["job_submit.lua"].status == "WRONG"
    assert by_name["EpilogSlurmctld"].status == "WRONG"
    assert "writable by group or others" in by_name["EpilogSlurmctld"].detail


def test_epilog_wrapper_is_followed(site):
    wrapper = site.etc / "epilog_slurmctld"
    real = site.etc / "real_epilog"
    shutil.copy(PLUGIN / "epilog_slurmctld", real)
    wrapper.write_text(f"#!/bin/sh\nMALLETRAIN_HOOK_SOCKET=/run/x.sock exec {real}\n")
    by_name, _ = site.checks()
    assert by_name["EpilogSlurmctld"].status == "OK"
    assert by_name["EpilogSlurmctld"].detail == f"{wrapper} -> {real}"
    wrapper.write_text("#!/bin/sh\nexec /bin/true\n")
    by_name, _ = site.checks()
    assert by_name["EpilogSlurmctld"].status == "WRONG"


def test_no_higher_tier_and_missing_partition(site):
    flat = site.answers["scontrol show partition"].replace("PriorityTier=10", "PriorityTier=1")
    by_name, _ = site.checks(partitions=flat)
    assert by_name["higher tier"].status == "MISSING"
    by_name, _ = site.checks(partitions=flat.splitlines()[0] + "\n")
    assert by_name["partition"].status == "MISSING"
    assert "PartitionName=preemptable" in by_name["partition"].fix


def test_qos_preemption(site):
    qos_conf = (site.config
                .replace("PreemptType             = preempt/partition_prio",
                         "PreemptType             = preempt/qos")
                .replace("AccountingStorageType   = accounting_storage/none",
                         "AccountingStorageType   = accounting_storage/slurmdbd"))
    (site.etc / "slurm.conf").write_text("")
    lua = site.etc / "job_submit.lua"
    lua.write_text(lua.read_text().replace("local KEEP_QOS = false", "local KEEP_QOS = true"))
    by_name, _ = site.checks(qos_conf)
    assert by_name["qos"].status == "OK", by_name["qos"]
    assert by_name["qos"].detail == "malletrain: requeue, preempted by normal"
    assert ["sacctmgr", "-nP", "show", "qos", "format=Name,Preempt,PreemptMode,GraceTime"] \
        in site.calls
    site.answers["sacctmgr -nP show"] = "malletrain||requeue|00:00:00\nnormal||cluster|0\n"
    by_name, _ = site.checks(qos_conf)
    assert by_name["qos"].status == "WRONG" and "preempted by no QOS" in by_name["qos"].detail
    no_acct = qos_conf.replace("accounting_storage/slurmdbd", "accounting_storage/none")
    by_name, _ = site.checks(no_acct)
    assert by_name["qos"].status == "WRONG" and "without accounting" in by_name["qos"].detail


def test_daemon_partition_must_match_the_lua(site):
    from malletrain_core.backends.slurm.options import SlurmOptions
    by_name, _ = site.checks(slurm=SlurmOptions(partition="elastic"))
    assert by_name["daemon partition"].status == "WRONG"


def test_slurmctld_down(site):
    runner = Canned({})
    checks = SlurmChecker(runner, Config()).checks()
    assert [(c.check, c.status) for c in checks] == [("slurmctld", "WRONG")]
    assert "scontrol show config failed" in checks[0].detail


def test_cli_exit_codes_and_json(site, capsys, monkeypatch):
    config_text = site.config

    def spawn(self, argv, timeout_s, input):
        if argv[:3] == ["scontrol", "show", "config"]:
            return subprocess.CompletedProcess(argv, 0, config_text, "")
        if argv[:3] == ["scontrol", "show", "partition"]:
            return subprocess.CompletedProcess(argv, 0, site.answers["scontrol show partition"],
                                               "")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(CommandRunner, "_spawn", spawn)
    cfg = site.etc / "m.toml"
    cfg.write_text("")
    assert main(["admin", "check", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 17 and all(line.startswith("OK ") for line in out.splitlines())
    config_text = site.config.replace("MaxArraySize            = 1001",
                                      "MaxArraySize            = 64")
    assert main(["admin", "check", "--json", "--config", str(cfg)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    assert [c["check"] for c in report["checks"] if c["status"] != "OK"] == ["MaxArraySize"]
    cfg.write_text('[daemon]\nbatch_system = "pbs"\n')  # PBS's checks (tests/pbs_real)
    assert main(["admin", "check", "--config", str(cfg)]) == 1
    assert capsys.readouterr().out.startswith("WRONG   pbs_server  qstat -F json printed no")


def test_a_site_script_that_requires_the_module(site):
    """A site's own job_submit.lua that loads plugin/job_submit.lua as malletrain.lua: the
    settings are read from the module (docs/site-integration.md)."""
    (site.etc / "malletrain.lua").write_text((PLUGIN / "job_submit.lua").read_text())
    (site.etc / "job_submit.lua").write_text(
        'package.path = "/etc/slurm/?.lua;" .. package.path\n'
        'local malletrain = require("malletrain")\n'
        "function slurm_job_submit(d, p, u) return malletrain.job_submit(d, p, u) end\n")
    by_name, _ = site.checks()
    assert by_name["job_submit.lua"].status == "OK"
    assert "malletrain.lua" in by_name["job_submit.lua"].detail
    (site.etc / "malletrain.lua").unlink()
    by_name, _ = site.checks()
    assert by_name["job_submit.lua"].status == "WRONG"


def test_the_slurm_path_is_the_daemons_choice(site):
    """admin check prints how malletraind would talk to slurmctld, and says what to do when a
    pyslurm helper it is told to use does not answer."""
    from malletrain_core.backends.slurm.options import SlurmOptions
    by_name, _ = site.checks()
    assert by_name["Slurm path"].detail == 'commands (slurm.pyslurm = "off")'
    by_name, _ = site.checks(slurm=SlurmOptions(pyslurm="/nonexistent/python3"))
    path = by_name["Slurm path"]
    assert path.status == "WRONG" and "build a pyslurm" in path.fix
    assert path.detail.startswith("commands (no pyslurm in helper '/nonexistent/python3': ")


def test_the_hole_margin_follows_the_backfill_step():
    assert scheduler_parameter("bf_interval=1,bf_resolution=5,batch_sched_delay=0",
                               "bf_resolution", 60) == 5
    assert scheduler_parameter("(null)", "bf_resolution", 60) == 60
    ok = check_hole_margin("bf_interval=1,bf_resolution=1", 3.0)
    assert ok.ok and "bf_resolution=1" in ok.detail
    low = check_hole_margin("bf_interval=30", 30.0)  # Slurm's default step: 60 s
    assert not low.ok and "bf_resolution=60" in low.detail
    assert "slurm.hole_margin_s = 91" in low.fix


def test_the_epilog_margin_follows_the_node_epilog():
    assert (epilog_margin_for(0), epilog_margin_for(5), epilog_margin_for(4.2)) == (0, 35, 35)
    assert check_epilog_margin("(null)", 0.0).ok
    low = check_epilog_margin("/etc/slurm/healthcheck.sh", 0.0)
    assert not low.ok and "Epilog=/etc/slurm/healthcheck.sh" in low.detail
    assert "slurm.epilog_margin_s" in low.fix and "35 for a 5-s" in low.fix
    ok = check_epilog_margin("/etc/slurm/healthcheck.sh", 40.0)
    assert ok.ok and "up to 10 s" in ok.detail


def test_the_grant_timeout_covers_a_backfill_cycle_and_killwait():
    ok = check_grant_timeout("bf_interval=1,batch_sched_delay=0", "2 sec", 13.0)
    assert ok.ok and "at least 13 s" in ok.detail
    low = check_grant_timeout("(null)", "30 sec", 60.0)  # Slurm's defaults: 30 + 3 + 30 + 10
    assert not low.ok and "KillWait=30" in low.detail
    assert "slurm.grant_timeout_s = 73" in low.fix


def test_a_batch_system_without_checks_is_one_line(tmp_path, capsys):
    """admin check asks the configured batch system's registry entry; the toy has no checks."""
    cfg = tmp_path / "toy.toml"
    cfg.write_text("[daemon]\nbatch_system = \"toy\"\n")
    assert main(["admin", "check", "--config", str(cfg)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no checks for daemon.batch_system = 'toy'" in err[0]
