"""Elastic training of a random NAS-Bench-101 cell on random 32×32 images.

A cell of the NAS-Bench-101 search space (Ying et al., 2019) is a DAG of at most 7 vertices:
vertex 0 is the input, vertex 6 the output, and the 5 interior vertices each apply one of
conv3×3-BN-ReLU, conv1×1-BN-ReLU or max-pool 3×3. The adjacency matrix is upper-triangular
with at most 9 edges, and vertices on no input→output path are pruned. :func:`random_cell`
draws one such cell from a seed; :class:`Network` stacks it like the benchmark does (stem
conv, stacks of cells separated by down-sampling, global pooling, a linear classifier), shrunk
so that one CPU step takes about 0.05–0.2 s.

Written on ``inplace.Elastic``: run by ``malletrain-run --inplace`` (examples/nas.sbatch) its
process stays alive across membership changes and re-forms its group in place (joiners get
the model and optimizer from a member); run by ``malletrain-run`` without it (one ``torchrun``
per epoch) it resumes from the last checkpoint at whatever world size the epoch has. Either way
it reports progress through :class:`training.Session`, checkpoints periodically and when the
daemon asks, and rank 0 keeps a counter file (``counters.json`` beside the checkpoint, replaced
atomically about once a second) with the samples trained (every step computed, also those
redone after resuming from an older checkpoint), the epochs and world sizes seen and the number
of process starts (``restarts``: starts after the first; a change in place is not one). Every
process appends the start and end of each step it completed to ``steps/<node>.log`` there
(what the demo counts as harvested). ``--device auto`` (the default) trains on the GPU with NCCL
when the process sees one, else on the CPU with gloo; ``--device cpu|cuda`` forces either.
Without MalleTrain it runs as a one-process training::

    python examples/nas_cell.py --cell-seed 3 --steps 20
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from malletrain_core.worker import inplace, training  # noqa: E402

INPUT, OUTPUT = "input", "output"
OPS = ("conv3x3-bn-relu", "conv1x1-bn-relu", "maxpool3x3")
VERTICES = 7
MAX_EDGES = 9
COUNTERS_NAME = "counters.json"
STEPS_DIR = "steps"


@dataclass(frozen=True)
class CellSpec:
    """A pruned cell: ``matrix[i][j]`` is an edge i → j (i < j); ``ops[0]`` is the input and
    ``ops[-1]`` the output."""

    matrix: tuple[tuple[int, ...], ...]
    ops: tuple[str, ...]

    @property
    def edges(self) -> int:
        return sum(map(sum, self.matrix))

    def describe(self) -> str:
        """One line: the ops and the edge list."""
        n = len(self.ops)
        edges = [f"{i}>{j}" for i in range(n) for j in range(i + 1, n) if self.matrix[i][j]]
        return f"ops={','.join(self.ops[1:-1]) or '-'} edges={' '.join(edges)}"


def prune(matrix: list[list[int]], ops: list[str]) -> CellSpec | None:
    """Drop vertices on no input→output path; None when the output is unreachable."""
    n = len(ops)
    fwd = {0}
    for j in range(1, n):
        if any(matrix[i][j] and i in fwd for i in range(j)):
            fwd.add(j)
    back = {n - 1}
    for i in range(n - 2, -1, -1):
        if any(matrix[i][j] and j in back for j in range(i + 1, n)):
            back.add(i)
    keep = sorted(fwd & back)
    if 0 not in keep or n - 1 not in keep:
        return None
    sub = tuple(tuple(matrix[i][j] for j in keep) for i in keep)
    return CellSpec(sub, tuple(ops[i] for i in keep))


def random_cell(seed: int, edge_prob: float = 0.5, min_ops: int = 2) -> CellSpec:
    """A valid random cell (input reaches output, ≤ 9 edges after pruning, at least ``min_ops``
    interior vertices so that the cell computes something), fixed by ``seed``."""
    if not 0 <= min_ops <= VERTICES - 2:
        raise ValueError(f"min_ops={min_ops}: give between 0 and {VERTICES - 2}")
    rng = random.Random(seed)
    while True:
        matrix = [[int(j > i and rng.random() < edge_prob) for j in range(VERTICES)]
                  for i in range(VERTICES)]
        ops = [INPUT, *(rng.choice(OPS) for _ in range(VERTICES - 2)), OUTPUT]
        spec = prune(matrix, ops)
        if spec is not None and spec.edges <= MAX_EDGES and len(spec.ops) - 2 >= min_ops:
            return spec


def _op(name: str, channels: int) -> nn.Module:
    if name == "conv3x3-bn-relu":
        return nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1, bias=False),
                             nn.BatchNorm2d(channels), nn.ReLU())
    if name == "conv1x1-bn-relu":
        return nn.Sequential(nn.Conv2d(channels, channels, 1, bias=False),
                             nn.BatchNorm2d(channels), nn.ReLU())
    if name == "maxpool3x3":
        return nn.MaxPool2d(3, stride=1, padding=1)
    raise ValueError(f"unknown op {name!r}; choose one of {', '.join(OPS)}")


class Cell(nn.Module):
    """One cell: interior vertices sum their inputs (the cell input through a 1×1 projection);
    the output concatenates the vertices feeding it, projects back to ``channels`` and adds the
    projected input when there is an input→output edge."""

    def __init__(self, spec: CellSpec, in_channels: int, channels: int) -> None:
        super().__init__()
        self.spec = spec
        n = len(spec.ops)
        self.proj = nn.ModuleDict({str(j): nn.Conv2d(in_channels, channels, 1, bias=False)
                                   for j in range(1, n) if spec.matrix[0][j]})
        self.ops = nn.ModuleDict({str(j): _op(spec.ops[j], channels) for j in range(1, n - 1)})
        feeders = [i for i in range(1, n - 1) if spec.matrix[i][n - 1]]
        self.feeders = feeders
        self.out = nn.Conv2d(channels * max(1, len(feeders)), channels, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = len(self.spec.ops)
        m = self.spec.matrix
        values: dict[int, torch.Tensor] = {}
        for j in range(1, n - 1):
            parts = [values[i] for i in range(1, j) if m[i][j]]
            if m[0][j]:
                parts.append(self.proj[str(j)](x))
            values[j] = self.ops[str(j)](torch.stack(parts).sum(0))
        out: torch.Tensor | None = None
        if self.feeders:
            out = self.out(torch.cat([values[i] for i in self.feeders], dim=1))
        if m[0][n - 1]:
            skip = self.proj[str(n - 1)](x)
            out = skip if out is None else out + skip
        assert out is not None  # pruning guarantees the output has an input
        return out


class Network(nn.Module):
    """Stem conv, ``stacks`` stacks of ``cells`` cells (channels double and the map halves
    between stacks), global average pooling and a 10-way classifier."""

    def __init__(self, spec: CellSpec, stem_channels: int = 16, stacks: int = 2,
                 cells: int = 2, classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, stem_channels, 3, padding=1, bias=False),
                                   nn.BatchNorm2d(stem_channels), nn.ReLU()]
        channels = stem_channels
        for s in range(stacks):
            if s > 0:
                layers.append(nn.MaxPool2d(2))
            out = stem_channels * 2 ** s
            for _ in range(cells):
                layers.append(Cell(spec, channels, out))
                channels = out
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean(dim=(2, 3)))


class Counters:
    """Rank 0's running totals, kept across epochs and restarts in ``counters.json``."""

    def __init__(self, path: Path, job: str, spec: CellSpec) -> None:
        self.path = path
        self.data: dict[str, Any] = {"job": job, "cell": spec.describe(), "samples": 0,
                                     "steps": 0, "starts": 0, "restarts": 0,
                                     "epochs": [], "world_sizes": []}
        try:
            self.data.update(json.loads(path.read_text()))
        except (OSError, ValueError):
            pass
        self._last_write = 0.0

    def started(self, epoch: int | None, world: int, fresh: bool = True) -> None:
        """An epoch begins: ``fresh`` when this process is new (a start or a restart), not
        when the group changed in place around it."""
        d = self.data
        if fresh:
            d["starts"] += 1
            d["restarts"] = d["starts"] - 1
        if epoch not in d["epochs"]:
            d["epochs"].append(epoch)
        d["world_sizes"].append(world)
        self.write()

    def add(self, samples: int) -> None:
        self.data["samples"] += samples
        self.data["steps"] += 1
        if time.monotonic() - self._last_write >= 1.0:
            self.write()

    def write(self) -> None:
        """Replace the file atomically (temporary file, fsync, rename)."""
        self.data["updated"] = time.time()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with open(tmp, "w") as fh:
            json.dump(self.data, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        self._last_write = time.monotonic()


def node_name() -> str:
    """The node this process runs on, as the batch system names it."""
    return os.environ.get("SLURMD_NODENAME") or os.environ.get("PBS_NODENAME") \
        or socket.gethostname()


class StepLog:
    """Appends ``START END STEP EPOCH`` of every completed step to ``DIR/steps/<node>.log``:
    the global step and the membership epoch it began in (-1 without MalleTrain), so that a
    step trained again after a roll-back to a checkpoint can be told from the one it undid."""

    def __init__(self, checkpoint_dir: Path, node: str) -> None:
        folder = checkpoint_dir / STEPS_DIR
        folder.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(folder / f"{node}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def completed(self, start: float, end: float, step: int, epoch: int | None) -> None:
        os.write(self.fd, f"{start:.3f} {end:.3f} {step} {-1 if epoch is None else epoch}\n"
                 .encode())


def batch(seed: int, step: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random images and labels, different on every rank and step, reproducible."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    return torch.randn(size, 3, 32, 32, generator=g), torch.randint(0, 10, (size,), generator=g)


def pick_device(name: str) -> torch.device:
    """``--device``: ``auto`` is the GPU when this process sees one, else the CPU; a GPU is
    bound the way ``Elastic(backend="nccl")`` binds it (one per process). Exits with one line
    when ``cuda`` is asked for and no GPU is visible."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    if torch.cuda.device_count() < 1:
        raise SystemExit("--device cuda: this process sees no GPU (CUDA_VISIBLE_DEVICES, the "
                         "node's driver); use --device auto or cpu")
    try:
        return torch.device("cuda", inplace.bind_device())
    except RuntimeError as exc:
        raise SystemExit(f"--device {name}: {exc}") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cell-seed", type=int, default=0, help="which random cell to train")
    p.add_argument("--steps", type=int, default=0, help="train until this step (0: forever)")
    p.add_argument("--batch", type=int, default=16, help="samples per worker and step")
    p.add_argument("--lr", type=float, default=0.05, help="learning rate at --reference-batch")
    p.add_argument("--reference-batch", type=int, default=16)
    p.add_argument("--checkpoint-every-s", type=float, default=30.0)
    p.add_argument("--log-every", type=int, default=20, help="print every N steps")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: the GPU with NCCL when one is visible, else the CPU with gloo")
    p.add_argument("--compile", default="", metavar="BACKEND",
                   help="torch.compile the cell with this backend (inductor, aot_eager, ...); "
                        "empty: eager, and torch._dynamo is never imported")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(max(1, args.threads))
    device = pick_device(args.device)
    session = training.Session(checkpoint_every_s=args.checkpoint_every_s)
    spec = random_cell(args.cell_seed)
    torch.manual_seed(args.cell_seed)
    model = Network(spec).to(device)
    if args.compile:
        # compiled once: every group's DDP wraps the same compiled module, so a re-form
        # compiles nothing again (its checkpoints name the weights "_orig_mod.*")
        model = torch.compile(model, backend=args.compile)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    # Elastic wraps DDP for each group, sets the learning rate for each world size, resumes
    # from the last checkpoint when no member holds the state, and has rank 0 checkpoint at
    # step boundaries (every --checkpoint-every-s, or when the daemon asks).
    el = inplace.Elastic(session, model, optimizer, lr_for=lambda world: training.scale_lr(
        args.lr, global_batch=args.batch * world, reference_batch=args.reference_batch),
        backend="nccl" if device.type == "cuda" else "gloo")
    loss_fn = nn.CrossEntropyLoss()
    steps_log = StepLog(session.checkpoint_dir, node_name())
    counters: Counters | None = None
    shown: object = ()  # no epoch is (): the first step shows one
    for step in el.steps(args.steps):
        if el.epoch != shown:  # this process's first epoch, or a change in place
            fresh = shown == ()
            shown = el.epoch
            if el.rank == 0:  # also a process that becomes rank 0 in place
                if counters is None:
                    counters = Counters(session.checkpoint_dir / COUNTERS_NAME,
                                        session.job_id, spec)
                counters.started(session.epoch, el.world, fresh=fresh)
            else:
                counters = None
            print(f"start cell={args.cell_seed} {spec.describe()} step={step} "
                  f"epoch={session.epoch} world={el.world} rank={el.rank} "
                  f"resumed={'yes' if el.resumed_from is not None else 'no'}", flush=True)
        started = time.time()
        began_in = el.epoch
        done = False
        with el.guard():  # a step failed by a lost peer is dropped and run again
            x, y = batch(args.cell_seed, step, el.rank, args.batch)  # on the CPU: reproducible
            loss = loss_fn(el.net(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            done = True
        if not done:
            continue
        steps_log.completed(started, time.time(), step, began_in)
        session.report(samples=args.batch * el.world)
        if counters is not None:
            counters.add(args.batch * el.world)
        if (step + 1) % args.log_every == 0:
            print(f"step={step + 1} epoch={session.epoch} world={el.world} rank={el.rank} "
                  f"loss={loss.item():.4f}", flush=True)
    el.save()  # the last checkpoint (rank 0)
    if counters is not None:
        counters.write()
    print(f"done step={el.step} world={el.world} rank={el.rank}", flush=True)
    el.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
