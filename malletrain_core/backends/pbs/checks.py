"""``malletrain admin check`` on a PBS server: the steps of docs/pbs.md, checked one by one.

It asks the server (``qstat -B -f -F json``, ``qstat -Q -f -F json``, ``qmgr -c "list hook"``,
``qmgr -c "export hook ..."``, ``qmgr -c "list sched"``) and reads the scheduler's
``sched_config``, and returns one verdict per check: OK, WARN (works, with a limit said),
MISSING or WRONG with the one command that fixes it. Run it on the PBS server host as root or
a PBS manager.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...config import Config
from ...errors import CommandError
from ...runner import CommandRunner, with_bin_dir
from ..checks import Check, missing, ok, warn, wrong

HOOK_MARKER = "MalleTrain's PBS hooks"
ENTRY_QUEUE = "malletrain"
SOFT_LIMIT = "[o:PBS_ALL=0]"
MAX_KILL_DELAY_S = 10
PBS_DEFAULT_KILL_DELAY_S = 10
INSTALL = "run pbs_hooks/install.sh (docs/pbs.md, Install step 3)"
HOOKS = {  # name: the events install.sh gives it
    "mt_queuejob": "queuejob",
    "mt_periodic": "periodic",
    "mt_modifyvnode": "modifyvnode",
    "mt_jobobit": "jobobit",
    "mt_postqueuejob": "postqueuejob",
    "mt_modifyjob": "modifyjob,movejob",
    "mt_epilogue": "execjob_preterm,execjob_epilogue",
}
LAUNCH_HOOK = ("mt_launch", "execjob_launch")


def parse_qmgr_list(text: str) -> dict[str, dict[str, str]]:
    """``qmgr -c "list hook"`` / ``"list sched"`` → {object name: {attribute: value}}; an
    attribute continued on indented lines (a long event list) is joined."""
    out: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    last = ""
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            head = line.split(None, 1)
            current = out.setdefault(head[1].strip() if len(head) > 1 else head[0], {})
            continue
        if current is None:
            continue
        key, sep, value = line.strip().partition(" = ")
        if sep:
            last = key.strip()
            current[last] = value.strip()
        elif last:
            current[last] += line.strip()
    return out


def sched_setting(text: str, name: str) -> str | None:
    """The value of ``name`` in a sched_config (``name: value [prime|non_prime|all]``)."""
    found = None
    for line in text.splitlines():
        m = re.match(rf"^\s*{re.escape(name)}\s*:\s*(\S+)", line)
        if m:
            found = m.group(1).strip('"')
    return found


def check_queue(name: str, queues: Mapping[str, Mapping[str, Any]]) -> list[Check]:
    """The stopped execution queue where workers wait and run."""
    q = queues.get(name)
    if q is None:
        return [missing(f"queue {name}", "does not exist",
                         f'qmgr -c "create queue {name} queue_type = execution" (then the other '
                         "settings of docs/pbs.md, Install step 1)")]
    problems = []
    if str(q.get("queue_type", "")).lower() != "execution":
        problems.append((f"is a {q.get('queue_type')} queue", f'qmgr -c "delete queue {name}" '
                         f'and create it with queue_type = execution'))
    if str(q.get("enabled")) != "True":
        problems.append(("is not enabled", f'qmgr -c "set queue {name} enabled = true"'))
    if str(q.get("started")) != "False":
        problems.append(("is started, so PBS's scheduler would start workers itself",
                         f'qmgr -c "set queue {name} started = false"'))
    if str(q.get("max_run_soft", "")) != SOFT_LIMIT:
        problems.append((f"max_run_soft is {q.get('max_run_soft', 'unset')}, so regular jobs "
                         "cannot preempt its workers", f'qmgr -c "set queue {name} '
                         f'max_run_soft = {SOFT_LIMIT}"'))
    kill_delay = int(q.get("kill_delay", PBS_DEFAULT_KILL_DELAY_S))
    if kill_delay > MAX_KILL_DELAY_S:
        problems.append((f"kill_delay is {kill_delay} s, and every preempting job waits for it",
                         f'qmgr -c "set queue {name} kill_delay = 2"'))
    if problems:
        return [wrong(f"queue {name}", detail, fix) for detail, fix in problems]
    return [ok(f"queue {name}", f"execution, enabled, stopped, max_run_soft {SOFT_LIMIT}, "
                                 f"kill_delay {kill_delay} s")]


def check_entry_queue(name: str, target: str,
                      queues: Mapping[str, Mapping[str, Any]]) -> Check:
    q = queues.get(name)
    if q is None:
        return missing(f"queue {name}", "the entry queue users submit to does not exist",
                        f'qmgr -c "create queue {name} queue_type = route" (then docs/pbs.md, '
                        "Install step 1)")
    dests = [d.strip().split("@", 1)[0] for d in str(q.get("route_destinations", "")).split(",")]
    if str(q.get("queue_type", "")).lower() != "route" or target not in dests:
        return wrong(f"queue {name}", f"must be a route queue to {target}", f'qmgr -c "set '
                      f'queue {name} route_destinations = {target}"')
    if str(q.get("enabled")) != "True" or str(q.get("started")) != "True":
        return wrong(f"queue {name}", "is not enabled and started",
                      f'qmgr -c "set queue {name} enabled = true"; qmgr -c "set queue {name} '
                      'started = true"')
    return ok(f"queue {name}", f"route queue to {target}, enabled, started")


def check_hook(name: str, events: str, hooks: Mapping[str, Mapping[str, str]],
               script: str | None, hook_config: Mapping[str, Any] | None,
               socket: str) -> Check:
    attrs = hooks.get(name)
    if attrs is None:
        return missing(f"hook {name}", "not installed", INSTALL)
    if attrs.get("enabled") != "true":
        return wrong(f"hook {name}", "disabled", f'qmgr -c "set hook {name} enabled = true"')
    if set(attrs.get("event", "").split(",")) != set(events.split(",")):
        return wrong(f"hook {name}", f"bound to {attrs.get('event')}, not {events}", INSTALL)
    if script is None or HOOK_MARKER not in script:
        return wrong(f"hook {name}", "its script is not MalleTrain's pbs_hooks/malletrain_pbs.py",
                      INSTALL)
    if hook_config is None:
        return wrong(f"hook {name}", "has no readable config file", INSTALL)
    if socket and hook_config.get("socket") != socket:
        return wrong(f"hook {name}", f"sends to {hook_config.get('socket')}, but the daemon "
                      f"listens on {socket}", f"pbs_hooks/install.sh --socket {socket}")
    extra = f", freq {attrs['freq']} s" if "freq" in attrs else ""
    return ok(f"hook {name}", f"enabled, {events}, order {attrs.get('order', '?')}, "
                               f"alarm {attrs.get('alarm', '?')} s{extra}")


def check_preemption(sched: Mapping[str, str], sched_config: str | None) -> list[Check]:
    order = sched.get("preempt_order", "SCR").strip('"').split()
    out = []
    if not order or order[0] != "R":
        out.append(wrong("preempt_order", f"{' '.join(order)}: preempted workers must be "
                          "requeued (a suspended worker keeps its node)",
                          "qmgr -c 'set sched preempt_order = \"R\"'"))
    else:
        out.append(ok("preempt_order", "R: preempted workers are requeued"))
    prio = [p.strip() for p in sched.get("preempt_prio", "").strip('"').split(",")]
    if "queue_softlimits" not in prio:
        out.append(wrong("preempt_prio", f"{', '.join(prio)}: regular jobs cannot preempt "
                          "MalleTrain's workers and would wait behind them",
                          "qmgr -c 'set sched preempt_prio = \"express_queue, normal_jobs, "
                          "queue_softlimits\"'"))
    else:
        out.append(ok("preempt_prio", ", ".join(prio)))
    strict = sched_setting(sched_config, "strict_ordering") if sched_config else None
    if strict is None:
        out.append(warn("strict_ordering", "sched_config unreadable here: hole ends unknown",
                         "run admin check on the server host as root"))
    elif strict.lower() != "true":
        out.append(warn("strict_ordering", "false: PBS estimates no start times, so idle "
                         "nodes are lent without a known end (preemption still protects the "
                         "main queue)", "strict_ordering: true ALL in sched_config, then HUP "
                         "pbs_sched"))
    else:
        out.append(ok("strict_ordering", "true: top jobs get estimated start times"))
    return out


class PbsChecker:
    """Runs the checks against the PBS server the runner's environment points at."""

    def __init__(self, runner: CommandRunner, config: Config) -> None:
        self.runner = runner
        self.config = config

    def _json(self, argv: list[str]) -> dict[str, Any]:
        return dict(json.loads(self.runner.run(argv).stdout))

    def _qmgr(self, directive: str) -> str | None:
        try:
            return self.runner.run(["qmgr", "-c", directive]).stdout
        except CommandError:
            return None

    def checks(self) -> list[Check]:
        try:
            server = self._json(["qstat", "-B", "-f", "-F", "json"])
            queues = self._json(["qstat", "-Q", "-f", "-F", "json"]).get("Queue", {})
        except (CommandError, ValueError) as exc:
            why = f"qstat failed: {exc}" if isinstance(exc, CommandError) else \
                "qstat -F json printed no JSON (is this PBS older than 19.1?)"
            return [wrong("pbs_server", why, "start pbs_server, or put the PBS commands on "
                           "PATH ([pbs] bin_dir in malletrain.toml)")]
        out = [ok("pbs_server", f"{server.get('pbs_server', '?')}, PBS "
                                 f"{server.get('pbs_version', '?')}")]
        queue = self.config.pbs.queue
        out += check_queue(queue, queues)
        out.append(check_entry_queue(ENTRY_QUEUE, queue, queues))
        hooks = parse_qmgr_list(self._qmgr("list hook") or "")
        socket = self.config.daemon.hook_socket
        wanted = dict(HOOKS)
        if self.config.pbs.job_key_file:
            wanted[LAUNCH_HOOK[0]] = LAUNCH_HOOK[1]
        for name, events in wanted.items():
            script = config = None
            if name in hooks:
                script = self._qmgr(f"export hook {name} application/x-python default")
                try:
                    config = json.loads(self._qmgr(
                        f"export hook {name} application/x-config default") or "")
                except ValueError:
                    config = None
            out.append(check_hook(name, events, hooks, script, config, socket))
        sched = next(iter(parse_qmgr_list(self._qmgr("list sched") or "").values()), {})
        sched_config = None
        if sched.get("sched_priv"):
            try:
                sched_config = (Path(sched["sched_priv"]) / "sched_config").read_text()
            except OSError:
                sched_config = None
        out += check_preemption(sched, sched_config)
        return out


def admin_checks(config: Config) -> list[Check]:
    """Every check against the PBS server that ``pbs.bin_dir``'s commands reach."""
    return PbsChecker(with_bin_dir(config.pbs.bin_dir, config.pbs.command_timeout_s),
                      config).checks()
