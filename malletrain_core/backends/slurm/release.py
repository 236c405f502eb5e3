"""Which Slurm release the backend talks to, and what differs between releases: in one place.

The backend reads formatted ``squeue``/``sinfo`` text, which is the same on every release
MalleTrain was tested with (22.05, 24.11, 25.11, 26.05; see ``make test-matrix``). What differs:

* ``scontrol show job -o``: 24.11 prints ``ReqTRES=``/``AllocTRES=`` instead of ``TRES=``,
  and ``NumNodes=1-1`` on held jobs; 25.11 adds ``SubmitLine=`` (the command line, with
  spaces), which :func:`~malletrain_core.backends.slurm.parse.parse_scontrol_show_job` reads.
* ``squeue -t PD --start -o %i``: 25.11 folds the pending tasks of an array into one line
  (``1_[0-2]``) where 22.05 and 24.11 print one line per task; the plan is keyed by the array
  id (``%F``), so the hole ends read the same.
* ``scontrol show config``: from 24.11 on, keys that take several scripts are printed once
  per script, ``EpilogSlurmctld[0] = ...``.
* ``--json``: 22.05 is openapi v0.0.38 and ``squeue --json`` ignores ``-t/-p/-j``; from
  24.11 on the data_parser schema (state lists, ``{"set","infinite","number"}`` numbers) and
  the filters work. The backend does not use JSON.
* slurmd from 24.05 on needs cgroups or ``CgroupPlugin=disabled`` (the local cluster).
* 26.05 (its RELEASE_NOTES and CHANGELOG):

  - the errors of the update and requeue RPCs name array tasks as job lists, ``1_[7-8]:
    Invalid job id specified`` where earlier releases print ``1_7-8``: the batched
    hold/release/requeuehold failures are read in both forms
    (:func:`~malletrain_core.backends.slurm.parse.parse_scontrol_errors`);
  - every job has a SLUID (``step_id.sluid`` in ``--json``, ``sluid`` in ``sacct --json``;
    cgroup v2 paths are keyed by it) and the C API takes ``slurm_step_id_t``: the backend
    names tasks ``ARRAY_INDEX`` in commands, reads no cgroup path, and the formatted
    ``squeue``/``sinfo`` text it reads is unchanged;
  - backfill no longer undoes a ``TimeLimit`` update made while a cycle runs: earlier, a
    grow's ``TimeLimit`` could be put back to the task's previous limit (a longer one:
    the task is then preempted by the job planned after its hole instead of ending at its
    limit); the grow is the same command on every release;
  - an invalid ``--requeue=`` argument is an sbatch error (``job_submit.lua`` sets the
    descriptor's ``requeue``, not the option);
  - jobs print ``Exclusive=NODE`` (partition ``Exclusive=`` replaces ``ExclusiveUser``);
    ``OverSubscribe=EXCLUSIVE`` on the preemptable partition still works;
  - no pyslurm exists for it: another release's pyslurm is refused
    (:func:`~malletrain_core.backends.slurm.pyslurm_reader.choose`) and the commands used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...errors import CommandError
from ...runner import CommandRunner

TESTED = ("22.05", "24.11", "25.11", "26.05")
"""Releases the real-Slurm contract tests pass on (``make test`` and ``make test-matrix``)."""
OLDEST = (22, 5)
NEWEST = (26, 5)


@dataclass(frozen=True, order=True)
class SlurmRelease:
    """A Slurm version, e.g. ``24.11.5``."""

    major: int
    minor: int
    micro: int = 0

    @classmethod
    def parse(cls, text: str) -> SlurmRelease:
        """``slurm 24.11.5``, ``24.11.5``, ``25.11.0-0rc1`` → a release; ValueError if none."""
        m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
        if m is None:
            raise ValueError(f"no Slurm version in {text.strip()[:80]!r}")
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))

    @property
    def series(self) -> str:
        """``MAJOR.MINOR``: what pyslurm's version must match."""
        return f"{self.major:02d}.{self.minor:02d}"

    def __str__(self) -> str:
        return f"{self.series}.{self.micro}"

    # ---------------------------------------------------------------- support
    @property
    def tested(self) -> bool:
        return self.series in TESTED

    @property
    def supported(self) -> bool:
        """Within the span of tested releases (those between are not tested, but nothing the
        backend reads changed across that span)."""
        return OLDEST <= (self.major, self.minor) <= NEWEST

    def support_note(self) -> str:
        """One phrase for ``admin check``."""
        if self.tested:
            return "tested with this MalleTrain"
        if self.supported:
            return f"supported, not tested (tested: {', '.join(TESTED)})"
        if (self.major, self.minor) < OLDEST:
            return f"older than {TESTED[0]}, not supported"
        return f"newer than {TESTED[-1]}, not tested with this MalleTrain"

    # ---------------------------------------------------------------- behaviour
    @property
    def json_filters(self) -> bool:
        """``squeue --json`` honours ``-t/-p/-j`` (22.05 ignores them)."""
        return (self.major, self.minor) >= (24, 5)

    @property
    def needs_cgroup_disabled(self) -> bool:
        """slurmd aborts without a mounted cgroup fs unless ``CgroupPlugin=disabled``."""
        return (self.major, self.minor) >= (24, 5)

    @property
    def submit_line(self) -> bool:
        """``scontrol show job`` prints ``SubmitLine=`` (free text with spaces)."""
        return (self.major, self.minor) >= (25, 11)


def detect(runner: CommandRunner) -> SlurmRelease:
    """The release of the Slurm commands ``runner`` runs (``scontrol --version``, no RPC)."""
    res = runner.run(["scontrol", "--version"])
    try:
        return SlurmRelease.parse(res.stdout)
    except ValueError as exc:
        raise CommandError(["scontrol", "--version"], res.returncode, res.stdout, res.stderr,
                           f"{exc}: is scontrol Slurm's?") from None
