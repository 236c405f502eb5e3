"""``matches_reference`` of bench/sharded.py: a sharded state rescaled in place is bitwise the
one a save-and-restart run holds at the same worlds and steps.

No Slurm here: a driver stands in for the daemon and the launchers, as in
tests/test_inplace_sharded.py (a control folder per node, ``--nproc-per-node`` processes
each), and the processes run bench/sharded_worker.py (tests/workers/sharded_train.py's small
model: uneven rows at every world, a LayerNorm, a buffer, AdamW, a scheduler and a sampler
position handed over as extras). Two runs per mode:

1. **In place**: nodes 2 → 4 (grow) → 3 (planned shrink) → 2 (a node SIGKILLed: a loss,
   FSDP rolling back to the buddy copies, HSDP going on from its replicas) → 1 (planned)
   → 2 (grow); each epoch trains 4 steps at least. Every step line carries the digest of the
   full state at its start (every parameter and optimizer state gathered), the sampler's
   position and the scheduler's count.
2. **Save and restart**, through the same worlds from the same steps: for each epoch of run 1,
   fresh processes at its world resume from the DCP checkpoint the previous segment wrote,
   train up to the step the next epoch of run 1 began from, and write one.

A rank's arithmetic at one world is the same on both runs, so any byte a re-shard, a heal or
a roll-back got wrong shows at the next step. ``matches`` holds when, for every step each
epoch of run 1 kept (the steps a loss rolled back are not compared), both runs printed one
and the same (digest, position, count) on every rank; the mismatches are listed otherwise.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from devtools.localcluster.daemon import free_port
from devtools.runlogs.jsonlines import read_json_lines
from devtools.waiting import wait_until
from malletrain_core.worker import inplace, training

REPO = Path(__file__).resolve().parents[1]
WORKER = "bench.sharded_worker"
"""The processes' module (run with ``-m`` from the checkout: bench/ is not put on the path)."""
SEQUENCE = "2 → 4 → 3 → 2 (a node lost) → 1 → 2 nodes"
PEER_TIMEOUT_S = "5"
"""The processes' ``MALLETRAIN_PEER_TIMEOUT_S``, as bench/sharded.py's (eight processes on a
2-core host starved a heartbeat past the default 1.25 s once, and a planned change became a
loss)."""
Digest = tuple[str, int, int]
"""(full-state digest at a step's start, sampler position after it, scheduler count)."""


class Node:
    """A node's ``count`` processes sharing one control folder, each running ``command``."""

    def __init__(self, root: Path, name: str, count: int, command: list[str],
                 checkpoints: Path) -> None:
        self.name, self.count = name, count
        self.control = root / name
        self.control.mkdir(parents=True)
        self.logs = [root / f"{name}.{i}.log" for i in range(count)]
        self.procs = []
        for i, log in enumerate(self.logs):
            env = dict(os.environ, PYTHONPATH=str(REPO), GLOO_SOCKET_IFNAME="lo",
                       OMP_NUM_THREADS="1", LOCAL_RANK=str(i), LOCAL_WORLD_SIZE=str(count),
                       MALLETRAIN_PEER_TIMEOUT_S=PEER_TIMEOUT_S)
            env[training.ENV_CONTROL_DIR] = str(self.control)
            env[training.ENV_INPLACE] = "1"
            env[training.ENV_CHECKPOINT_DIR] = str(checkpoints)
            with open(log, "w") as out:
                self.procs.append(subprocess.Popen([sys.executable, "-m", WORKER, *command],
                                                   env=env, stdout=out,
                                                   stderr=subprocess.STDOUT, cwd=REPO))

    def records(self) -> list[dict[str, Any]]:
        return read_json_lines(*self.logs)

    def tell(self, m: inplace.Membership) -> None:
        inplace.write_membership(self.control, m)

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait(10)


class Group:
    """The daemon's and launchers' part: start nodes, tell them their epoch, wait."""

    def __init__(self, root: Path, count: int, command: list[str],
                 checkpoints: Path | None = None) -> None:
        self.root, self.count, self.command = root, count, command
        self.checkpoints = checkpoints or root / "checkpoints"
        self.epoch = 0
        self.nodes: list[Node] = []
        self.members: list[Node] = []

    def start(self, *names: str) -> list[Node]:
        new = [Node(self.root, n, self.count, self.command, self.checkpoints) for n in names]
        self.nodes += new
        for node in new:
            self.wait(f"{node.name} ready", partial(inplace.is_ready, node.control, node.count))
        return new

    def wait(self, what: str, check: Callable[[], Any], timeout_s: float = 180.0) -> None:
        def ok() -> Any:
            dead = [p for n in self.members for p in n.procs if p.poll() not in (None, 0)]
            if dead:
                raise RuntimeError(f"{what}: a member exited with {dead[0].returncode}: "
                                   f"{self.tail()}")
            return check()
        wait_until(what, ok, timeout_s, 0.2, detail=self.tail)

    def tail(self) -> str:
        return " | ".join(f"{log.name}: {log.read_text(errors='replace')[-400:]!r}"
                          for n in self.nodes for log in n.logs if log.exists())[-3000:]

    def change(self, members: list[Node], abandon: bool = False) -> int:
        """The next epoch: ``members`` in that order; the others still running leave."""
        self.epoch += 1
        port = free_port()
        for n in self.members:
            if n not in members and any(p.poll() is None for p in n.procs):
                n.tell(inplace.Membership(epoch=self.epoch))
        for r, n in enumerate(members):
            n.tell(inplace.Membership(epoch=self.epoch, rank=r, world=len(members),
                                      master="127.0.0.1", port=port, abandon=abandon))
        self.members = list(members)
        return self.epoch

    def trained(self, epoch: int, steps: int = 4) -> None:
        def done() -> bool:
            return all(sum(1 for r in n.records() if r.get("epoch") == epoch and "step" in r
                           and not r["failed"] and r.get("local", 0) == 0) >= steps
                       for n in self.members)
        self.wait(f"epoch {epoch}: {steps} steps", done)

    def leave(self) -> None:
        self.change([])
        for n in self.nodes:
            for p in n.procs:
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    n.kill()

    def stop(self) -> None:
        for n in self.nodes:
            n.kill()


def steps_of(nodes: list[Node]) -> list[dict[str, Any]]:
    return [r for n in nodes for r in n.records() if "step" in r and not r["failed"]]


def in_place(root: Path, mode: str, count: int) -> tuple[list[dict[str, Any]], list[Any]]:
    """Run 1 (see the module doc): its kept step records and its change records."""
    g = Group(root, count, ["--mode", mode, "--sleep", "0.02", "--buddy-every", "2"])
    try:
        a, b = g.start("n0", "n1")
        g.trained(g.change([a, b]))
        c, d = g.start("n2", "n3")
        g.trained(g.change([a, b, c, d]))                  # grow 2 → 4
        g.trained(g.change([a, b, c]))                     # planned shrink 4 → 3
        c.kill()
        g.trained(g.change([a, b], abandon=True))          # c lost: 3 → 2
        g.trained(g.change([a]))                           # planned shrink 2 → 1
        (e,) = g.start("n4")
        g.trained(g.change([a, e]))                        # grow 1 → 2
        g.leave()
        return steps_of(g.nodes), [r for n in g.nodes for r in n.records() if "change" in r]
    finally:
        g.stop()


def segments(rows: list[dict[str, Any]]) -> list[tuple[int, int, int, int]]:
    """(epoch, world in processes, first step, the next epoch's first step) for each epoch
    of run 1, in order; the last one ends after its last step."""
    epochs = sorted({r["epoch"] for r in rows})
    first = {e: min(r["step"] for r in rows if r["epoch"] == e) for e in epochs}
    world = {e: max(r["world"] for r in rows if r["epoch"] == e) for e in epochs}
    last = max(r["step"] for r in rows) + 1
    return [(e, world[e], first[e], first[epochs[i + 1]] if i + 1 < len(epochs) else last)
            for i, e in enumerate(epochs)]


def by_step(rows: list[dict[str, Any]]) -> dict[int, set[Digest]]:
    out: dict[int, set[Digest]] = {}
    for r in rows:
        out.setdefault(r["step"], set()).add((r["before"], r["pos"], r["scheduled"]))
    return out


def saved(nodes: list[Node], step: int) -> bool:
    """Every process of ``nodes`` saved its checkpoint at ``step``."""
    return sum(1 for n in nodes for r in n.records() if r.get("saved") == step) == \
        sum(n.count for n in nodes)


def restarted(root: Path, mode: str, count: int,
              plan: list[tuple[int, int, int, int]]) -> list[dict[int, set[Digest]]]:
    """Run 2: one fresh group per segment of ``plan``, each resuming from the checkpoint the
    previous one saved; each segment's digests by step."""
    checkpoints = root / "checkpoints"
    out = []
    for i, (_, world, start, stop) in enumerate(plan):
        g = Group(root / f"segment-{i}", count,
                  ["--mode", mode, "--steps", str(stop), "--save-at-end"], checkpoints)
        try:
            nodes = g.start(*(f"s{i}n{k}" for k in range(world // count)))
            g.change(nodes)
            g.wait(f"segment {i} saved at step {stop}", partial(saved, nodes, stop))
            g.leave()
            rows = steps_of(nodes)
            if min((r["step"] for r in rows), default=-1) != start:
                raise RuntimeError(f"segment {i} began at step "
                                   f"{min(r['step'] for r in rows)}, not {start}")
            out.append(by_step(rows))
        finally:
            g.stop()
    return out


def compare(rows: list[dict[str, Any]], plan: list[tuple[int, int, int, int]],
            replay: list[dict[int, set[Digest]]]) -> tuple[int, list[str]]:
    """(steps compared, mismatches) between run 1's kept steps and run 2's."""
    compared, bad = 0, []
    for (epoch, world, start, stop), theirs in zip(plan, replay, strict=True):
        ours = by_step([r for r in rows if r["epoch"] == epoch])
        for step in range(start, stop):
            compared += 1
            if len(ours.get(step, ())) != 1 or ours.get(step) != theirs.get(step):
                bad.append(f"epoch {epoch} (world {world}) step {step}: in place "
                           f"{sorted(ours.get(step, ()))}, restarted {sorted(theirs.get(step, ()))}")
    return compared, bad


def check(work: Path, mode: str, count: int) -> dict[str, Any]:
    """Both runs for ``mode`` (``count`` processes per node) and their comparison."""
    t0 = time.monotonic()
    root = work / f"reference-{mode}"
    root.mkdir(parents=True)
    try:
        rows, changes = in_place(root / "inplace", mode, count)
        plan = segments(rows)
        replay = restarted(root / "restart", mode, count, plan)
        compared, bad = compare(rows, plan, replay)
        lost = [c["moved"] for c in changes if c["change"].get("kind") == "lost"]
        return {"matches": compared > 0 and not bad, "sequence": SEQUENCE,
                "processes_per_node": count, "steps_compared": compared,
                "worlds": [w for _, w, _, _ in plan], "mismatches": bad[:5],
                "loss_rolled_back_steps": max((m.get("steps_lost", 0) for m in lost),
                                              default=0),
                "from_disk": any(c["moved"].get("from_disk") for c in changes
                                 if c["change"].get("kind") != "start"),
                "seconds": round(time.monotonic() - t0, 1)}
    except Exception as exc:  # noqa: BLE001 - a failed phase is a row with its reason
        return {"matches": False, "error": f"{type(exc).__name__}: {exc}"[:2000],
                "seconds": round(time.monotonic() - t0, 1)}
    finally:
        shutil.rmtree(root, ignore_errors=True)
