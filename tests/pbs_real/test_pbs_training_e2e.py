"""Real elastic torch training under the real PBS server, directed by a real malletraind.

One elastic job (``qsub -q malletrain -J 1-3``) runs examples/train_elastic.py (gloo DDP)
through ``malletrain-run`` on separate moms, each in its own network namespace; malletraind runs
in the server's namespace, where the launchers reach it, and authenticates them by their job's
secret (no munged here). It grows onto idle vnodes (3 moms), a ``prod`` job that needs one of
their nodes preempts a worker (PBS requeues it), the job goes on with 2 from its last checkpoint
(the progress lost at most one checkpoint interval), and grows back to 3 when the prod job is
gone. The user's ``qdel`` of a training job leaves nothing behind, and training goes on while
the daemon is SIGKILLed and restarted 3 s later (a prod job still preempts a worker meanwhile).
The assertions read PBS (qstat, pbsnodes), the workers' own output and their processes; the
daemon's view is only compared with PBS's.

The job runs as root (``acl_roots``): the torch this machine has lives in a Python only root
can execute, not in the Debian one the test user could run.
"""

from __future__ import annotations

import shlex
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.localcluster.pbs import REPO, PbsComplex
from devtools.localcluster.pbs_helpers import (
    Daemon,
    job_number,
    pbs_view,
    start_daemon,
    state,
    subjob,
    submit,
    views_differ,
    wait_agree,
    wait_state,
    worker_processes,
)
from devtools.localcluster.procs import ClusterError
from devtools.waiting import wait_until
from malletrain_core.backends.pbs import parse as pp
from malletrain_core.worker.client import UnixClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "slurm"))
from training_logs import JobLog, invariant_problems, read_job  # noqa: E402

pytestmark = [pytest.mark.torch]

WORKERS = 3
POLL_S = 2.0
PROD_START_S = 15.0
"""A prod job's start by preempting a worker (kill_delay 2 s; 1.4 s median in BENCHMARKS)."""
RESTART_AFTER_S = 3.0
CHECKPOINT_EVERY_S = 8.0
TRAIN = [sys.executable, "examples/train_elastic.py", "--steps", "0", "--batch", "16",
         "--step-sleep-s", "0.1", "--checkpoint-every-s", str(CHECKPOINT_EVERY_S),
         "--log-every", "1"]


@pytest.fixture
def e2e_daemon(request: pytest.FixtureRequest, pbs: PbsComplex) -> Iterator[Daemon]:
    pbs.qmgr("set server acl_roots = root")
    # A measuring window short enough for a test (the engine holds a job at one size for a
    # window, also when it only probes the largest scale), as in Slurm's e2e test.
    daemon = start_daemon(pbs, poll_s=POLL_S, in_server_ns=True,
                          extra_toml="[profiler]\nwindow_s = 15.0\n")
    try:
        yield daemon
    finally:
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            with UnixClient(str(daemon.root / "api.sock"), timeout_s=5) as client:
                for op in ("jobs", "nodes"):
                    print(f"==== malletraind {op} ====\n{client.call(op)}")
        daemon.stop()
        pbs.qmgr("unset server acl_roots")
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            print(daemon.log_tail())


def script(outdir: Path) -> str:
    """Each worker appends to task-<array number>_<index>.out (read live, unlike PBS's -o)."""
    launcher = shlex.join([sys.executable, "-m", "malletrain_core.worker.launcher",
                           "--poll-s", "1"])
    out = shlex.quote(str(outdir))
    return (f"#!/bin/bash\ncd {shlex.quote(str(REPO))}\nexport PYTHONPATH=.\n"
            'n=${PBS_ARRAY_ID%%[*}\n'
            f'exec >> {out}/task-"$n"_"$PBS_ARRAY_INDEX".out 2>&1\n'
            f'exec {launcher} --checkpoint-dir {out}/ckpt-"$n" -- {shlex.join(TRAIN)}\n')


def submit_training(pbs: PbsComplex, daemon: Daemon, outdir: Path) -> str:
    """The elastic training job (1 to WORKERS workers), as root; returns its array id."""
    return pbs.qsub("-q", "malletrain", "-J", f"1-{WORKERS}", "-l", "select=1:ncpus=2",
                    "-o", "/dev/null", "-e", "/dev/null", "-v",
                    f"MALLETRAIN_PROFILE=0,MALLETRAIN_DAEMON={daemon.address}",
                    script=script(outdir))


def running_nodes(pbs: PbsComplex, array: str, size: int = WORKERS) -> dict[str, str]:
    """Running subjob -> its vnode."""
    states = pbs.jobs(*(subjob(array, i) for i in range(1, size + 1)))
    return {sid: str(v.get("exec_vnode", "")).strip("()").split(":", 1)[0]
            for sid, v in states.items() if v.get("job_state") == "R"}


def wait_consistent(pbs: PbsComplex, array: str, outdir: Path, want: int, timeout_s: float,
                    after_epoch: int = -1) -> int:
    """Wait until the newest epoch (after ``after_epoch``) trains with exactly ``want`` ranks,
    the job's running subjobs; returns that epoch."""
    number = array.split("[", 1)[0]
    seen = "no step lines"

    def consistent() -> tuple[int] | None:
        nonlocal seen
        k = len(running_nodes(pbs, array))
        latest = read_job(outdir, number).latest()
        if latest is None:
            return None
        epoch, world, ranks = latest
        seen = f"{k} running subjobs, epoch {epoch}: world {world}, ranks {sorted(ranks)}"
        ok = epoch > after_epoch and k == want == world and ranks == set(range(want))
        return (epoch,) if ok else None    # a tuple: epoch 0 counts as reached
    (epoch,) = wait_until(f"{array}: training on {want} running subjobs", consistent,
                          timeout_s, 1.0, detail=lambda: f"last seen: {seen}\n" + "".join(
                              p.read_text(errors="replace")[-3000:]
                              for p in sorted(outdir.glob("task-*.out"))))
    return epoch


def lost_steps(log: JobLog, epoch: int, resumed_at: int) -> tuple[int, int]:
    """(steps trained in ``epoch`` past the checkpoint the next epoch resumed from, the
    largest step gap between two checkpoints of the run: one interval's worth)."""
    last = max((s for s, *_ in log.steps.get(epoch, [])), default=resumed_at)
    ckpts = sorted({s for _, s in log.checkpoints})
    gap = max((b - a for a, b in zip(ckpts, ckpts[1:], strict=False)), default=0)
    return last - resumed_at, gap


def test_elastic_torch_grows_is_preempted_recovers_and_grows_back(
        pbs: PbsComplex, e2e_daemon: Daemon) -> None:
    outdir = Path(tempfile.mkdtemp(prefix="e2e-", dir=pbs.root))
    t0 = time.monotonic()
    array = submit_training(pbs, e2e_daemon, outdir)
    number = array.split("[", 1)[0]
    first = wait_consistent(pbs, array, outdir, WORKERS, 240)
    nodes = running_nodes(pbs, array)
    assert len(set(nodes.values())) == WORKERS, nodes  # one mom each
    print(f"grown onto {sorted(nodes.values())}: {WORKERS} ranks training "
          f"{time.monotonic() - t0:.1f} s after qsub (epoch {first})")
    cluster_free = [n for n in pbs.node_names if n not in nodes.values()]

    # A prod job wants every other node and one of the workers': PBS requeues that worker.
    # Two checkpoints first (one interval's worth of steps is then known), then half an
    # interval more: the preemption comes mid-interval, with progress to lose.
    pbs.wait_for("two checkpoints", lambda: len(read_job(outdir, number).checkpoints) >= 2,
                 90, interval_s=0.2)
    done = len(read_job(outdir, number).checkpoints)
    pbs.wait_for("the next checkpoint", lambda: len(read_job(outdir, number).checkpoints)
                 > done, 2 * CHECKPOINT_EVERY_S + 10, interval_s=0.2)
    time.sleep(CHECKPOINT_EVERY_S / 2)
    prod = pbs.qsub("-q", "prod", "-l", f"select={len(cluster_free) + 1}:ncpus=2",
                    "-l", "place=scatter", "-o", "/dev/null", "-e", "/dev/null")
    t_prod = time.monotonic()
    wait_state(pbs, prod, "R", 60)
    print(f"prod job running {time.monotonic() - t_prod:.1f} s after its qsub")
    # The requeued worker must not be granted straight back onto a vnode PBS has just given to
    # the prod job (qrun -H skips PBS's resource check; seen before the daemon read the vnodes
    # again just before each qrun: the worker and the prod job sharing n04, ncpus -2/2). A grant
    # that still raced it is requeued at the daemon's next poll: two polls' grace, no more.
    try:
        pbs.wait_for("one worker requeued and no vnode shared with the prod job",
                     lambda: not sharing(pbs, prod, array) and len(
                         [sid for sid in nodes if pbs.jobs(sid)[sid].get("job_state") == "Q"])
                     == 1, 2 * POLL_S + 3, interval_s=0.2)
    except ClusterError:
        raise AssertionError(f"vnodes shared with the prod job: {sharing(pbs, prod, array)}; "
                             f"workers: {running_nodes(pbs, array)}") from None
    said = e2e_daemon.log.read_text(errors="replace")
    print(f"grants the daemon held back (vnode taken since its poll): "
          f"{said.count('PBS has taken the vnode')}; workers it requeued off a shared vnode: "
          f"{said.count('requeueing ours')}")
    shrunk = wait_consistent(pbs, array, outdir, WORKERS - 1, 180, after_epoch=first)
    log = read_job(outdir, number)
    resumed = {s for s, _, _ in log.starts[shrunk]}
    assert len(resumed) == 1, resumed
    preempted = max(e for e in log.steps if e < shrunk)
    lost, interval = lost_steps(log, preempted, resumed.pop())
    print(f"preempted: trains again with {WORKERS - 1} ranks in epoch {shrunk} "
          f"{time.monotonic() - t_prod:.1f} s after the prod qsub; steps lost {lost} "
          f"(one checkpoint interval: {interval} steps)")
    assert 0 <= lost <= interval, (lost, interval)

    # The prod job ends: the job grows back onto the freed node.
    at_shrink = log.max_step()
    pbs.run(["qdel", prod])
    t_back = time.monotonic()
    pbs.wait_for("a worker started again", lambda: len(running_nodes(pbs, array)) == WORKERS,
                 60, interval_s=0.2)
    print(f"prod job deleted: the requeued worker running again {time.monotonic() - t_back:.1f}"
          " s later")
    back = wait_consistent(pbs, array, outdir, WORKERS, 180, after_epoch=shrunk)
    print(f"grown back to {WORKERS} ranks (epoch {back}) {time.monotonic() - t_back:.1f} s "
          "after the prod job's qdel")
    pbs.wait_for("training past the shrink", lambda: read_job(outdir, number).max_step()
                 > at_shrink, 60)
    final = read_job(outdir, number)
    assert not invariant_problems(final), "\n".join(invariant_problems(final))
    pbs.run(["qdel", array])


def sharing(pbs: PbsComplex, job: str, array: str) -> dict[str, list[str]]:
    """Vnodes that run ``job`` and a subjob of ``array`` at once → their jobs."""
    head = array.split("[", 1)[0] + "["
    vnodes = pp.parse_pbsnodes(pbs.run(["pbsnodes", "-a", "-F", "json"]).stdout)
    return {name: list(v.jobs) for name, v in vnodes.items()
            if job in v.jobs and any(j.startswith(head) for j in v.jobs)}


def left_of(pbs: PbsComplex, array: str) -> dict[str, str]:
    """The array's entries (itself and its subjobs) PBS has not finished: {id: state}."""
    return {jid: str(v.get("job_state")) for jid, v in pbs.jobs(array).items()
            if v.get("job_state") not in ("F", "X")}


def test_the_users_qdel_of_a_training_job_leaves_nothing_behind(
        pbs: PbsComplex, e2e_daemon: Daemon) -> None:
    outdir = Path(tempfile.mkdtemp(prefix="e2e-", dir=pbs.root))
    array = submit_training(pbs, e2e_daemon, outdir)
    wait_consistent(pbs, array, outdir, WORKERS, 240)
    assert len(worker_processes(pbs)) >= 2 * WORKERS  # a launcher and a trainer each
    wait_agree(pbs, e2e_daemon)

    pbs.run(["qdel", array])  # as root, who owns the job here (see the module's doc)
    t0 = time.monotonic()
    pbs.wait_for("the job finished in PBS", lambda: not left_of(pbs, array), 60, interval_s=0.2)
    t_pbs = time.monotonic() - t0
    pbs.wait_for("every worker process gone", lambda: not worker_processes(pbs), 30)
    t_procs = time.monotonic() - t0
    pbs.wait_for("every node free", lambda: pbs_view(pbs) == ({}, set(pbs.node_names)), 30,
                 interval_s=0.2)
    t_free = time.monotonic() - t0
    wait_agree(pbs, e2e_daemon)
    print(f"qdel: the job finished in PBS {t_pbs:.1f} s later, its processes gone at "
          f"{t_procs:.1f} s, every node free at {t_free:.1f} s, the daemon agreeing at "
          f"{time.monotonic() - t0:.1f} s")

    # Nothing comes back: one poll interval later, and a few seconds after that.
    for wait in (POLL_S, 3.0):
        time.sleep(wait)
        assert not left_of(pbs, array), left_of(pbs, array)
        assert not worker_processes(pbs), worker_processes(pbs)
        assert pbs_view(pbs) == ({}, set(pbs.node_names)), pbs_view(pbs)
        assert not views_differ(pbs, e2e_daemon), views_differ(pbs, e2e_daemon)
    known = [(j["state"], j["nodes"]) for j in e2e_daemon.query("jobs")["jobs"]
             if job_number(str(j["job"])) == job_number(array)]
    assert known == [("done", 0)], f"the daemon's record of the deleted job: {known}"


def test_training_goes_on_while_the_daemon_is_killed_and_restarted(
        pbs: PbsComplex, test_user: str, e2e_daemon: Daemon) -> None:
    outdir = Path(tempfile.mkdtemp(prefix="e2e-", dir=pbs.root))
    array = submit_training(pbs, e2e_daemon, outdir)
    number = job_number(array)
    epoch = wait_consistent(pbs, array, outdir, WORKERS, 240)
    # Every other node to a second elastic job (sleeping workers): the prod job below can then
    # only start by preempting one of MalleTrain's workers, and it is pinned to one of the
    # sleepers', so that the training job's epoch must survive the outage untouched.
    others = pbs.moms - WORKERS
    sleepers = submit(pbs, test_user, "-q", "malletrain", "-J", f"1-{others}", "-l",
                      "select=1:ncpus=2", "-v", "MALLETRAIN_PROFILE=0")
    pbs.wait_for("the sleepers on every other node",
                 lambda: len(pbs_view(pbs)[0].get(job_number(sleepers), ())) == others, 60)
    wait_agree(pbs, e2e_daemon)
    on_node = {node: sid for sid, node in running_nodes(pbs, sleepers, others).items()}
    victim = sorted(on_node)[0]

    e2e_daemon.kill()
    t_kill = time.monotonic()
    at_kill = read_job(outdir, number).max_step()
    prod = pbs.qsub("-q", "prod", "-l", f"select=1:ncpus=2:vnode={victim}",
                    "-o", "/dev/null", "-e", "/dev/null")
    # The whole preemption without a daemon: it is restarted 3 s after the kill, or once the
    # prod job runs if that takes longer.
    waited = wait_state(pbs, prod, "R", PROD_START_S)
    print(f"daemon SIGKILLed: the prod job running on {victim} {waited:.1f} s after its qsub")
    assert state(pbs, on_node[victim]) == "Q", f"{on_node[victim]} not requeued"
    time.sleep(max(0.0, RESTART_AFTER_S - (time.monotonic() - t_kill)))
    log = read_job(outdir, number)
    print(f"outage: {time.monotonic() - t_kill:.1f} s, steps {at_kill} -> {log.max_step()}")
    assert log.max_step() > at_kill, "training stopped with the daemon"
    assert log.latest() is not None and log.latest()[0] == epoch, "the epoch changed"

    e2e_daemon.restart()
    print(f"daemon restarted: polled {time.monotonic() - t_kill:.1f} s after the kill")
    wait_agree(pbs, e2e_daemon)
    after = wait_consistent(pbs, array, outdir, WORKERS, 60)
    at_restart = read_job(outdir, number).max_step()
    time.sleep(2 * POLL_S)  # two polls of the restarted daemon: still the same epoch
    assert not views_differ(pbs, e2e_daemon), views_differ(pbs, e2e_daemon)
    log = read_job(outdir, number)
    assert after == epoch and log.latest() is not None and log.latest()[0] == epoch, \
        "the restarted daemon should keep the running epoch"
    assert log.max_step() > at_restart
    assert not invariant_problems(log), "\n".join(invariant_problems(log))
    pbs.run(["qdel", prod])
