"""``malletraind`` itself on the toy batch system: one cycle grows a submitted job."""

from __future__ import annotations

from malletrain_core.backends.toy import ToyCluster
from malletrain_core.daemon import main as daemon_main


def test_one_daemon_cycle_grows_a_job_on_the_toy_cluster(tmp_path) -> None:
    state = tmp_path / "state"
    cluster = ToyCluster(state / "toy-cluster.json")
    for node in ("n1", "n2", "n3"):
        cluster.set_node(node, "free")
    job = cluster.submit(1, 2, "alice")
    path = tmp_path / "cfg.toml"
    path.write_text(f"[daemon]\nbatch_system = \"toy\"\nstate_dir = \"{state}\"\n"
                    f"hook_socket = \"{tmp_path / 'hook.sock'}\"\n"
                    f"api_socket = \"{tmp_path / 'api.sock'}\"\napi_port = 0\nmetrics_port = 0\n")
    assert daemon_main.main(["--config", str(path), "--once"]) == 0
    tasks = cluster.read().jobs[job].tasks.values()
    assert sorted(node for state, node in tasks if state == "running") == ["n1", "n2"]
    assert cluster.nodes == {"n1": "taken", "n2": "taken", "n3": "free"}
