"""``malletrain admin check`` on a Slurm cluster: is it set up for MalleTrain, and if not,
what is missing.

It asks the running slurmctld (``scontrol show config``, ``scontrol show partition``,
``squeue``; ``sacctmgr show qos`` under QOS preemption), reads the ``slurm.conf`` it reports and
the ``job_submit.lua`` beside it, and returns one verdict per check: OK, MISSING or WRONG, with
how to fix it. Every command goes through :class:`~malletrain_core.runner.CommandRunner`
(argument lists, timeouts).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from pathlib import Path

from ...config import Config
from ...errors import CommandError
from ...hostlist import expand
from ...runner import CommandRunner, with_bin_dir
from ..checks import Check, missing, ok, wrong
from .pyslurm_reader import choose
from .release import TESTED, SlurmRelease
from .rules import TIME_LIMIT_CHECK_S, epilog_margin_for, grant_timeout_for, hole_margin_for
from .settings import (
    EPILOG_MARKER,
    LUA_MARKER,
    NULL,
    int_of,
    lua_settings,
    parse_records,
    parse_show_config,
    parse_slurm_conf,
    uid_of,
)


def check_file_safety(path: Path, trusted: set[int]) -> str | None:
    """Why ``path`` (or its folder) could be changed by someone other than ``trusted`` uids,
    or ``None``."""
    for p in (path, path.parent):
        st = p.stat()
        if st.st_uid not in trusted:
            return f"{p} is owned by uid {st.st_uid}"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            return f"{p} is writable by group or others"
    return None


def check_epilog(value: str, trusted: set[int]) -> Check:
    name = "EpilogSlurmctld"
    fix_set = ("copy plugin/epilog_slurmctld to /usr/local/lib/malletrain/, set "
               "EpilogSlurmctld to it in slurm.conf, then scontrol reconfigure")
    if value in NULL:
        return missing(name, "not set: the daemon is only woken by its periodic poll", fix_set)
    path = Path(value.split(",")[0].strip())
    if not path.is_file():
        return missing(name, f"{path} does not exist", fix_set)
    if not os.access(path, os.X_OK):
        return wrong(name, f"{path} is not executable", f"chmod 755 {path}")
    files = [path]
    text = path.read_text(errors="replace")
    if EPILOG_MARKER not in text:
        target = re.search(r"\bexec\s+(?:\S+=\S+\s+)*(/\S+)", text)  # a wrapper that sets env
        if target is None or not Path(target.group(1)).is_file() or \
                EPILOG_MARKER not in Path(target.group(1)).read_text(errors="replace"):
            return wrong(name, f"{path} is not MalleTrain's epilog (nor a wrapper exec'ing it)",
                          "call plugin/epilog_slurmctld from your EpilogSlurmctld")
        files.append(Path(target.group(1)))
    for f in files:
        problem = check_file_safety(f, trusted)
        if problem:
            return wrong(name, f"{problem}: a user could run code as SlurmUser",
                          f"chown root {f} {f.parent}; chmod go-w {f} {f.parent}")
    return ok(name, f"{path}" + (f" -> {files[-1]}" if len(files) > 1 else ""))


def check_preemption(conf: Mapping[str, str], lua: Mapping[str, str], partition: str,
                     partitions: list[dict[str, str]] | None,
                     qos: list[dict[str, str]] | None) -> list[Check]:
    """PreemptType/PreemptMode, and the preemptable partition or the malletrain QOS."""
    ptype, pmode = conf.get("PreemptType", ""), conf.get("PreemptMode", "")
    out = []
    if ptype not in ("preempt/partition_prio", "preempt/qos"):
        out.append(wrong("PreemptType", f"{ptype or '(null)'}: production jobs cannot take "
                          "nodes back", "set PreemptType=preempt/partition_prio (or "
                          "preempt/qos with slurmdbd) and restart slurmctld"))
    else:
        out.append(ok("PreemptType", ptype))
    if "REQUEUE" not in pmode.upper().split(","):
        out.append(wrong("PreemptMode", f"{pmode or '(null)'}: a preempted task would not go "
                          "back to the queue", "set PreemptMode=REQUEUE and scontrol "
                          "reconfigure"))
    else:
        out.append(ok("PreemptMode", pmode))
    keep_qos = lua.get("KEEP_QOS", "false") == "true"
    if ptype == "preempt/qos":
        out.append(check_qos(lua.get("QOS_NAME", "malletrain"), qos, keep_qos))
    elif ptype == "preempt/partition_prio":
        out.extend(check_partitions(partition, partitions or [], keep_qos))
    return out


def check_partitions(name: str, partitions: list[dict[str, str]], keep_qos: bool) -> list[Check]:
    by_name = {p.get("PartitionName", ""): p for p in partitions}
    mine = by_name.get(name)
    if mine is None:
        return [missing("partition", f"no partition {name!r}",
                         f"add PartitionName={name} Nodes=ALL PriorityTier=1 "
                         "PreemptMode=REQUEUE GraceTime=0 OverSubscribe=EXCLUSIVE (see "
                         "slurm_conf/slurm.conf.fragment)")]
    out = []
    problems = []
    if mine.get("PreemptMode", "").upper() not in ("REQUEUE", "GANG,REQUEUE"):
        problems.append(f"PreemptMode={mine.get('PreemptMode')}")
    if mine.get("GraceTime", "0") != "0":
        problems.append(f"GraceTime={mine.get('GraceTime')}")
    if keep_qos:
        problems.append("job_submit.lua has KEEP_QOS = true")
    if problems:
        out.append(wrong("partition", f"{name}: {', '.join(problems)}",
                          f"set PreemptMode=REQUEUE GraceTime=0 on partition {name} and "
                          "KEEP_QOS = false in job_submit.lua"))
    else:
        out.append(ok("partition", f"{name}: PreemptMode=REQUEUE GraceTime=0"))
    tier = int_of(mine.get("PriorityTier")) or 0
    nodes = set(_nodes(mine.get("Nodes", "")))
    higher = [p.get("PartitionName", "?") for p in partitions
              if p is not mine and (int_of(p.get("PriorityTier")) or 0) > tier
              and nodes & set(_nodes(p.get("Nodes", "")))]
    if higher:
        out.append(ok("higher tier", f"{', '.join(higher)} preempt{'s' if len(higher) == 1 else ''} "
                                      f"{name} (PriorityTier > {tier})"))
    else:
        out.append(missing("higher tier", f"no partition over {name}'s nodes has a "
                            f"PriorityTier above {tier}: nothing can preempt elastic tasks",
                            "give the production partitions a higher PriorityTier (e.g. 10)"))
    return out


def _nodes(text: str) -> list[str]:
    try:
        return expand(text) if text not in NULL else []
    except ValueError:
        return []


def check_qos(name: str, qos: list[dict[str, str]] | None, keep_qos: bool) -> Check:
    if qos is None:
        return wrong("qos", "preempt/qos without accounting (AccountingStorageType is none)",
                      "configure slurmdbd, or use PreemptType=preempt/partition_prio")
    rows = {q.get("Name", ""): q for q in qos}
    mine = rows.get(name)
    fix = f"run slurm_conf/qos-setup.sh --preemptor normal USER... (QOS {name})"
    if mine is None:
        return missing("qos", f"no QOS {name!r}", fix)
    preemptors = [q["Name"] for q in qos if name in q.get("Preempt", "").split(",")]
    if mine.get("PreemptMode", "").lower() not in ("requeue", "cluster") or not preemptors:
        return wrong("qos", f"{name}: PreemptMode={mine.get('PreemptMode') or '-'}, "
                      f"preempted by {', '.join(preemptors) or 'no QOS'}", fix)
    if not keep_qos:
        return wrong("qos", "job_submit.lua drops the QOS (KEEP_QOS = false)",
                      "set KEEP_QOS = true in job_submit.lua")
    return ok("qos", f"{name}: requeue, preempted by {', '.join(preemptors)}")


def check_release(version: str) -> Check:
    """Whether this MalleTrain supports the controller's Slurm release."""
    try:
        rel = SlurmRelease.parse(version)
    except ValueError:
        return wrong("Slurm release", f"cannot read the version {version!r}",
                      "check that scontrol show config prints SLURM_VERSION")
    note = rel.support_note()
    if rel.supported:
        return ok("Slurm release", f"{rel}: {note}")
    return wrong("Slurm release", f"{rel}: {note}",
                  f"run make test-matrix against it first, or use Slurm {', '.join(TESTED)}")


def scheduler_parameter(params: str, key: str, default: int) -> int:
    """One integer of ``SchedulerParameters`` (``bf_interval=30,bf_resolution=60,...``)."""
    for item in params.split(","):
        name, _, value = item.strip().partition("=")
        if name == key and value.strip().isdigit():
            return int(value)
    return default


def check_hole_margin(params: str, margin_s: float) -> Check:
    """``slurm.hole_margin_s`` against the backfill's step: a task whose time limit ends within
    one bf_resolution of the planned start does not start on the planned node."""
    resolution = scheduler_parameter(params, "bf_resolution", 60)
    interval = scheduler_parameter(params, "bf_interval", 30)
    if margin_s < resolution:
        return wrong("hole margin", f"slurm.hole_margin_s = {margin_s:g} s is under "
                      f"bf_resolution={resolution}: tasks fitted to a planned hole may stay "
                      "pending", f"set slurm.hole_margin_s = {hole_margin_for(resolution, interval)} "
                      "in malletrain.toml")
    return ok("hole margin", f"{margin_s:g} s off every planned hole (bf_resolution="
                              f"{resolution}, bf_interval={interval})")


def check_epilog_margin(node_epilog: str, margin_s: float) -> Check:
    """``slurm.epilog_margin_s`` against the node ``Epilog`` of slurm.conf: where there is
    one, a task fitted to a hole keeps its node COMPLETING past its end for the Epilog's run,
    and a margin under slurmctld's time-limit check lets that run into the planned start."""
    name = "epilog margin"
    if node_epilog in NULL:
        return ok(name, f"no node Epilog; slurm.epilog_margin_s = {margin_s:g} s")
    if margin_s < TIME_LIMIT_CHECK_S:
        return wrong(name, f"Epilog={node_epilog} runs at every task's end but "
                     f"slurm.epilog_margin_s = {margin_s:g} s: its run delays the jobs "
                     "planned on the nodes MalleTrain harvests",
                     "set slurm.epilog_margin_s to the Epilog's longest run + "
                     f"{TIME_LIMIT_CHECK_S} in malletrain.toml (e.g. {epilog_margin_for(5)} "
                     "for a 5-s health check)")
    return ok(name, f"{margin_s:g} s off every planned hole for Epilog={node_epilog} "
              f"(its longest run up to {margin_s - TIME_LIMIT_CHECK_S:g} s)")


def check_grant_timeout(params: str, kill_wait: str, timeout_s: float) -> Check:
    """``slurm.grant_timeout_s`` against how long Slurm may take to start a released task: the
    next backfill cycle, batch_sched_delay and a preempted predecessor's KillWait. A shorter
    timeout takes grants back that would have started."""
    interval = scheduler_parameter(params, "bf_interval", 30)
    delay = scheduler_parameter(params, "batch_sched_delay", 3)
    digits = "".join(ch for ch in kill_wait.split(" ")[0] if ch.isdigit())
    wait = int(digits) if digits else 30
    need = grant_timeout_for(interval, delay, wait)
    if timeout_s < need:
        return wrong("grant timeout", f"slurm.grant_timeout_s = {timeout_s:g} s is under the "
                      f"{need} s a released task may need (bf_interval={interval}, "
                      f"batch_sched_delay={delay}, KillWait={wait}, +10 s): grants that would "
                      "start are taken back", f"set slurm.grant_timeout_s = {need} in "
                      "malletrain.toml")
    return ok("grant timeout", f"a grant not running after {timeout_s:g} s is taken back and "
                                f"planned again (at least {need} s needed here)")


class SlurmChecker:
    """Runs the checks against the slurmctld the runner's environment points at."""

    def __init__(self, runner: CommandRunner, config: Config) -> None:
        self.runner = runner
        self.config = config

    def _run(self, argv: list[str]) -> str:
        return self.runner.run(argv).stdout

    def checks(self) -> list[Check]:
        try:
            conf = parse_show_config(self._run(["scontrol", "show", "config"]))
        except CommandError as exc:
            return [wrong("slurmctld", f"scontrol show config failed: {exc}",
                           "start slurmctld, or point SLURM_CONF at the cluster's slurm.conf")]
        conf_path = Path(conf.get("SLURM_CONF", "/etc/slurm/slurm.conf"))
        out = [ok("slurmctld", f"Slurm {conf.get('SLURM_VERSION', '?')}, {conf_path}"),
               check_release(conf.get("SLURM_VERSION", ""))]
        out.append(self._path())
        try:
            file_conf = parse_slurm_conf(conf_path.read_text(errors="replace"))
        except OSError as exc:
            file_conf = {}
            out.append(wrong("slurm.conf", f"cannot read {conf_path}: {exc.strerror}",
                              "run the check on the controller, as root or SlurmUser"))
        else:
            stale = [k for k in ("JobSubmitPlugins", "EpilogSlurmctld", "PreemptType",
                                 "PreemptMode", "MaxArraySize", "MaxJobCount")
                     if k.lower() in file_conf and conf.get(k, "") != file_conf[k.lower()]
                     and not (k == "JobSubmitPlugins" and "lua" in conf.get(k, "")
                              and "lua" in file_conf[k.lower()])]
            if stale:
                out.append(wrong("slurm.conf", f"{conf_path} differs from the running "
                                  f"slurmctld in {', '.join(stale)}",
                                  "scontrol reconfigure (restart slurmctld for PreemptType "
                                  "and JobSubmitPlugins)"))
            else:
                out.append(ok("slurm.conf", f"{conf_path} matches the running slurmctld"))
        plugins = [p.strip().removeprefix("job_submit/") for p in
                   conf.get("JobSubmitPlugins", "").split(",")]
        if "lua" in plugins:
            out.append(ok("JobSubmitPlugins", conf["JobSubmitPlugins"]))
        else:
            out.append(missing("JobSubmitPlugins", "lua is not loaded: elastic submissions "
                                "are not converted", "add JobSubmitPlugins=lua to slurm.conf "
                                "and restart slurmctld"))
        lua_path = conf_path.parent / "job_submit.lua"
        lua: dict[str, str] = {}
        if not lua_path.is_file():
            out.append(missing("job_submit.lua", f"{lua_path} does not exist",
                                f"copy plugin/job_submit.lua to {lua_path}"))
        else:
            text = lua_path.read_text(errors="replace")
            module = conf_path.parent / "malletrain.lua"
            if LUA_MARKER not in text and re.search(r"require\s*\(?\s*[\"']malletrain[\"']",
                                                    text) and module.is_file():
                lua_path, text = module, module.read_text(errors="replace")  # a site's script
            if LUA_MARKER not in text:
                out.append(wrong("job_submit.lua", f"{lua_path} is not MalleTrain's",
                                  "merge plugin/job_submit.lua into your job_submit.lua, or "
                                  "install it as malletrain.lua beside it and require it "
                                  "(docs/site-integration.md)"))
            else:
                lua = lua_settings(text)
                out.append(ok("job_submit.lua", f"{lua_path} (" + ", ".join(
                    f"{k}={v}" for k, v in sorted(lua.items())) + ")"))
        slurm_uid = uid_of(conf.get("SlurmUser", ""))
        trusted = {0} if slurm_uid is None else {0, slurm_uid}
        out.append(check_epilog(conf.get("EpilogSlurmctld", "(null)"), trusted))
        prolog = conf.get("PrologSlurmctld", "(null)")
        out.append(ok("PrologSlurmctld", "not set") if prolog in NULL else wrong(
            "PrologSlurmctld", f"{prolog}: Slurm delays every job start until it returns",
            "remove PrologSlurmctld from slurm.conf (MalleTrain needs none)"))
        out.extend(self._preemption(conf, lua))
        out.extend(self._headroom(conf, lua))
        out.append(check_hole_margin(conf.get("SchedulerParameters", ""),
                                     self.config.slurm.hole_margin_s))
        out.append(check_epilog_margin(conf.get("Epilog", "(null)"),
                                       self.config.slurm.epilog_margin_s))
        out.append(check_grant_timeout(conf.get("SchedulerParameters", ""),
                                       conf.get("KillWait", ""),
                                       self.config.slurm.grant_timeout_s))
        return out

    def _path(self) -> Check:
        """How malletraind would talk to slurmctld: pyslurm or the commands (the daemon's own
        choice, :func:`~malletrain_core.backends.slurm.pyslurm_reader.choose`)."""
        setting = self.config.slurm.pyslurm.strip()
        src, line = choose(setting, self.runner.env)
        if src is not None:
            src.close()
        if src is None and setting not in ("", "off", "auto"):
            return wrong("Slurm path", line, "build a pyslurm of the cluster's MAJOR.MINOR "
                          "for that Python, or set slurm.pyslurm = \"auto\" or \"off\"")
        return ok("Slurm path", line)

    def _preemption(self, conf: Mapping[str, str], lua: Mapping[str, str]) -> list[Check]:
        partition = lua.get("PARTITION") or self.config.slurm.partition
        partitions = qos = None
        if conf.get("PreemptType") == "preempt/partition_prio":
            partitions = parse_records(self._run(["scontrol", "show", "partition", "-o"]))
        elif conf.get("AccountingStorageType", "accounting_storage/none") not in (
                "accounting_storage/none", *NULL):
            text = self._run(["sacctmgr", "-nP", "show", "qos",
                              "format=Name,Preempt,PreemptMode,GraceTime"])
            qos = [dict(zip(("Name", "Preempt", "PreemptMode", "GraceTime"), line.split("|")))
                   for line in text.splitlines() if line.strip()]
        out = check_preemption(conf, lua, partition, partitions, qos)
        if lua.get("PARTITION") and lua["PARTITION"] != self.config.slurm.partition:
            out.append(wrong("daemon partition", f"job_submit.lua sends tasks to "
                              f"{lua['PARTITION']!r}, malletraind polls "
                              f"{self.config.slurm.partition!r}", "set slurm.partition in "
                              "malletrain.toml to the job_submit.lua PARTITION"))
        return out

    def _headroom(self, conf: Mapping[str, str], lua: Mapping[str, str]) -> list[Check]:
        hi = int_of(lua.get("MAX_NODES")) or 1000
        out = []
        array = int_of(conf.get("MaxArraySize"))
        if array is None or array < hi + 1:
            out.append(wrong("MaxArraySize", f"{array}: an elastic job of {hi} nodes needs "
                              f"{hi} array tasks", f"set MaxArraySize={hi + 1} (or lower "
                              "MAX_NODES in job_submit.lua)"))
        else:
            out.append(ok("MaxArraySize", f"{array} > MAX_NODES {hi}"))
        count = int_of(conf.get("MaxJobCount"))
        try:
            queued = len(self._run(["squeue", "--noheader", "--array", "--all",
                                    "--format=%i"]).split())
        except CommandError:
            queued = 0
        if count is None or count - queued < hi:
            out.append(wrong("MaxJobCount", f"{count} with {queued} jobs and tasks queued: "
                              f"no room for one {hi}-node elastic job",
                              f"raise MaxJobCount to at least {queued + 2 * hi}"))
        else:
            out.append(ok("MaxJobCount", f"{count}, {queued} queued: room for "
                                          f"{(count - queued) // hi} elastic job(s) of {hi}"))
        return out


def admin_checks(config: Config) -> list[Check]:
    """Every check against the slurmctld that ``slurm.bin_dir``'s commands reach."""
    runner = with_bin_dir(config.slurm.bin_dir, config.slurm.command_timeout_s)
    return SlurmChecker(runner, config).checks()
