"""The worker-side identity readers (Slurm and PBS environments); the real-PBS counterpart
runs the module inside a PBS subjob (tests/pbs_real/test_pbs_identity.py)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from malletrain_core.errors import MalleTrainError
from malletrain_core.worker.identity import (
    Identity,
    from_pbs,
    from_slurm,
    identity_from_env,
    job_variable,
)

# The variables of a real OpenPBS 23.06 subjob (qsub -J 1-3, started with qrun -H on n04).
PBS_SUBJOB = {"PBS_JOBID": "5[2].pbsserver", "PBS_ARRAY_ID": "5[].pbsserver",
              "PBS_ARRAY_INDEX": "2", "PBS_QUEUE": "mt_preemptable", "PBS_NODENUM": "0",
              "PBS_ENVIRONMENT": "PBS_BATCH"}


def nodefile(tmp_path: Path, text: str) -> str:
    path = tmp_path / "5[2].pbsserver"
    path.write_text(text)
    return str(path)


def test_pbs_subjob(tmp_path: Path) -> None:
    env = {**PBS_SUBJOB, "PBS_NODEFILE": nodefile(tmp_path, "n04\n")}
    assert identity_from_env(env) == Identity("5[].pbsserver", "2", "n04", "pbs")


def test_pbs_node_is_the_first_host_short(tmp_path: Path) -> None:
    env = {**PBS_SUBJOB, "PBS_NODEFILE": nodefile(tmp_path, "n07.cluster.example\nn07\n")}
    assert from_pbs(env) == Identity("5[].pbsserver", "2", "n07", "pbs")


def test_pbs_plain_job_is_task_zero(tmp_path: Path) -> None:
    env = {"PBS_JOBID": "17.pbsserver", "PBS_NODEFILE": nodefile(tmp_path, "n01\n")}
    assert from_pbs(env) == Identity("17.pbsserver", "0", "n01", "pbs")


def test_pbs_without_nodefile_uses_the_host_name() -> None:
    got = from_pbs({"PBS_JOBID": "17.pbsserver"})
    assert got is not None and got.node == socket.gethostname().split(".")[0]


@pytest.mark.parametrize("text, fragment", [(None, "cannot read it"), ("", "is empty")])
def test_pbs_bad_nodefile_is_a_clear_error(tmp_path: Path, text: str | None,
                                          fragment: str) -> None:
    path = nodefile(tmp_path, text) if text is not None else str(tmp_path / "missing")
    with pytest.raises(MalleTrainError, match=fragment) as err:
        from_pbs({**PBS_SUBJOB, "PBS_NODEFILE": path})
    assert "\n" not in str(err.value) and "inside the PBS job" in str(err.value)


def test_bad_array_index_is_refused(tmp_path: Path) -> None:
    with pytest.raises(MalleTrainError, match="not an array index"):
        from_pbs({**PBS_SUBJOB, "PBS_ARRAY_INDEX": "2-3",
                  "PBS_NODEFILE": nodefile(tmp_path, "n04\n")})
    with pytest.raises(MalleTrainError, match="not an array index"):
        from_slurm({"SLURM_JOB_ID": "9", "SLURM_ARRAY_TASK_ID": "x"})


def test_slurm_task() -> None:
    env = {"SLURM_ARRAY_JOB_ID": "41", "SLURM_JOB_ID": "44", "SLURM_ARRAY_TASK_ID": "3",
           "SLURMD_NODENAME": "n05"}
    assert identity_from_env(env) == Identity("41", "3", "n05", "slurm")


def test_slurm_is_read_first_and_pbs_only_when_present(tmp_path: Path) -> None:
    assert from_pbs({"SLURM_JOB_ID": "1"}) is None
    assert from_slurm(PBS_SUBJOB) is None
    both = {"SLURM_JOB_ID": "1", "SLURMD_NODENAME": "n1", **PBS_SUBJOB}
    assert identity_from_env(both).batch_system == "slurm"


def test_outside_any_job_says_how_to_submit() -> None:
    with pytest.raises(MalleTrainError) as err:
        identity_from_env({"HOME": "/root"})
    assert "sbatch --qos=malletrain" in str(err.value) and "qsub -q malletrain" in str(err.value)


def test_the_other_job_variables_come_from_the_same_module() -> None:
    """Run ids and the default checkpoint folder read the job's variables here (worker/runid.py
    and the launcher once read SLURM_*/PBS_* themselves): Slurm's first, then PBS's."""
    slurm = {"SLURM_JOB_ID": "7", "SLURM_ARRAY_JOB_ID": "6", "SLURM_CLUSTER_NAME": "big",
             "SLURM_SUBMIT_DIR": "/home/a"}
    pbs = {"PBS_JOBID": "5[2].srv", "PBS_SERVER": "srv", "PBS_O_WORKDIR": "/home/b"}
    assert [job_variable(slurm, w) for w in ("job", "cluster", "submit_dir")] == \
        ["6", "big", "/home/a"]
    assert [job_variable(pbs, w) for w in ("job", "cluster", "submit_dir")] == \
        ["5[2].srv", "srv", "/home/b"]
    assert job_variable({**pbs, **slurm}, "cluster") == "big"
    assert job_variable({"SLURM_CLUSTER_NAME": ""}, "cluster") == ""
