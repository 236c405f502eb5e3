"""Sharded models rescaled in place, with real torch + gloo processes on loopback (no Slurm).

A driver stands in for the daemon and the launchers (as in tests/test_inplace_nproc.py): each
node has one control folder and one membership file for its processes (``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``). The training processes (tests/workers/sharded_train.py) train an
FSDP2 or HSDP model on the same batch on every rank and print, at the start of every step,
the digest of the full state (gathered). Every rank trains on the same batch, so at 1 and 2
ranks per shard the sums over ranks are exact and the state after every step must be BITWISE
the one of a run at a fixed world (the reference, run after the job): any byte a re-shard or
a heal got wrong shows at the next step's digest.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from malletrain_core.worker import inplace
from tests import test_inplace_nproc as nproc
from tests.test_inplace import Proc, wait_for

pytest.importorskip("torch")
pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "workers" / "sharded_train.py"


def changes(p: nproc.Log) -> list[dict]:
    """The change records a process printed."""
    return [r for r in Proc.records(p) if "change" in r]


class Driver(nproc.Driver):
    """tests/test_inplace_nproc.py's driver (epochs with fresh ports, node by node) for
    ``count`` processes per node, each running ``command`` (by default the test worker in
    ``mode``)."""

    def __init__(self, tmp: Path, mode: str, count: int,
                 command: list[str] | None = None) -> None:
        super().__init__(tmp)
        self.mode, self.nproc, self.command = mode, count, command

    def start(self, name: str, steps: int = 0, args: tuple[str, ...] = ()) -> nproc.Node:
        # FSDP with buddy copies every 2 steps unless a test says otherwise: a refresh
        # must leave the state bitwise as it was
        command = self.command or [str(WORKER), "--mode", self.mode, "--sleep", "0.03",
                                   "--steps", str(steps), "--buddy-every", "2"]
        node = nproc.Node(self.tmp, name, command=[*command, *args], count=self.nproc)
        self.nodes.append(node)
        wait_for(lambda: inplace.is_ready(node.control, self.nproc), 90, f"{name} ready",
                 self.logs)
        return node


def driver(tmp: Path, mode: str, count: int) -> Iterator[Driver]:
    d = Driver(tmp / "job", mode, count)
    d.tmp.mkdir()
    yield d
    d.stop()


@pytest.fixture
def hsdp(tmp_path):
    yield from driver(tmp_path, "hsdp", 2)


@pytest.fixture
def fsdp(tmp_path):
    yield from driver(tmp_path, "fsdp", 1)


def digests(logs: list[nproc.Log]) -> dict[int, set[str]]:
    """The full-state digests every process printed, by step."""
    out: dict[int, set[str]] = {}
    for p in logs:
        for r in p.steps():
            out.setdefault(r["step"], set()).add(r["before"])
    return out


def reference(tmp: Path, mode: str, count: int, until: int) -> dict[int, str]:
    """The same training at a fixed world (one node of ``count`` processes, one epoch), its
    full-state digest at the start of each step up to ``until``."""
    d = Driver(tmp / "reference", mode, count)
    d.tmp.mkdir()
    try:
        node = d.start("ref", steps=until + 1)
        d.change([node])
        for p in node.procs:
            assert p.popen.wait(300) == 0, p.log.read_text()[-3000:]
        got = digests(node.procs)
    finally:
        d.stop()
    assert all(len(v) == 1 for v in got.values()), "the reference's ranks differ"
    return {s: v.pop() for s, v in got.items()}


def check_against(ref: dict[int, str], logs: list[nproc.Log]) -> int:
    """Every step every process printed has the reference's digest, and its scheduler and
    sampler position have counted every step once; returns the steps seen."""
    for p in logs:
        for r in p.steps():
            assert (r["scheduled"], r["pos"]) == (r["step"] + 1, 8 * (r["step"] + 1)), (p.name, r)
    got = digests(logs)
    for step, seen in sorted(got.items()):
        assert seen == {ref[step]}, f"step {step}: {seen} != the reference's {ref[step]}"
    return len(got)


def check_changes(logs: list[nproc.Log], kinds: list[str]) -> None:
    for p in logs:
        seen = [r["change"]["kind"] for r in changes(p)]
        assert seen[-len(kinds):] == kinds, (p.name, seen)
        assert not any(r["moved"].get("from_disk") for r in changes(p)[1:]), p.name


def no_disk(d: Driver) -> None:
    for p in d.logs:
        assert all(not r["checkpoints"] for r in p.steps()), f"{p.name} saved a checkpoint"
    folder = d.tmp / "checkpoints"
    assert not folder.exists() or not any(folder.iterdir()), list(folder.iterdir())


def grow_one_to_two(d: Driver) -> tuple[nproc.Node, nproc.Node]:
    """Node a trains alone, then b joins (1 → 2 nodes): b's processes received their shards
    over the new group."""
    a = d.start("a")
    d.wait_trained(d.change([a]), 4)
    b = d.start("b")
    e2 = d.change([a, b])
    d.wait_trained(e2, 4)
    for p in b.procs:
        change = changes(p)[-1]
        assert change["change"]["epoch"] == e2 and change["moved"]["received_bytes"] > 0
    return a, b


def test_hsdp_replicas_grow_shrink_and_lose_a_node_in_memory(hsdp, tmp_path):
    """HSDP, 2 processes per node sharding among themselves, nodes as replicas: 1 → 2 nodes
    (the joining node's ranks heal from the survivor's), planned 2 → 1, 1 → 2 again, then the
    new node's processes SIGKILLed (2 → 1, abandon): the survivors keep training, nothing read
    from disk, every step's full state bitwise the fixed-world reference's."""
    d = hsdp
    a, b = grow_one_to_two(d)
    e3 = d.change([a])                                        # planned shrink 2 → 1
    d.wait_trained(e3, 4)
    assert [p.popen.wait(30) for p in b.procs] == [0, 0], "the leaving node did not exit 0"
    c = d.start("c")
    e4 = d.change([a, c])
    d.wait_trained(e4, 4)
    for p in c.procs:                                         # the node is lost
        os.kill(p.popen.pid, signal.SIGKILL)
    e5 = d.change([a], abandon=True)
    d.wait_trained(e5, 4)
    check_changes(a.procs, ["start", "planned", "planned", "planned", "lost"])
    for p in a.procs:
        assert len({r["pid"] for r in p.steps()}) == 1, f"{p.name} was restarted"
        assert all(r["resumed_from"] is None for r in p.steps())
    finish(d, tmp_path)


def finish(d: Driver, tmp: Path, disk: bool = False, exact: bool = True) -> None:
    """The members leave (exit 0); no checkpoint written (unless ``disk``); every step's full
    state the fixed-world reference's (where ``exact``: at most 2 ranks per shard)."""
    d.epoch += 1
    for n in d.members:
        n.tell(inplace.Membership(epoch=d.epoch))
    assert [p.popen.wait(30) for n in d.members for p in n.procs] == [0] * (
        d.nproc * len(d.members))
    if not disk:
        no_disk(d)
    if not exact:
        return
    last = max(r["step"] for p in d.logs for r in p.steps())
    ref = reference(tmp, d.mode, d.nproc, last)
    assert check_against(ref, d.logs) == last + 1


def test_fsdp_reshards_on_grow_and_planned_shrink_in_memory(fsdp, tmp_path):
    """FSDP across the job, one process per node: 1 → 2 (the shards re-sharded over the new
    group), planned 2 → 1 (re-sharded over the old group before the leaver goes, the survivor
    adopting them), 1 → 2 again, then one member replaced by another in one change (the
    shards re-sharded to the one that stays, then from it to both): no step lost, nothing read
    from or written to disk, every step's full state bitwise the fixed-world reference's."""
    d = fsdp
    a, b = grow_one_to_two(d)
    assert copies_at(a.procs[0], d.epoch) is not None, "no buddy copies taken at world 2"
    e3 = d.change([a])                                        # planned shrink 2 → 1
    d.wait_trained(e3, 4)
    assert b.procs[0].popen.wait(30) == 0, "the leaver did not exit 0"
    shrink = changes(a.procs[0])[-1]
    assert "before_reform_s" in shrink["moved"] and shrink["moved"]["received_bytes"] > 0
    c = d.start("c")
    e4 = d.change([a, c])                                     # grow again
    d.wait_trained(e4, 4)
    e = d.start("e")
    e5 = d.change([a, e])                 # c leaves and e joins at once: re-sharded twice
    d.wait_trained(e5, 4)
    assert c.procs[0].popen.wait(30) == 0, "the leaver did not exit 0"
    assert changes(e.procs[0])[-1]["moved"]["received_bytes"] > 0
    check_changes(a.procs, ["start", "planned", "planned", "planned", "planned"])
    steps = [r["step"] for r in a.procs[0].steps()]
    assert steps == list(range(steps[0], steps[-1] + 1)), "a step was lost or repeated"
    finish(d, tmp_path)


def copies_at(p: nproc.Log, epoch: int) -> int | None:
    """The step of the last buddy copies ``p`` took in ``epoch``, or None."""
    got = [r["copies"]["step"] for r in p.steps() if r["epoch"] == epoch and r.get("copies")]
    return got[-1] if got else None


@pytest.mark.parametrize("nodes,victim", [(2, 1), (3, 1)])
def test_fsdp_member_lost_without_warning_rolls_back_to_the_buddy_copies(
        fsdp, tmp_path, nodes, victim):
    """FSDP, copies every 3 steps: a member SIGKILLed takes its live rows, but its buddy (the
    next node) holds a copy of them from the last refresh: the survivors roll back to that
    step from the copies and train on, nothing read from or written to disk; every step's full
    state, the ones trained again included, is the fixed-world reference's, and the scheduler
    and the sampler count each step once."""
    d = fsdp
    every = ("--buddy-every", "3")
    first = d.start("n0", args=every)
    d.wait_trained(d.change([first]), 2)
    rest = [d.start(f"n{i}", args=every) for i in range(1, nodes)]
    members = [first, *rest]
    e2 = d.change(members)
    wait_for(lambda: copies_at(first.procs[0], e2) is not None, 60, "buddy copies", d.logs)
    d.wait_trained(e2, 2 + len(first.procs[0].steps()))
    lost_node = members[victim]
    os.kill(lost_node.procs[0].popen.pid, signal.SIGKILL)
    survivors = [n for n in members if n is not lost_node]
    e3 = d.change(survivors, abandon=True)
    d.wait_trained(e3, 4)
    for n in survivors:
        lost = changes(n.procs[0])[-1]
        assert lost["change"]["kind"] == "lost", lost
        moved = lost["moved"]
        assert moved.get("from_buddy") and not moved["from_disk"], moved
        assert 0 <= moved["steps_lost"] <= 6, moved   # 3, or 6 when killed during a refresh
        first_step = min(r["step"] for r in n.procs[0].steps() if r["epoch"] == e3)
        assert first_step == moved["rolled_back_to"], (first_step, moved)
        assert all(r["resumed_from"] is None for r in n.procs[0].steps())
        # the state the new group starts from is the one the old group had at that step
        again = {r["before"] for r in n.procs[0].steps()
                 if r["step"] == first_step and r["epoch"] in (e2, e3)}
        assert len(again) == 1, (first_step, again)
    print(f"\n{nodes} nodes, node {victim} killed: rolled back "
          f"{changes(first.procs[0])[-1]['moved']['steps_lost']} steps from the copies")
    # three ranks' sums of equal gradients are not exact: the fixed-world reference only at 2
    finish(d, tmp_path, exact=nodes <= 2)


def test_fsdp_member_lost_without_warning_reads_the_last_checkpoint(fsdp, tmp_path):
    """FSDP without buddy copies, a member SIGKILLed: its rows are held nowhere else, so the
    survivor rebuilds the model and loads the last DCP checkpoint (written by both members at
    one step); from there every step's full state is again the fixed-world reference's."""
    d = fsdp
    every = ("--checkpoint-every-s", "1", "--buddy-every", "0")
    a = d.start("a", args=every)
    e1 = d.change([a])
    d.wait_trained(e1, 2)
    b = d.start("b", args=every)
    e2 = d.change([a, b])
    wait_for(lambda: any(r["checkpoints"] and r["epoch"] == e2 for r in b.procs[0].steps()),
             60, "a checkpoint at world 2", d.logs)
    d.wait_trained(e2, 2 + len(b.procs[0].steps()))
    os.kill(b.procs[0].popen.pid, signal.SIGKILL)
    e3 = d.change([a], abandon=True)
    d.wait_trained(e3, 4)
    lost = changes(a.procs[0])[-1]
    assert lost["change"]["kind"] == "lost" and lost["moved"]["from_disk"], lost
    resumed = [r["resumed_from"] for r in a.procs[0].steps() if r["epoch"] == e3]
    saved = {c for p in (a.procs[0], b.procs[0]) for r in p.steps() for c in r["checkpoints"]}
    assert resumed[0] is not None and resumed[0] in saved, (resumed, saved)
    finish(d, tmp_path, disk=True)


@pytest.mark.parametrize("mode", ["hsdp", "fsdp"])
def test_a_layout_seen_before_with_other_ranks_gets_the_new_groups(tmp_path, mode):
    """Three nodes, then two (a planned shrink: the survivors are ranks 0 and 1 now, 1 and 2
    before), then three again with a new node last: the new mesh equals the first epoch's
    (same shape, same ranks, same dimension names), which torch's DTensor sharding cache held
    on to; a model rebuilt through that cache came back on the OLD mesh, with the old epoch's
    group names and this rank's old coordinate (real Slurm, bench.sharded: HSDP's first step
    failed "Could not resolve the process group registered under the name 4"; FSDP's next
    planned shrink "old_ranks [0, 1, 2] puts rank 0 at shard 0, but its mesh gives it shard
    1"). Each change rebuilds on its own mesh: the grow trains, a planned shrink after it
    re-shards in memory, and every process holds the same full state at every step."""
    d = Driver(tmp_path / "job", mode, 2 if mode == "hsdp" else 1)
    d.tmp.mkdir()
    try:
        a, b, c = (d.start(n) for n in "abc")
        d.wait_trained(d.change([a, b, c]), 3)
        d.wait_trained(d.change([b, c]), 3)                 # planned shrink: b, c now 0, 1
        x = d.start("x")
        e3 = d.change([b, c, x])                              # the first epoch's layout again
        d.wait_trained(e3, 4)
        e4 = d.change([b, c])                                 # planned shrink after the grow
        d.wait_trained(e4, 4)
        for n in (b, c):
            for p in n.procs:
                assert len({r["pid"] for r in p.steps()}) == 1, f"{p.name} was restarted"
                kinds = [ch["change"]["kind"] for ch in changes(p)]
                assert kinds == ["start", "planned", "planned", "planned"], (p.name, kinds)
                assert not any(ch["moved"]["from_disk"] for ch in changes(p)[1:]), p.name
        # three replicas' (or ranks') sums of equal gradients are not exact: no fixed-world
        # reference, but every process holds one and the same full state at every step
        finish(d, tmp_path, exact=False)
        split = {s: v for s, v in digests(d.logs).items() if len(v) != 1}
        assert not split, f"the ranks' full states differ at steps {sorted(split)}"
    finally:
        d.stop()


def survived_in_place(d: Driver, nodes: list[nproc.Node]) -> None:
    """The processes of ``nodes`` took the loss in place (never restarted, nothing read from
    disk), and every rank's full state was the same at every step."""
    for n in nodes:
        for p in n.procs:
            assert len({r["pid"] for r in p.steps()}) == 1, f"{p.name} was restarted"
            assert changes(p)[-1]["change"]["kind"] == "lost", changes(p)[-1]
            assert not changes(p)[-1]["moved"]["from_disk"], p.name
    split = {s: v for s, v in digests(d.logs).items() if len(v) != 1}
    assert not split, f"the ranks' full states differ at steps {sorted(split)}"


def test_hsdp_node_hosting_the_store_lost_after_a_grow_siblings_leave_together(tmp_path):
    """HSDP, 2 processes per node: 3 nodes, 2, then 3 again (the first survivor hosting the
    epoch's store), then that node's processes SIGTERMed (a preemption: they exit at once).
    Of the next node's two processes, one can fail its step on the lost node's closed
    connection while the other has passed that all-reduce and waits for its sibling in the
    next unit's reduce-scatter; the one that leaves lets go of the old groups at once, so its
    sibling's collective fails too (real Slurm, bench.sharded: both waited 60 s at the next
    epoch's store, then the job read its checkpoint, 58 steps lost). The survivors train on in
    place within seconds, their replicas equal."""
    d = Driver(tmp_path / "job", "hsdp", 2)
    d.tmp.mkdir()
    slow = ("--collective-timeout-s", "60")   # a sibling left waiting would wait 60 s
    try:
        a, b, c = (d.start(n, args=slow) for n in "abc")
        d.wait_trained(d.change([a, b, c]), 3)
        d.wait_trained(d.change([c, a]), 3)
        x = d.start("x", args=slow)
        d.wait_trained(d.change([c, a, x]), 3)
        for p in c.procs:                            # the store's node, preempted
            os.kill(p.popen.pid, signal.SIGTERM)
        e = d.change([a, x], abandon=True)
        d.wait_trained(e, 3, timeout=40)             # well within the collective timeout
        survived_in_place(d, [a, x])
    finally:
        d.stop()


def test_hsdp_node_hung_the_survivors_are_released_from_fsdp2s_collectives(tmp_path):
    """HSDP, 2 processes per node, one of two nodes SIGSTOPped (hung: its connections stay
    open) and named lost. The survivors are often inside FSDP2's cross-replica all-reduce,
    which nothing polls; their control threads shut the abandoned group's connections down
    (:mod:`malletrain_core.worker.inplace.release`) and they train on in place within
    seconds, not the collective timeout (60 s here). Before the release, the first such loss
    of a loop still held both survivors in FSDP2's ``foreach_reduce`` all-reduce 150 s later."""
    d = Driver(tmp_path / "job", "hsdp", 2)
    d.tmp.mkdir()
    slow = ("--collective-timeout-s", "60")
    try:
        a, b = d.start("a", args=slow), d.start("b", args=slow)
        d.wait_trained(d.change([a, b]), 4)
        for p in b.procs:
            os.kill(p.popen.pid, signal.SIGSTOP)
        e = d.change([a], abandon=True)
        d.wait_trained(e, 3, timeout=30)             # well within the collective timeout
        survived_in_place(d, [a])
    finally:
        d.stop()
