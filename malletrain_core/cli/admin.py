"""``malletrain admin``: ``check`` (is this cluster set up for MalleTrain, and if not, what is
missing), ``drain`` and ``resume``.

``check`` runs the checks of the configured batch system's registry entry
(:class:`~malletrain_core.backends.system.BatchSystem`: ``backends/slurm/checks.py``,
``backends/pbs/checks.py``) and prints one line per check: OK, WARN, MISSING or WRONG, with how
to fix it. Exit code 1 when anything is not OK.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import asdict

from ..backends import registry as backends
from ..backends.checks import Check
from ..config import load
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
CHECK_DESCRIPTION = (
    "Check the setup of daemon.batch_system. On Slurm: ask the running slurmctld (scontrol "
    "show config/partition, squeue; sacctmgr show qos under QOS preemption), read the "
    "slurm.conf it reports and the job_submit.lua beside it; run it on the controller as root "
    "or SlurmUser. On PBS: ask the server (qstat, qmgr) and read sched_config; run it on the "
    "server host as root or a PBS manager. Prints one line per check: OK, WARN, MISSING or "
    "WRONG with how to fix it. Exit code 1 when anything is not OK.")


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
    system = backends.system(config)
    if system.admin_checks is None:
        raise CliError(f"admin check has no checks for daemon.batch_system = "
                       f"{config.daemon.batch_system!r}")
    checks = system.admin_checks(config)
    ok = all(c.ok for c in checks)
    if args.json:
        print_json({"ok": ok, "checks": [asdict(c) for c in checks]})
    else:
        print(format_checks(checks, bold=styled(sys.stdout)))
    return 0 if ok else 1
