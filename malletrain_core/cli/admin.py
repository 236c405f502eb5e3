"""``malletrain admin check``: is this Slurm cluster set up for MalleTrain, and if not, what
is missing.

It asks the running slurmctld (``scontrol show config``, ``scontrol show partition``,
``squeue``; ``sacctmgr show qos`` under QOS preemption), reads the ``slurm.conf`` it reports and
the ``job_submit.lua`` beside it, and prints one line per check: OK, MISSING or WRONG, with how
to fix it. Exit code 1 when anything is not OK. Every command goes through
:class:`~malletrain_core.runner.CommandRunner` (argument lists, timeouts).

Kept in one module (over 400 lines) on purpose: the admin checks are one list read top to
bottom, each a short function.
"""

from __future__ import annotations

import argparse
import os
import re
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ..backends.slurm.backend import grant_timeout_for, hole_margin_for
from ..backends.slurm.pyslurm_reader import choose
from ..backends.slurm.release import TESTED, SlurmRelease
from ..config import Config, load
from ..errors import CommandError
from ..hostlist import expand
from ..runner import CommandRunner
from . import client
from .output import CliError, exit_one, print_json, styled

HELP = ("administrator tools (admin check: validate the Slurm or PBS setup; admin drain / resume: "
        "take MalleTrain off the cluster and back)")
DRAIN_DESCRIPTION = (
    "shrink every elastic job to zero and give no node to any job until resume: the "
    "running tasks checkpoint and go back to held, the jobs stay queued, the daemon keeps "
    "running and stays drained across a restart. Root or the SlurmUser.")
RESUME_DESCRIPTION = (
    "end a drain: the daemon offers the idle nodes to the engine again and grows the "
    "jobs as before. Root or the SlurmUser.")
LUA_MARKER = "MalleTrain job_submit.lua"
EPILOG_MARKER = "MalleTrain's EpilogSlurmctld"
NULL = ("", "(null)", "none", "None")
CHECK_DESCRIPTION = (
    "Ask the running slurmctld (scontrol show config/partition, squeue; sacctmgr show qos "
    "under QOS preemption), read the slurm.conf it reports and the job_submit.lua beside it, "
    "and print one line per check: OK, MISSING or WRONG with how to fix it. Run it on the "
    "controller as root or SlurmUser. Exit code 1 when anything is not OK.")


@dataclass(frozen=True)
class Check:
    """One verdict: ``status`` is OK, WARN (works, with a limit), MISSING or WRONG; ``fix``
    says what to do if not OK."""

    check: str
    status: str
    detail: str
    fix: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("OK", "WARN")


def _ok(check: str, detail: str) -> Check:
    return Check(check, "OK", detail)


def _missing(check: str, detail: str, fix: str) -> Check:
    return Check(check, "MISSING", detail, fix)


def _wrong(check: str, detail: str, fix: str) -> Check:
    return Check(check, "WRONG", detail, fix)


# -- parsing --------------------------------------------------------------------------------
def parse_show_config(text: str) -> dict[str, str]:
    """``scontrol show config`` → key → value (the first of each key). From 24.11 on a key
    that takes several scripts is printed once per script (``EpilogSlurmctld[0] = ...``): the
    values are joined with commas under the plain key."""
    out: dict[str, str] = {}
    listed: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = re.match(r"^(\w[\w/.-]*)(\[\d+\])?\s*=\s?(.*)$", line)
        if m and m.group(2):
            listed.setdefault(m.group(1), []).append(m.group(3).strip())
        elif m:
            out.setdefault(m.group(1), m.group(3).strip())
    for key, values in listed.items():
        out.setdefault(key, ",".join(values))
    return out


def parse_slurm_conf(text: str) -> dict[str, str]:
    """Top-level ``Key=Value`` lines of slurm.conf (keys lower-cased; nodes and partitions
    skipped)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        key, sep, value = line.partition("=")
        if sep and " " not in key.strip() and key.strip().lower() not in (
                "nodename", "partitionname", "nodeset", "frontendname", "downnodes"):
            out[key.strip().lower()] = value.strip()
    return out


def parse_records(text: str) -> list[dict[str, str]]:
    """One-line ``scontrol -o`` records (``Key=Value`` separated by spaces)."""
    return [dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
            for line in text.splitlines() if line.strip()]


def lua_settings(text: str) -> dict[str, str]:
    """The site settings at the top of our job_submit.lua (``local NAME = value``)."""
    return {m.group(1): m.group(2).strip().strip('"') for m in
            re.finditer(r"^local\s+(QOS_NAME|KEEP_QOS|PARTITION|MAX_NODES)\s*=\s*(\S+)",
                        text, re.MULTILINE)}


def _uid_of(value: str) -> int | None:
    m = re.search(r"\((\d+)\)", value)
    return int(m.group(1)) if m else None


def _int(value: str | None) -> int | None:
    try:
        return int(str(value).split()[0])
    except (ValueError, IndexError):
        return None


# -- the checks -----------------------------------------------------------------------------
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
        return _missing(name, "not set: the daemon is only woken by its periodic poll", fix_set)
    path = Path(value.split(",")[0].strip())
    if not path.is_file():
        return _missing(name, f"{path} does not exist", fix_set)
    if not os.access(path, os.X_OK):
        return _wrong(name, f"{path} is not executable", f"chmod 755 {path}")
    files = [path]
    text = path.read_text(errors="replace")
    if EPILOG_MARKER not in text:
        target = re.search(r"\bexec\s+(?:\S+=\S+\s+)*(/\S+)", text)  # a wrapper that sets env
        if target is None or not Path(target.group(1)).is_file() or \
                EPILOG_MARKER not in Path(target.group(1)).read_text(errors="replace"):
            return _wrong(name, f"{path} is not MalleTrain's epilog (nor a wrapper exec'ing it)",
                          "call plugin/epilog_slurmctld from your EpilogSlurmctld")
        files.append(Path(target.group(1)))
    for f in files:
        problem = check_file_safety(f, trusted)
        if problem:
            return _wrong(name, f"{problem}: a user could run code as SlurmUser",
                          f"chown root {f} {f.parent}; chmod go-w {f} {f.parent}")
    return _ok(name, f"{path}" + (f" -> {files[-1]}" if len(files) > 1 else ""))


def check_preemption(conf: Mapping[str, str], lua: Mapping[str, str], partition: str,
                     partitions: list[dict[str, str]] | None,
                     qos: list[dict[str, str]] | None) -> list[Check]:
    """PreemptType/PreemptMode, and the preemptable partition or the malletrain QOS."""
    ptype, pmode = conf.get("PreemptType", ""), conf.get("PreemptMode", "")
    out = []
    if ptype not in ("preempt/partition_prio", "preempt/qos"):
        out.append(_wrong("PreemptType", f"{ptype or '(null)'}: production jobs cannot take "
                          "nodes back", "set PreemptType=preempt/partition_prio (or "
                          "preempt/qos with slurmdbd) and restart slurmctld"))
    else:
        out.append(_ok("PreemptType", ptype))
    if "REQUEUE" not in pmode.upper().split(","):
        out.append(_wrong("PreemptMode", f"{pmode or '(null)'}: a preempted task would not go "
                          "back to the queue", "set PreemptMode=REQUEUE and scontrol "
                          "reconfigure"))
    else:
        out.append(_ok("PreemptMode", pmode))
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
        return [_missing("partition", f"no partition {name!r}",
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
        out.append(_wrong("partition", f"{name}: {', '.join(problems)}",
                          f"set PreemptMode=REQUEUE GraceTime=0 on partition {name} and "
                          "KEEP_QOS = false in job_submit.lua"))
    else:
        out.append(_ok("partition", f"{name}: PreemptMode=REQUEUE GraceTime=0"))
    tier = _int(mine.get("PriorityTier")) or 0
    nodes = set(_nodes(mine.get("Nodes", "")))
    higher = [p.get("PartitionName", "?") for p in partitions
              if p is not mine and (_int(p.get("PriorityTier")) or 0) > tier
              and nodes & set(_nodes(p.get("Nodes", "")))]
    if higher:
        out.append(_ok("higher tier", f"{', '.join(higher)} preempt{'s' if len(higher) == 1 else ''} "
                                      f"{name} (PriorityTier > {tier})"))
    else:
        out.append(_missing("higher tier", f"no partition over {name}'s nodes has a "
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
        return _wrong("qos", "preempt/qos without accounting (AccountingStorageType is none)",
                      "configure slurmdbd, or use PreemptType=preempt/partition_prio")
    rows = {q.get("Name", ""): q for q in qos}
    mine = rows.get(name)
    fix = f"run slurm_conf/qos-setup.sh --preemptor normal USER... (QOS {name})"
    if mine is None:
        return _missing("qos", f"no QOS {name!r}", fix)
    preemptors = [q["Name"] for q in qos if name in q.get("Preempt", "").split(",")]
    if mine.get("PreemptMode", "").lower() not in ("requeue", "cluster") or not preemptors:
        return _wrong("qos", f"{name}: PreemptMode={mine.get('PreemptMode') or '-'}, "
                      f"preempted by {', '.join(preemptors) or 'no QOS'}", fix)
    if not keep_qos:
        return _wrong("qos", "job_submit.lua drops the QOS (KEEP_QOS = false)",
                      "set KEEP_QOS = true in job_submit.lua")
    return _ok("qos", f"{name}: requeue, preempted by {', '.join(preemptors)}")


def check_release(version: str) -> Check:
    """Whether this MalleTrain supports the controller's Slurm release."""
    try:
        rel = SlurmRelease.parse(version)
    except ValueError:
        return _wrong("Slurm release", f"cannot read the version {version!r}",
                      "check that scontrol show config prints SLURM_VERSION")
    note = rel.support_note()
    if rel.supported:
        return _ok("Slurm release", f"{rel}: {note}")
    return _wrong("Slurm release", f"{rel}: {note}",
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
        return _wrong("hole margin", f"slurm.hole_margin_s = {margin_s:g} s is under "
                      f"bf_resolution={resolution}: tasks fitted to a planned hole may stay "
                      "pending", f"set slurm.hole_margin_s = {hole_margin_for(resolution, interval)} "
                      "in malletrain.toml")
    return _ok("hole margin", f"{margin_s:g} s off every planned hole (bf_resolution="
                              f"{resolution}, bf_interval={interval})")


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
        return _wrong("grant timeout", f"slurm.grant_timeout_s = {timeout_s:g} s is under the "
                      f"{need} s a released task may need (bf_interval={interval}, "
                      f"batch_sched_delay={delay}, KillWait={wait}, +10 s): grants that would "
                      "start are taken back", f"set slurm.grant_timeout_s = {need} in "
                      "malletrain.toml")
    return _ok("grant timeout", f"a grant not running after {timeout_s:g} s is taken back and "
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
            return [_wrong("slurmctld", f"scontrol show config failed: {exc}",
                           "start slurmctld, or point SLURM_CONF at the cluster's slurm.conf")]
        conf_path = Path(conf.get("SLURM_CONF", "/etc/slurm/slurm.conf"))
        out = [_ok("slurmctld", f"Slurm {conf.get('SLURM_VERSION', '?')}, {conf_path}"),
               check_release(conf.get("SLURM_VERSION", ""))]
        out.append(self._path())
        try:
            file_conf = parse_slurm_conf(conf_path.read_text(errors="replace"))
        except OSError as exc:
            file_conf = {}
            out.append(_wrong("slurm.conf", f"cannot read {conf_path}: {exc.strerror}",
                              "run the check on the controller, as root or SlurmUser"))
        else:
            stale = [k for k in ("JobSubmitPlugins", "EpilogSlurmctld", "PreemptType",
                                 "PreemptMode", "MaxArraySize", "MaxJobCount")
                     if k.lower() in file_conf and conf.get(k, "") != file_conf[k.lower()]
                     and not (k == "JobSubmitPlugins" and "lua" in conf.get(k, "")
                              and "lua" in file_conf[k.lower()])]
            if stale:
                out.append(_wrong("slurm.conf", f"{conf_path} differs from the running "
                                  f"slurmctld in {', '.join(stale)}",
                                  "scontrol reconfigure (restart slurmctld for PreemptType "
                                  "and JobSubmitPlugins)"))
            else:
                out.append(_ok("slurm.conf", f"{conf_path} matches the running slurmctld"))
        plugins = [p.strip().removeprefix("job_submit/") for p in
                   conf.get("JobSubmitPlugins", "").split(",")]
        if "lua" in plugins:
            out.append(_ok("JobSubmitPlugins", conf["JobSubmitPlugins"]))
        else:
            out.append(_missing("JobSubmitPlugins", "lua is not loaded: elastic submissions "
                                "are not converted", "add JobSubmitPlugins=lua to slurm.conf "
                                "and restart slurmctld"))
        lua_path = conf_path.parent / "job_submit.lua"
        lua: dict[str, str] = {}
        if not lua_path.is_file():
            out.append(_missing("job_submit.lua", f"{lua_path} does not exist",
                                f"copy plugin/job_submit.lua to {lua_path}"))
        else:
            text = lua_path.read_text(errors="replace")
            module = conf_path.parent / "malletrain.lua"
            if LUA_MARKER not in text and re.search(r"require\s*\(?\s*[\"']malletrain[\"']",
                                                    text) and module.is_file():
                lua_path, text = module, module.read_text(errors="replace")  # a site's script
            if LUA_MARKER not in text:
                out.append(_wrong("job_submit.lua", f"{lua_path} is not MalleTrain's",
                                  "merge plugin/job_submit.lua into your job_submit.lua, or "
                                  "install it as malletrain.lua beside it and require it "
                                  "(docs/site-integration.md)"))
            else:
                lua = lua_settings(text)
                out.append(_ok("job_submit.lua", f"{lua_path} (" + ", ".join(
                    f"{k}={v}" for k, v in sorted(lua.items())) + ")"))
        slurm_uid = _uid_of(conf.get("SlurmUser", ""))
        trusted = {0} if slurm_uid is None else {0, slurm_uid}
        out.append(check_epilog(conf.get("EpilogSlurmctld", "(null)"), trusted))
        prolog = conf.get("PrologSlurmctld", "(null)")
        out.append(_ok("PrologSlurmctld", "not set") if prolog in NULL else _wrong(
            "PrologSlurmctld", f"{prolog}: Slurm delays every job start until it returns",
            "remove PrologSlurmctld from slurm.conf (MalleTrain needs none)"))
        out.extend(self._preemption(conf, lua))
        out.extend(self._headroom(conf, lua))
        out.append(check_hole_margin(conf.get("SchedulerParameters", ""),
                                     self.config.slurm.hole_margin_s))
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
            return _wrong("Slurm path", line, "build a pyslurm of the cluster's MAJOR.MINOR "
                          "for that Python, or set slurm.pyslurm = \"auto\" or \"off\"")
        return _ok("Slurm path", line)

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
            out.append(_wrong("daemon partition", f"job_submit.lua sends tasks to "
                              f"{lua['PARTITION']!r}, malletraind polls "
                              f"{self.config.slurm.partition!r}", "set slurm.partition in "
                              "malletrain.toml to the job_submit.lua PARTITION"))
        return out

    def _headroom(self, conf: Mapping[str, str], lua: Mapping[str, str]) -> list[Check]:
        hi = _int(lua.get("MAX_NODES")) or 1000
        out = []
        array = _int(conf.get("MaxArraySize"))
        if array is None or array < hi + 1:
            out.append(_wrong("MaxArraySize", f"{array}: an elastic job of {hi} nodes needs "
                              f"{hi} array tasks", f"set MaxArraySize={hi + 1} (or lower "
                              "MAX_NODES in job_submit.lua)"))
        else:
            out.append(_ok("MaxArraySize", f"{array} > MAX_NODES {hi}"))
        count = _int(conf.get("MaxJobCount"))
        try:
            queued = len(self._run(["squeue", "--noheader", "--array", "--all",
                                    "--format=%i"]).split())
        except CommandError:
            queued = 0
        if count is None or count - queued < hi:
            out.append(_wrong("MaxJobCount", f"{count} with {queued} jobs and tasks queued: "
                              f"no room for one {hi}-node elastic job",
                              f"raise MaxJobCount to at least {queued + 2 * hi}"))
        else:
            out.append(_ok("MaxJobCount", f"{count}, {queued} queued: room for "
                                          f"{(count - queued) // hi} elastic job(s) of {hi}"))
        return out


def format_checks(checks: Sequence[Check], bold: bool = False) -> str:
    """One line per check: status, name, detail and, if not OK, the fix."""
    width = max([len(c.check) for c in checks] + [0])
    lines = []
    for c in checks:
        status = f"\033[1m{c.status:<8}\033[0m" if bold and not c.ok else f"{c.status:<8}"
        line = f"{status}{c.check:<{width}}  {c.detail}"
        lines.append(line + (f"; fix: {c.fix}" if c.fix else ""))
    return "\n".join(lines)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``admin`` and its ``check`` sub-command."""
    admin = subparsers.add_parser("admin", help=HELP, description=HELP + ".")
    sub = admin.add_subparsers(dest="admin_command", metavar="ACTION", required=True)
    check = sub.add_parser("check", help="check slurm.conf, preemption, QOS, hooks and "
                           "MaxArraySize/MaxJobCount headroom on the live cluster",
                           description=CHECK_DESCRIPTION)
    check.add_argument("--config", metavar="FILE", help="malletrain.toml (for slurm.bin_dir, "
                       "slurm.partition, slurm.command_timeout_s)")
    check.add_argument("--json", action="store_true", help="print the checks as JSON")
    check.set_defaults(func=run_check)
    for name, text in (("drain", DRAIN_DESCRIPTION), ("resume", RESUME_DESCRIPTION)):
        cmd = sub.add_parser(name, help=text.split(":")[0], description=text)
        client.add_connection_args(cmd)
        cmd.add_argument("--json", action="store_true", help="print the daemon's answer as JSON")
        cmd.set_defaults(func=run_switch, switch=name)
    from .whatif import register_admin  # its own module: the simulator's imports stay lazy
    register_admin(sub)


def runner_for(config: Config, env: Mapping[str, str] | None = None) -> CommandRunner:
    env = dict(os.environ if env is None else env)
    if config.slurm.bin_dir:
        env["PATH"] = f"{config.slurm.bin_dir}:{env.get('PATH', '')}"
    env.pop("SLURM_TIME_FORMAT", None)
    return CommandRunner(timeout_s=config.slurm.command_timeout_s, env=env)


@exit_one
def run_switch(args: argparse.Namespace) -> int:
    """``admin drain`` / ``admin resume``: ask the daemon, say what it did."""
    answer = client.call(args, args.switch)
    if args.json:
        print_json(answer)
    elif args.switch == "drain":
        print("MalleTrain drained: every elastic job is being shrunk to zero and gets no "
              "node until 'malletrain admin resume'" if answer.get("changed") else
              "MalleTrain was already drained; 'malletrain admin resume' ends it")
    else:
        print("MalleTrain resumed: idle nodes are offered to the jobs again"
              if answer.get("changed") else "MalleTrain was not drained: nothing to resume")
    return 0


@exit_one
def run_check(args: argparse.Namespace) -> int:
    """Run every check, print them, exit 1 unless all are OK."""
    config = load(args.config)
    if config.daemon.batch_system == "pbs":
        from .admin_pbs import PbsChecker  # noqa: PLC0415 - it imports this module
        env = dict(os.environ)
        if config.pbs.bin_dir:
            env["PATH"] = f"{config.pbs.bin_dir}:{env.get('PATH', '')}"
        checks = PbsChecker(CommandRunner(timeout_s=config.pbs.command_timeout_s, env=env),
                            config).checks()
    elif config.daemon.batch_system != "slurm":
        raise CliError(f"admin check knows Slurm and PBS, and daemon.batch_system is "
                       f"{config.daemon.batch_system!r}")
    else:
        checks = SlurmChecker(runner_for(config), config).checks()
    ok = all(c.ok for c in checks)
    if args.json:
        print_json({"ok": ok, "checks": [asdict(c) for c in checks]})
    else:
        print(format_checks(checks, bold=styled(sys.stdout)))
    return 0 if ok else 1
