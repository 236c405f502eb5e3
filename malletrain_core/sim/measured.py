"""The measured DNN scaling profiles (BFTrainer's Summit measurements) as job records.

Read from ``<shared>/data/profiles`` (see :func:`shared_dir`): ``*-JNPs-*.csv`` hold the curves
(``Ns``, ``Ps``, ``Tsub``), ``*-Jbnd-*.csv`` the bounds and costs (``Tcup``, ``Tcdw``, ``Jmin``,
``Jmax``, ``Pmax``).
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ..errors import InputFileError
from ..model import Curve

WORKLOAD_FILES = {
    "imagenet": ("ImageNet-imgps-JNPs-1001J.csv", "ImageNet-imgps-Jbnd-1001J.csv"),
    "imagenet-speedup": ("ImageNet-spdup-JNPs-1001J.csv", "ImageNet-imgps-Jbnd-1001J.csv"),
    "hpo": ("hps-shufflenet-JNPs-1000J.csv", "hps-shufflenet-Jbnd-1000J.csv"),
}


def shared_dir() -> Path:
    """The shared data folder: ``$MALLETRAIN_SHARED``, else ``../shared`` beside the checkout."""
    env = os.environ.get("MALLETRAIN_SHARED")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared"


@dataclass(frozen=True)
class ProfiledJob:
    """One measured job: its model name, true curve, bounds, costs, work and submission time."""

    name: str
    model: str
    curve: Curve
    min_nodes: int
    max_nodes: int
    scale_up_s: float
    scale_down_s: float
    work: float
    submit_time: float


def _parse_time(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()


def load_profiles(workload: str = "imagenet", directory: Path | None = None) -> list[ProfiledJob]:
    """All jobs of a workload (``imagenet``, ``imagenet-speedup``, ``hpo``), in file order."""
    if workload not in WORKLOAD_FILES:
        raise InputFileError(workload, f"unknown workload; choose one of {sorted(WORKLOAD_FILES)}")
    base = directory or shared_dir() / "data" / "profiles"
    curves_file, bounds_file = (base / f for f in WORKLOAD_FILES[workload])
    bounds: dict[str, dict[str, str]] = {}
    try:
        with open(bounds_file, newline="") as fh:
            for row in csv.DictReader(fh):
                bounds[row["job"]] = row
        jobs = []
        with open(curves_file, newline="") as fh:
            for line, row in enumerate(csv.DictReader(fh), start=2):
                try:
                    b = bounds[row["job"]]
                    name = row["job"]
                    model = name.split("-", 1)[1] if "-" in name else "shufflenet"
                    curve = Curve.of([int(float(n)) for n in json.loads(row["Ns"])],
                                     json.loads(row["Os"]), where=f"profile {name}")
                    jobs.append(ProfiledJob(
                        name=name, model=model, curve=curve,
                        min_nodes=int(float(b["Jmin"])), max_nodes=int(float(b["Jmax"])),
                        scale_up_s=float(b["Tcup"]), scale_down_s=float(b["Tcdw"]),
                        work=float(b["Pmax"]), submit_time=_parse_time(row["Tsub"])))
                except (KeyError, ValueError, json.JSONDecodeError) as exc:
                    raise InputFileError(str(curves_file), f"bad profile row: {exc}", line) from None
    except OSError as exc:
        raise InputFileError(str(exc.filename or base), f"cannot read: {exc.strerror}; set "
                             "MALLETRAIN_SHARED to the folder holding data/profiles") from None
    return jobs
