"""The stable run id of a MalleTrain job (for W&B / MLflow resume)."""

from __future__ import annotations

from malletrain_core.wire.orders import Order
from malletrain_core.worker import launcher, runid


def test_run_id_depends_on_the_job_only() -> None:
    env = {"SLURM_CLUSTER_NAME": "big cluster", "SLURM_ARRAY_JOB_ID": "123"}
    assert runid.for_job("123", env) == "mt-big_cluster-123"
    assert runid.derive("123") == "mt-123"
    assert runid.run_id(env) == "mt-big_cluster-123"
    assert runid.run_id({}) == "local"
    assert runid.for_job("123", {**env, "MALLETRAIN_RUN_ID": "mine"}) == "mine"


def test_launcher_gives_every_epoch_the_same_run_id() -> None:
    base = {"SLURM_CLUSTER_NAME": "c1", "PATH": "/bin"}
    ids = set()
    for epoch, world in ((1, 2), (2, 3), (7, 1)):
        order = Order.from_dict({"kind": "run", "epoch": epoch, "world": world, "rank": 0,
                                 "master": "127.0.0.1", "port": 1234, "rdzv_id": f"r{epoch}"})
        env = launcher.worker_env(base, "4242", order, "0" * 64, "127.0.0.1:1", "/c", "/d")
        ids.add(env[runid.ENV_RUN_ID])
    assert ids == {"mt-c1-4242"}
