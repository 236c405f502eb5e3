"""Elastic training of a NAS-Bench-101 cell whose accelerator compute is STOOD IN by a wait.

The demo's default worker (``scripts/demo.py --compute standin``). The machine the demo runs on
has a few CPU cores for 16 virtual nodes, so a real training step on every node at once is not
possible there. This worker keeps everything of a step that MalleTrain deals with real and
replaces only the part an accelerator would do:

* **stood in:** the forward and backward pass of the real-size model on the accelerator is a
  timed wait of ``--compute-s`` seconds (``time.sleep``), declared as such in the demo's output
  and summary (``"compute": "standin"``). No GPU is used and nothing is computed in that time.
* **real:** a small NAS-Bench-101 cell network (:mod:`nas_cell`, shrunk to 8×8 inputs) runs a
  real forward and backward pass on random data each step, and its gradients are averaged over
  the job's workers by a real gloo all-reduce; the optimizer steps, the process rescales
  in place (:class:`malletrain_core.worker.inplace.Elastic`: the group is re-formed and the
  state handed over when the daemon changes the membership), progress is reported to the
  daemon, and rank 0 checkpoints to disk for the case where every node is lost.

Each process appends one line per *completed* step to ``steps/<node>.log`` beside the
checkpoint (``START END STEP EPOCH``: Unix seconds, the global step, the epoch it began in; a
step dropped because a peer was lost is not written), from which the demo counts the harvested
node-seconds (only the time inside completed steps counts) and the samples kept and rolled back. Rank 0 keeps ``counters.json`` (the samples of the training state, steps, the world
sizes seen) about once a second. Run under ``malletrain-run --inplace``; without MalleTrain it
runs as a one-process training::

    python examples/standin_nas.py --cell-seed 3 --steps 20 --compute-s 0.1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

EXEC_T = time.time()  # before torch is imported: for the start-up line on stderr

import torch  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nas_cell import COUNTERS_NAME, Network, StepLog, node_name, random_cell  # noqa: E402

from malletrain_core.worker import inplace, training  # noqa: E402

IMAGE = 8  # pixels: the real forward/backward stays a few milliseconds on one CPU thread


class SGD:
    """Plain SGD with momentum, written out: ``torch.optim``'s first optimizer imports
    ``torch._dynamo`` (1.5 s of CPU measured here), which a worker starting on a node that
    has just become idle cannot spare. The same ``param_groups`` / ``state_dict`` interface as
    ``torch.optim.SGD`` for what :class:`inplace.Elastic` hands over and rescales."""

    def __init__(self, params: Any, lr: float, momentum: float = 0.9) -> None:
        self.params = list(params)
        self.param_groups = [{"lr": lr, "momentum": momentum}]
        self.buffers = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        lr, momentum = self.param_groups[0]["lr"], self.param_groups[0]["momentum"]
        for p, buf in zip(self.params, self.buffers):
            if p.grad is not None:
                buf.mul_(momentum).add_(p.grad)
                p.add_(buf, alpha=-lr)

    def state_dict(self) -> dict[str, Any]:
        return {"param_groups": [dict(g) for g in self.param_groups],
                "buffers": [b.clone() for b in self.buffers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.param_groups = [dict(g) for g in state["param_groups"]]
        for buf, saved in zip(self.buffers, state["buffers"]):
            buf.copy_(saved)


class Counters:
    """Rank 0's ``counters.json``: taken over from the file when a process becomes rank 0."""

    def __init__(self, path: Path, job: str, cell: str) -> None:
        self.path = path
        self.data: dict[str, Any] = {"job": job, "cell": cell, "compute": "standin",
                                     "samples": 0, "steps": 0, "starts": 0, "restarts": 0,
                                     "epochs": [], "world_sizes": []}
        try:
            self.data.update(json.loads(path.read_text()))
        except (OSError, ValueError):
            pass
        self._last = 0.0

    def change(self, epoch: int | None, world: int) -> None:
        if epoch is not None and epoch not in self.data["epochs"]:
            self.data["epochs"].append(epoch)
            self.data["world_sizes"].append(world)
        self.write()

    def update(self, samples: float, steps: int) -> None:
        self.data["samples"], self.data["steps"] = int(samples), steps
        if time.monotonic() - self._last >= 1.0:
            self.write()

    def write(self) -> None:
        self.data["updated"] = time.time()
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.data))
        os.replace(tmp, self.path)
        self._last = time.monotonic()


def startup_line(imported_t: float, first_t: float, el: inplace.Elastic) -> None:
    """One stderr line on where this process's start-up went (the task's start is its
    launcher's, the parent process, when psutil can tell). psutil's start times count from the
    boot time in whole seconds, off by up to a second; their difference is exact (a clock tick),
    so the launcher's start is taken as this process's exec less that difference."""
    try:
        import psutil

        task_t = EXEC_T - max(0.0, psutil.Process().create_time()
                              - psutil.Process(os.getppid()).create_time())
    except Exception:  # psutil missing or the parent gone: start at the exec
        task_t = EXEC_T
    first = el.changes[0] if el.changes else {}
    print(f"standin: node {node_name()} first step {first_t - task_t:.2f} s after the task "
          f"started: launcher {EXEC_T - task_t:.2f} s, torch and model "
          f"{imported_t - EXEC_T:.2f} s, ready to placed and formed "
          f"{first_t - imported_t:.2f} s (re-form {first.get('reform_s', 0):.2f} s)",
          file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cell-seed", type=int, default=0, help="which random cell to train")
    p.add_argument("--steps", type=int, default=0, help="train until this step (0: forever)")
    p.add_argument("--compute-s", type=float, default=0.4,
                   help="the stood-in accelerator compute per step: a wait of this many seconds")
    p.add_argument("--batch", type=int, default=8, help="samples per worker and step")
    p.add_argument("--lr", type=float, default=0.05, help="learning rate at --reference-batch")
    p.add_argument("--reference-batch", type=int, default=8)
    p.add_argument("--checkpoint-every-s", type=float, default=30.0)
    args = p.parse_args(argv)
    if args.compute_s < 0 or args.batch < 1 or args.steps < 0:
        p.error("give --compute-s ≥ 0, --batch ≥ 1 and --steps ≥ 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    session = training.Session(checkpoint_every_s=args.checkpoint_every_s)
    spec = random_cell(args.cell_seed)
    torch.manual_seed(args.cell_seed)
    model = Network(spec, stem_channels=8, stacks=1, cells=1)
    optimizer = SGD(model.parameters(), lr=args.lr, momentum=0.9)
    # Elastic resumes from the last checkpoint when no member holds the state, and rank 0
    # checkpoints at step boundaries (every --checkpoint-every-s, or when the daemon asks)
    el = inplace.Elastic(session, model, optimizer, collective_timeout_s=15, ddp=False,
                         lr_for=lambda world: training.scale_lr(
                             args.lr, args.batch * world, args.reference_batch))
    log = StepLog(session.checkpoint_dir, node_name())
    imported_t = time.time()
    counters: Counters | None = None
    seen = 0
    loss_fn = nn.CrossEntropyLoss()
    for i in el.steps(args.steps):
        if el.rank == 0 and counters is None:
            counters = Counters(session.checkpoint_dir / COUNTERS_NAME, session.job_id,
                                spec.describe())
            counters.data["starts"] += 1
            counters.data["restarts"] = counters.data["starts"] - 1
        elif el.rank != 0:
            counters = None
        if counters is not None and len(el.changes) > seen:
            counters.change(el.epoch, el.world)
        seen = len(el.changes)
        start = time.time()
        began_in = el.epoch
        done = False
        with el.guard():
            time.sleep(args.compute_s)  # STAND-IN for the accelerator's forward and backward
            g = torch.Generator().manual_seed(args.cell_seed * 1_000_003 + i * 1009 + el.rank)
            x = torch.randn(args.batch, 3, IMAGE, IMAGE, generator=g)
            y = torch.randint(0, 10, (args.batch,), generator=g)
            loss = loss_fn(el.net(x), y)
            optimizer.zero_grad()
            loss.backward()
            el.average_gradients()  # one gloo all-reduce of all the gradients
            optimizer.step()
            done = True
        if not done:
            continue
        # a step kept across a lost peer: its re-form is not training time
        for paused_t, resumed_t in el.step_pauses:
            log.completed(start, paused_t, i, began_in)
            start = resumed_t
        log.completed(start, time.time(), i, began_in)
        if imported_t:
            startup_line(imported_t, start, el)
            imported_t = 0.0
        session.report(samples=args.batch * el.world)
        if counters is not None:
            counters.update(session.samples, i + 1)
    el.save()
    if counters is not None:
        counters.write()
    el.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
