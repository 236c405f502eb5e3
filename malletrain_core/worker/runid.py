"""One stable run id per MalleTrain job, for experiment trackers.

``malletrain-run`` sets ``MALLETRAIN_RUN_ID`` for the workers. It is derived from the job's
identity alone (the cluster's name and the job id), so it is the same in every epoch, after
a requeue and after a daemon restart, and a tracker resumes the same run::

    wandb.init(id=os.environ["MALLETRAIN_RUN_ID"], resume="allow")
    mlflow.start_run(run_name=...)   # MLflow ids are its own: look the run up by a tag
                                     # malletrain_run_id=$MALLETRAIN_RUN_ID, create it if absent

A run id set by the user (``export MALLETRAIN_RUN_ID=...`` in the batch script) is kept.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from .identity import job_variable

ENV_RUN_ID = "MALLETRAIN_RUN_ID"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


def derive(job: str, cluster: str = "") -> str:
    """The run id of ``job`` on ``cluster``: ``mt-<cluster>-<job>``, letters, digits, ``-``
    and ``_`` only (what W&B accepts as a run id)."""
    parts = ["mt", cluster, job]
    return "-".join(_UNSAFE.sub("_", p).strip("_") for p in parts if p)


def for_job(job: str, env: Mapping[str, str]) -> str:
    """The id the launcher hands to the workers of ``job``: the user's if set, else derived."""
    given = env.get(ENV_RUN_ID, "").strip()
    if given:
        return given
    return derive(job, job_variable(env, "cluster"))


def run_id(env: Mapping[str, str] | None = None) -> str:
    """This worker's run id (``MALLETRAIN_RUN_ID``); outside MalleTrain, one from the job
    environment if any, else ``"local"``."""
    env = os.environ if env is None else env
    given = env.get(ENV_RUN_ID, "").strip()
    if given:
        return given
    job = job_variable(env, "job")
    return for_job(job, env) if job else "local"
