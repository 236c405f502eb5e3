"""Which job, task and node a worker stands for, read from its batch system's environment.

One reader per batch system, tried in turn by :func:`identity_from_env`; this module runs in the
job on the compute node and imports nothing from the daemon or the backends. The ids are the
ones the backends use:

* **Slurm**: the array job id (``SLURM_ARRAY_JOB_ID``, else ``SLURM_JOB_ID``), the array task
  id (``SLURM_ARRAY_TASK_ID``, else ``0``), the node (``SLURMD_NODENAME``, else the host name).
* **PBS** (OpenPBS 23.06, read in a real subjob's environment): the array id
  (``PBS_ARRAY_ID``, e.g. ``5[].pbsserver``, else ``PBS_JOBID``), the index
  (``PBS_ARRAY_INDEX``, else ``0``), the node from the first line of ``PBS_NODEFILE`` (the
  mother superior, e.g. ``n04``; the host name is not used: hosts that share a kernel name,
  like the test harness's network namespaces, all report the same one). PBS_NODEFILE names
  hosts: on a mom with several vnodes it is the host, not the vnode.

The other job variables the worker side reads (the cluster's name, the submission folder) are
in :data:`JOB_VARIABLES`, so this module is the worker's whole knowledge of batch systems.

``python -m malletrain_core.worker.identity`` prints the identity as JSON (what the real-PBS
tests run inside a job).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

from ..errors import MalleTrainError


@dataclass(frozen=True)
class Identity:
    """Which job, array task and node this worker stands for, and under which batch system."""

    job: str
    task: str
    node: str
    batch_system: str = "slurm"


def _short_host() -> str:
    return socket.gethostname().split(".")[0]


def _index(value: str, name: str) -> str:
    if not value.isdigit():
        raise MalleTrainError(f"{name}={value!r} is not an array index; malletrain-run must run "
                              "as a task of the job MalleTrain started, not by hand")
    return value


def from_slurm(env: Mapping[str, str]) -> Identity | None:
    """The Slurm task's identity, or None when this is not a Slurm job."""
    job = env.get("SLURM_ARRAY_JOB_ID") or env.get("SLURM_JOB_ID")
    if not job:
        return None
    task = _index(env.get("SLURM_ARRAY_TASK_ID", "0"), "SLURM_ARRAY_TASK_ID")
    return Identity(job=job, task=task, node=env.get("SLURMD_NODENAME") or _short_host(),
                    batch_system="slurm")


def from_pbs(env: Mapping[str, str]) -> Identity | None:
    """The PBS subjob's identity, or None when this is not a PBS job."""
    job_id = env.get("PBS_JOBID")
    if not job_id:
        return None
    job = env.get("PBS_ARRAY_ID") or job_id
    task = _index(env.get("PBS_ARRAY_INDEX", "0"), "PBS_ARRAY_INDEX")
    nodefile = env.get("PBS_NODEFILE")
    if not nodefile:
        return Identity(job=job, task=task, node=_short_host(), batch_system="pbs")
    try:
        with open(nodefile, encoding="utf-8") as fh:
            first = fh.readline().strip()
    except OSError as exc:
        raise MalleTrainError(f"PBS_NODEFILE={nodefile}: cannot read it ({exc.strerror}); "
                              "malletrain-run must run inside the PBS job, on its node") from None
    if not first:
        raise MalleTrainError(f"PBS_NODEFILE={nodefile} is empty; malletrain-run must run "
                              "inside the PBS job, on its node")
    return Identity(job=job, task=task, node=first.split(".")[0], batch_system="pbs")


READERS: tuple[Callable[[Mapping[str, str]], Identity | None], ...] = (from_slurm, from_pbs)


@dataclass(frozen=True)
class JobVariables:
    """The other variables of a batch system's job the worker side reads, each in the order
    tried: the job id (for a run id outside ``malletrain-run``), the cluster's name (part of
    the run id) and the folder the job was submitted from (the default checkpoint folder's
    parent)."""

    job: tuple[str, ...]
    cluster: tuple[str, ...]
    submit_dir: tuple[str, ...]


JOB_VARIABLES = (
    JobVariables(job=("SLURM_ARRAY_JOB_ID", "SLURM_JOB_ID"), cluster=("SLURM_CLUSTER_NAME",),
                 submit_dir=("SLURM_SUBMIT_DIR",)),
    JobVariables(job=("PBS_JOBID",), cluster=("PBS_SERVER",), submit_dir=("PBS_O_WORKDIR",)),
)


def job_variable(env: Mapping[str, str], what: str) -> str:
    """The first non-empty ``what`` (``job``, ``cluster``, ``submit_dir``) of any batch system
    in ``env``, else ``""``."""
    return next((env[name] for table in JOB_VARIABLES for name in getattr(table, what)
                 if env.get(name)), "")


def identity_from_env(env: Mapping[str, str]) -> Identity:
    """The identity from the first reader that recognises its batch system's variables."""
    for reader in READERS:
        found = reader(env)
        if found is not None:
            return found
    raise MalleTrainError("malletrain-run must run inside a batch job (no SLURM_JOB_ID or "
                          "PBS_JOBID): submit with sbatch --qos=malletrain, or with qsub -q "
                          "malletrain -J 1-N on PBS")


def main() -> int:
    try:
        print(json.dumps(asdict(identity_from_env(os.environ))))
    except MalleTrainError as exc:
        print(f"malletrain-run: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
