"""A user's in-place training script, timed from its task's start (driven by bench/joiner.py).

What a typical script does at its start, in order: import torch, build the model and a
``torch.optim`` optimizer (its first ``add_param_group`` imports ``torch._dynamo``), wrap them
in :class:`malletrain_core.worker.inplace.Elastic` and enter its loop (the process is then
ready to be placed; the loop's first step comes once the group has formed). It prints one JSON
line at its first step with the wall-clock time of each of those moments, so that a joiner's
start-up can be split into its parts; then it trains (a wait of ``--compute-s`` and a small real
step whose gradients are all-reduced over gloo) until it is stopped.
"""

from __future__ import annotations

import time

EXEC_T = time.time()  # before anything is imported

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

from malletrain_core.worker import inplace, training  # noqa: E402

IMPORTED_T = time.time()


def task_start() -> float:
    """When the task (the launcher, this process's parent) started: psutil's start times are
    whole clock ticks from the boot time, so their difference is exact; this process's exec
    less that difference. The exec itself where psutil cannot tell."""
    try:
        import psutil

        return EXEC_T - max(0.0, psutil.Process().create_time()
                            - psutil.Process(os.getppid()).create_time())
    except Exception:
        return EXEC_T


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--compute-s", type=float, default=0.1)
    args = p.parse_args()
    torch.set_num_threads(1)
    session = training.Session(checkpoint_every_s=30.0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    model_t = time.time()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    built_t = time.time()
    el = inplace.Elastic(session, model, opt, collective_timeout_s=15, ddp=False)
    ready_t = time.time()  # steps() marks the process ready and waits to be placed
    first = True
    for step in el.steps():
        if first:
            first = False
            change = el.changes[0] if el.changes else {}
            line = {"joiner": os.environ.get("SLURMD_NODENAME", ""), "task_t": task_start(),
                    "exec_t": EXEC_T, "imported_t": IMPORTED_T, "model_t": model_t,
                    "built_t": built_t,
                    "ready_t": ready_t, "first_t": time.time(), "world": el.world,
                    "epoch": el.epoch, "reform_s": change.get("reform_s"),
                    "dynamo_imported_by_optimizer": "torch._dynamo" in sys.modules}
            os.write(1, (json.dumps(line) + "\n").encode())
        with el.guard():
            time.sleep(args.compute_s)
            g = torch.Generator().manual_seed(step * 31 + el.rank)
            x, y = torch.randn(8, 32, generator=g), torch.randint(0, 4, (8,), generator=g)
            opt.zero_grad()
            nn.functional.cross_entropy(el.net(x), y).backward()
            el.average_gradients()
            opt.step()
        session.report(samples=8 * el.world)
    return 0


if __name__ == "__main__":
    sys.exit(main())
