"""The process's device and the errors no new epoch can cure (a setup error, not a lost peer)."""

from __future__ import annotations

import os

CONFIG_ERRORS = (
    ("Duplicate GPU", "two ranks on one GPU: give each process its own device "
     "(LOCAL_RANK, CUDA_VISIBLE_DEVICES; malletrain-run --nproc-per-node at most the GPUs)"),
    ("invalid device ordinal", "this process's LOCAL_RANK names a GPU this node does not "
     "have: --nproc-per-node at most the visible GPUs"),
    ("ncclInvalidUsage", "NCCL refused how it was called (ncclInvalidUsage): a setup error, "
     "not a lost peer"),
    ("ncclInvalidArgument", "NCCL refused an argument (ncclInvalidArgument): a setup error, not "
     "a lost peer"),
    ("No backend type associated with device type", "a collective on a tensor of the wrong "
     "device for this group's backend (a CPU tensor on NCCL)"),
)
"""Texts of errors that no new epoch can cure: the job fails with the explanation instead of
waiting for a membership change that would meet the same error."""


def configuration_error(exc: BaseException) -> str:
    """The explanation of a setup error in ``exc`` ("" for anything else, a lost peer)."""
    text = str(exc)
    return next((why for marker, why in CONFIG_ERRORS if marker in text), "")


def bind_device() -> int:
    """Bind this process to its GPU for NCCL and return the device index: the only one
    ``CUDA_VISIBLE_DEVICES`` leaves it, else ``LOCAL_RANK`` (the launcher's local rank, or
    ``SLURM_LOCALID`` / ``PALS_LOCAL_RANKID`` where the site starts one process per GPU)."""
    import torch

    count = torch.cuda.device_count()
    if count < 1:
        raise RuntimeError("malletrain: backend nccl, but this process sees no GPU "
                           "(CUDA_VISIBLE_DEVICES, the node's driver); use --device cpu/gloo")
    local = next((int(os.environ[v]) for v in ("LOCAL_RANK", "SLURM_LOCALID",
                                                 "PALS_LOCAL_RANKID")
                  if os.environ.get(v, "").isdigit()), 0)
    index = 0 if count == 1 else local
    if index >= count:
        raise RuntimeError(f"malletrain: local rank {local} but {count} GPUs visible: "
                           "--nproc-per-node at most the GPUs of a node")
    torch.cuda.set_device(index)
    return index

