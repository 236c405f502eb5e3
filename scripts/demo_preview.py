"""A short live preview on a real local Slurm cluster (what ``make demo`` runs for now).

It starts an 8-node local Slurm cluster and ``malletraind``, submits two elastic jobs with
``sbatch --qos=malletrain``, then production jobs that preempt them, and prints the cluster as
Slurm sees it every two seconds: which nodes run production work, which MalleTrain harvests,
which stay idle. The elastic tasks here are stand-in ``sleep`` workers (the daemon does not
yet host the launcher API that real training epochs need). The summary is computed from
Slurm's own view (squeue samples), not the daemon's plan, and saved as JSON.

    python3 scripts/demo_preview.py [--out demo-output] [--duration-s 60]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from malletrain_core.localcluster import LocalCluster  # noqa: E402

NODES = 8
PROD_PLAN = [  # (start second, nodes, run seconds)
    (12, 3, 10), (20, 6, 8), (34, 2, 12), (44, 5, 6)]


def snapshot(cluster: LocalCluster) -> dict[str, str]:
    """node → 'prod' | 'harvest:<job>' from squeue (running jobs only)."""
    out = cluster.run(["squeue", "-h", "-t", "R", "-o", "%P|%F|%N"]).stdout
    nodes: dict[str, str] = {}
    for line in out.splitlines():
        part, array, nodelist = line.split("|")
        names = cluster.run(["scontrol", "show", "hostnames", nodelist]).stdout.split() \
            if nodelist else []
        for n in names:
            nodes[n] = "prod" if part == "prod" else f"harvest:{array}"
    return nodes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="demo-output")
    parser.add_argument("--duration-s", type=float, default=60.0)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="malletrain-demo-"))
    cluster = LocalCluster(nodes=NODES, root=work / "cluster")
    print(f"starting an {NODES}-node local Slurm cluster in {work} ...", flush=True)
    report = cluster.start()
    print(f"  ready in {report.total_s:.2f} s", flush=True)
    cfg = work / "malletrain.toml"
    cfg.write_text(f"""[daemon]
state_dir = "{work / 'state'}"
hook_socket = "{cluster.hook_socket}"
api_socket = "{work / 'api.sock'}"
poll_interval_s = 1.0
metrics_port = 0
api_port = 0
[profiler]
window_s = 4.0
""")
    env = cluster.env
    daemon = subprocess.Popen([sys.executable, "-m", "malletrain_core.daemon", "--config",
                               str(cfg)], env=env, stdout=open(work / "daemon.log", "w"),
                              stderr=subprocess.STDOUT)
    samples: list[tuple[float, dict[str, str]]] = []
    prod_delays: list[float] = []
    try:
        jobs = [cluster.sbatch("--qos=malletrain", "-N", lo_hi, "-o", "/dev/null",
                               "--wrap", "sleep 3600") for lo_hi in ("1-4", "2-6")]
        print(f"submitted elastic jobs {', '.join(jobs)} (sbatch --qos=malletrain -N 1-4 / 2-6)")
        t0 = time.monotonic()
        pending = list(PROD_PLAN)
        submitted: dict[str, float] = {}
        while time.monotonic() - t0 < args.duration_s:
            now = time.monotonic() - t0
            while pending and pending[0][0] <= now:
                _, n, run_s = pending.pop(0)
                jid = cluster.sbatch("-p", "prod", "-N", str(n), "-o", "/dev/null",
                                     "--wrap", f"sleep {run_s}")
                submitted[jid] = time.monotonic()
                print(f"  [{now:5.1f}s] prod job {jid} submitted on {n} nodes")
            state = snapshot(cluster)
            for jid in list(submitted):
                if cluster.run(["squeue", "-h", "-j", jid, "-t", "R", "-o", "%i"],
                               check=False).stdout.strip():
                    prod_delays.append(time.monotonic() - submitted.pop(jid))
            samples.append((now, state))
            prod = sum(v == "prod" for v in state.values())
            harvest = {j: sum(v == f"harvest:{j}" for v in state.values()) for j in jobs}
            idle = NODES - len(state)
            print(f"  [{now:5.1f}s] prod {prod}  harvested {sum(harvest.values())} "
                  f"({', '.join(f'job {j}: {k}' for j, k in harvest.items())})  idle {idle}",
                  flush=True)
            time.sleep(2.0)
    finally:
        daemon.terminate()
        daemon.wait(timeout=10)
        cluster.stop()
    idle_s = harvested_s = 0.0
    for (t, state), (t_next, _) in zip(samples, samples[1:]):
        dt = t_next - t
        free = NODES - sum(v == "prod" for v in state.values())
        idle_s += free * dt
        harvested_s += sum(v.startswith("harvest") for v in state.values()) * dt
    delays = sorted(prod_delays)
    summary = {
        "idle_node_seconds": round(idle_s, 1),
        "harvested_node_seconds": round(harvested_s, 1),
        "harvested_share": round(harvested_s / idle_s, 3) if idle_s else None,
        "samples": None,  # stand-in workers train nothing yet
        "prod_start_delay_s": round(delays[len(delays) // 2], 2) if delays else None,
        "source": "squeue samples every 2 s (Slurm's view)",
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print(f"saved {out / 'summary.json'}; daemon log in {work / 'daemon.log'}")
    return 0


if __name__ == "__main__":
    if os.geteuid() != 0:
        print("demo: run as root (the local cluster runs slurmd/slurmctld as root)",
              file=sys.stderr)
        sys.exit(1)
    sys.exit(main())
