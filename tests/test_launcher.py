"""malletrain-run: orders → torchrun epochs; daemon restarts; SIGTERM; real torchrun (gloo).

The in-process daemon here is the real API server, launcher service and epoch coordinator;
launchers run as subprocesses with a fake Slurm environment, no Slurm needed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from devtools.waiting import NotReached, wait_until
from malletrain_core.daemon.api import Dispatcher, TcpApiServer
from malletrain_core.daemon.epochs import EpochCoordinator
from malletrain_core.daemon.intake import ReportListener
from malletrain_core.daemon.launchers import LauncherService
from malletrain_core.errors import MalleTrainError
from malletrain_core.munge import PrivateMunged
from malletrain_core.wire import reports
from malletrain_core.wire.checkin import LauncherState
from malletrain_core.wire.orders import Order
from malletrain_core.worker import launcher as mr
from malletrain_core.worker import training

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "train_elastic.py"
pytestmark = pytest.mark.skipif(shutil.which("munged") is None, reason="munge not installed")

# A stand-in for torchrun at the subprocess boundary: records its argv and environment, starts
# a child in a session of its own (as torchrun does with its workers), and sleeps.
FAKE_TORCHRUN = textwrap.dedent("""
    import json, os, subprocess, sys, time
    out = os.environ["FAKE_OUT"]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             start_new_session=True)
    with open(out + ".tmp", "w") as fh:
        json.dump({"argv": sys.argv[1:], "env": dict(os.environ), "pid": os.getpid(),
                   "child": child.pid}, fh)
    os.replace(out + ".tmp", out)
    time.sleep(float(os.environ.get("FAKE_SLEEP", "600")))
    sys.exit(int(os.environ.get("FAKE_RC", "0")))
""")


@pytest.fixture(scope="module")
def workdir():
    d = tempfile.mkdtemp(prefix="mt-run-")
    os.chmod(d, 0o711)  # munged insists that every folder above its socket is searchable
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def munged(workdir):
    with PrivateMunged(workdir / "munge") as m:
        yield m


class MiniDaemon:
    """The daemon's launcher-facing half: API server, coordinator, report intake, ticker."""

    def __init__(self, munged: PrivateMunged, coordinator: EpochCoordinator,
                 port: int = 0) -> None:
        self.co = coordinator
        self.lock = threading.Lock()
        self.reports: list[reports.Report] = []
        # the daemon's own report intake: signature, replay and owner checks, then the
        # checkpoint acknowledgements through LauncherService.acknowledge
        self.intake = ReportListener(
            "127.0.0.1", 0,
            key_for=lambda job: coordinator.key(job) if coordinator.owner(job) is not None
            else None)
        m = munged.client()
        self.svc = LauncherService(coordinator, lambda key, uid: m.encode(key, restrict_uid=uid),
                                   f"127.0.0.1:{self.intake.address[1]}", time.time,
                                   lock=self.lock)
        d = Dispatcher()
        self.svc.register(d)
        self.server = TcpApiServer(("127.0.0.1", port), d, m, idle_timeout_s=10)
        self.server.start()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=f, daemon=True) for f in (self._intake,
                                                                           self._tick)]
        for t in self._threads:
            t.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def _intake(self) -> None:
        while not self._stop.wait(0.05):
            with self.lock:
                verified = self.intake.drain()
                self.svc.acknowledge(verified)
            self.reports += verified

    def _tick(self) -> None:
        while not self._stop.wait(0.3):
            with self.lock:
                self.co.tick(time.time())

    def close(self) -> None:
        self._stop.set()
        self.server.close()
        for t in self._threads:
            t.join(2)
        self.intake.close()


def start_launcher(daemon_addr: str, munged: PrivateMunged, node: str, task: int,
                   command: list[str], log: Path, extra_env: dict | None = None,
                   extra_args: tuple[str, ...] = ()) -> subprocess.Popen:
    env = {**os.environ, "SLURM_ARRAY_JOB_ID": "4242", "SLURM_ARRAY_TASK_ID": str(task),
           "SLURMD_NODENAME": node, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO),
           **(extra_env or {})}
    env.pop("MALLETRAIN_CONFIG", None)
    argv = [sys.executable, "-m", "malletrain_core.worker.launcher", "--daemon", daemon_addr,
            "--munge-socket", munged.socket, "--poll-s", "0.3", *extra_args, "--", *command]
    return subprocess.Popen(argv, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT)


def wait_for(pred, timeout_s: float, what: str, dump: list[Path] = ()):
    """``pred``'s first true value; a test failure with the tails of ``dump`` after
    ``timeout_s``."""
    try:
        return wait_until(what, pred, timeout_s, detail=lambda: "\n".join(
            f"--- {p.name}\n{p.read_text()[-3000:]}" for p in dump if p.exists()))
    except NotReached as exc:
        pytest.fail(str(exc))


def gone(pid: int) -> bool:
    """The process has exited (a zombie waiting for init to reap it counts)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def terminate(proc: subprocess.Popen) -> tuple[int, float]:
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(15)
    return rc, time.monotonic() - t0


# ----- units --------------------------------------------------------------------------------
def test_identity_from_slurm_environment():
    ident = mr.identity_from_env({"SLURM_ARRAY_JOB_ID": "12", "SLURM_ARRAY_TASK_ID": "3",
                                  "SLURM_JOB_ID": "15", "SLURMD_NODENAME": "n07"})
    assert ident == mr.Identity(job="12", task="3", node="n07", batch_system="slurm")
    assert mr.identity_from_env({"SLURM_JOB_ID": "15"}).job == "15"
    with pytest.raises(MalleTrainError, match="inside a batch job"):
        mr.identity_from_env({})


def test_torchrun_command_is_a_static_rendezvous_for_the_epoch():
    order = Order("run", epoch=3, rank=1, world=2, master="10.1.0.5", port=29611,
                  rdzv_id="mt-12-3-ab")
    argv = mr.torchrun_argv(order, ["python", "train.py", "--lr", "0.1"],
                            torchrun=["torchrun"])
    assert argv == ["torchrun", "--nnodes=2", "--node-rank=1", "--nproc-per-node=1",
                    "--master-addr=10.1.0.5", "--master-port=29611", "--rdzv-backend=static",
                    "--rdzv-id=mt-12-3-ab", "--rdzv-conf=timeout=300", "--max-restarts=0",
                    "--no-python", "python", "train.py", "--lr", "0.1"]


@pytest.mark.torch
def test_torchrun_accepts_the_command():
    from torch.distributed.run import get_args_parser

    order = Order("run", epoch=0, rank=1, world=2, master="h", port=29611, rdzv_id="x")
    args = get_args_parser().parse_args(mr.torchrun_argv(order, ["python", "t.py"],
                                                         torchrun=[])[:])
    assert (args.nnodes, args.node_rank, args.rdzv_backend, args.master_port) == \
        ("2", 1, "static", 29611)
    assert args.no_python and args.training_script == "python"


@pytest.mark.parametrize("argv, fragment", [
    ([], "no training command"),
    (["--poll-s", "0", "--", "python", "t.py"], "--poll-s"),
    (["python", "t.py"], "inside a batch job"),
])
def test_usage_errors_are_one_line(argv, fragment, monkeypatch, capsys):
    for var in ("SLURM_ARRAY_JOB_ID", "SLURM_JOB_ID"):
        monkeypatch.delenv(var, raising=False)
    assert mr.main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1


def test_daemon_address_needs_to_be_known(monkeypatch, capsys):
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "1")
    monkeypatch.delenv(mr.ENV_DAEMON, raising=False)
    monkeypatch.delenv("MALLETRAIN_CONFIG", raising=False)
    assert mr.main(["python", "t.py"]) == 2
    assert "MALLETRAIN_DAEMON" in capsys.readouterr().err


class ScriptedClient:
    def __init__(self, replies):
        self.replies = list(replies)
        self.calls = []

    def call(self, op, **args):
        self.calls.append((op, args))
        return self.replies.pop(0)


def test_orders_start_relay_stop_and_exit(munged, tmp_path):
    fake = tmp_path / "fake_torchrun.py"
    fake.write_text(FAKE_TORCHRUN)
    out = tmp_path / "fake.json"
    m = munged.client()
    key = "ab" * 32
    run0 = {"order": Order("run", 0, 1, 2, "10.0.0.1", 29555, "rid").to_dict(),
            "key": m.encode(key), "report_addr": "10.0.0.9:7818"}
    client = ScriptedClient([
        run0,
        {"order": {"kind": "checkpoint", "epoch": 0, "request": 4}},
        {"order": {"kind": "stop", "epoch": 0, "reason": "job shrank"}},
        {"order": {"kind": "exit", "rc": 0, "reason": "training finished"}},
    ])
    la = mr.Launcher(mr.Identity("12", "1", "n02"), ["python", "train.py"], client, m,
                     checkpoint_dir=str(tmp_path / "ck"), control_dir=str(tmp_path),
                     torchrun=[sys.executable, str(fake)],
                     base_env={**os.environ, "FAKE_OUT": str(out)})
    try:
        _orders_start_relay_stop_and_exit(la, client, out, key, tmp_path)
    finally:
        la.shutdown()


def _orders_start_relay_stop_and_exit(la, client, out, key, tmp_path):
    assert la.act(la.checkin()) is None
    rec = wait_for(lambda: out.exists() and json.loads(out.read_text()), 20, "fake torchrun")
    assert rec["argv"][0].startswith("--log-dir=")
    assert rec["argv"][1:3] == ["--nnodes=2", "--node-rank=1"]
    assert rec["argv"][-2:] == ["python", "train.py"]
    env = rec["env"]
    assert (env[training.ENV_JOB], env[training.ENV_EPOCH], env[training.ENV_REPORT_KEY],
            env[training.ENV_REPORT_ADDR]) == ("12", "0", key, "10.0.0.9:7818")
    assert client.calls[0][1]["state"] == "idle"
    assert la.act(la.checkin()) is None
    flag = tmp_path / training.REQUEST_NAME
    assert flag.read_text().strip() == "4" and la.ckpt_seen == 4
    assert (client.calls[1][1]["state"], client.calls[1][1]["epoch"]) == ("running", 0)
    assert la.act(la.checkin()) is None
    assert gone(rec["pid"])
    assert gone(rec["child"]), "workers in their own session are stopped too"
    assert (la.state, la.epoch) == ("idle", None)
    assert la.act(la.checkin()) == 0


def test_sigterm_kills_workers_and_daemon_restart_keeps_the_epoch(munged, workdir, tmp_path):
    fake = tmp_path / "fake_torchrun.py"
    fake.write_text(FAKE_TORCHRUN)
    out = tmp_path / "fake.json"
    co = EpochCoordinator(port_range=(29700, 29710))
    co.add_job("4242", uid=os.getuid(), now=time.time())
    co.set_target("4242", ["n01"], time.time())
    daemon = MiniDaemon(munged, co)
    log = tmp_path / "launcher.log"
    proc = start_launcher(daemon.address, munged, "n01", 0, ["python", "train.py"], log,
                          extra_env={"FAKE_OUT": str(out)},
                          extra_args=("--torchrun", f"{sys.executable} {fake}"))
    try:
        rec = wait_for(lambda: out.exists() and json.loads(out.read_text()), 30,
                       "the first epoch", [log])
        state = co.to_dict()
        port = daemon.server.port
        daemon.close()  # the daemon goes away ...
        time.sleep(1.5)
        assert proc.poll() is None and psutil.pid_exists(rec["child"]), "epoch keeps running"
        # ... and comes back with its persisted state on the same port
        co2 = EpochCoordinator.from_dict(state)
        seen = co2.state("4242").launchers["n01"].seen
        daemon = MiniDaemon(munged, co2, port=port)
        wait_for(lambda: co2.state("4242").launchers["n01"].seen > seen, 40,
                 "the launcher to reconnect", [log])
        with daemon.lock:
            assert co2.checkin("4242", "n01", time.time(), epoch=0, state="running").kind \
                == "run"
        assert json.loads(out.read_text())["pid"] == rec["pid"], "no restart on reconnect"
        rc, took = terminate(proc)
        assert rc == 128 + signal.SIGTERM and took < 2
        assert gone(rec["pid"]) and gone(rec["child"])
    finally:
        if proc.poll() is None:
            proc.kill()
        daemon.close()


# ----- real torchrun, gloo, two nodes -------------------------------------------------------
def _lines(path: Path, pattern: str) -> list[dict[str, str]]:
    rx = re.compile(pattern)
    text = path.read_text() if path.exists() else ""
    return [dict(re.findall(r"(\w+)=(\S+)", ln)) for ln in text.splitlines() if rx.search(ln)]


def _epoch(path: Path, kind: str, epoch: int) -> list[dict[str, str]]:
    return [x for x in _lines(path, rf"^{kind}[ =]") if x.get("epoch") == str(epoch)]


def _last_checkpoint(path: Path) -> str:
    return _lines(path, r"^checkpoint ")[-1]["step"]


@pytest.mark.torch
def test_real_torchrun_shrink_grow_and_preemption(munged, tmp_path):
    """Epoch 0 at world 2 → planned shrink (epoch 1, world 1) → grow (epoch 2, world 2) →
    preemption of n02 (epoch 3, world 1); every restart resumes from the last checkpoint."""
    co = EpochCoordinator(port_range=(29800, 29899), checkpoint_timeout_s=60)
    co.add_job("4242", uid=os.getuid(), now=time.time())
    co.set_target("4242", ["n01", "n02"], time.time())
    daemon = MiniDaemon(munged, co)
    logs = [tmp_path / "n01.log", tmp_path / "n02.log"]
    n01, n02 = logs
    command = [sys.executable, str(TRAIN), "--steps", "0", "--batch", "4", "--log-every", "1",
               "--step-sleep-s", "0.15", "--checkpoint-every-s", "1000"]
    procs = [start_launcher(daemon.address, munged, node, i, command, logs[i],
                            extra_args=("--checkpoint-dir", str(tmp_path / "ckpt")))
             for i, node in enumerate(["n01", "n02"])]

    def same_params_on_both_ranks(epoch: int, steps: int) -> None:
        a, b = wait_for(lambda: (len(_epoch(n01, "step", epoch)) >= steps
                                 and len(_epoch(n02, "step", epoch)) >= steps
                                 and (_epoch(n01, "step", epoch), _epoch(n02, "step", epoch))),
                        90, f"epoch {epoch} at world 2", logs)
        assert {x["world"] for x in a + b} == {"2"}
        assert {x["rank"] for x in a} == {"0"} and {x["rank"] for x in b} == {"1"}
        by_step = {x["step"]: x["params"] for x in b}
        common = [x for x in a if x["step"] in by_step]
        assert common and all(x["params"] == by_step[x["step"]] for x in common)
        if steps > 1:
            assert len({x["params"] for x in a}) > 1, "the parameters change as it trains"

    def resumed_alone(epoch: int, checkpoint: str) -> None:
        start = wait_for(lambda: _epoch(n01, "start", epoch), 90, f"epoch {epoch} on n01",
                         logs)[0]
        assert (start["world"], start["resumed"], start["step"]) == ("1", "yes", checkpoint)
        first = wait_for(lambda: _epoch(n01, "step", epoch), 60, f"a step in epoch {epoch}",
                         logs)[0]
        assert first["world"] == "1" and int(first["step"]) == int(checkpoint) + 1
        assert co.current("4242").members == ("n01",)
        assert not _epoch(n02, "start", epoch)

    try:
        same_params_on_both_ranks(0, steps=3)
        # planned shrink: checkpoint first, then epoch 1 at world 1 exactly from it
        t0 = time.monotonic()
        with daemon.lock:
            co.set_target("4242", ["n01"], time.time())
        wait_for(lambda: _epoch(n01, "step", 1), 90, "epoch 1", logs)
        print(f"\nplanned shrink 2→1: first step of the new epoch after "
              f"{time.monotonic() - t0:.1f} s")
        saved = _epoch(n01, "checkpoint", 0)
        assert saved and any(r.ckpt is not None and r.epoch == 0 for r in daemon.reports)
        last0 = max(int(x["step"]) for x in _epoch(n01, "step", 0))
        assert int(saved[-1]["step"]) <= last0
        resumed_alone(1, saved[-1]["step"])
        assert procs[1].poll() is None, "n02's launcher waits for orders"

        # grow back to n02: checkpoint in epoch 1, both ranks resume from it in epoch 2
        wait_for(lambda: len(_epoch(n01, "step", 1)) >= 2, 60, "progress in epoch 1", logs)
        t0 = time.monotonic()
        with daemon.lock:
            co.set_target("4242", ["n01", "n02"], time.time())
        starts = wait_for(lambda: (len(_epoch(n01, "start", 2) + _epoch(n02, "start", 2)) == 2
                                   and _epoch(n01, "start", 2) + _epoch(n02, "start", 2)),
                          90, "epoch 2 on both nodes", logs)
        ckpt1 = _epoch(n01, "checkpoint", 1)
        assert ckpt1, "the grow was preceded by a checkpoint"
        assert {(x["world"], x["resumed"], x["step"], x["params"]) for x in starts} == \
            {("2", "yes", ckpt1[-1]["step"], starts[0]["params"])}
        same_params_on_both_ranks(2, steps=1)
        print(f"planned grow 1→2: first step of the new epoch after "
              f"{time.monotonic() - t0:.1f} s")
        same_params_on_both_ranks(2, steps=2)

        # preemption: Slurm SIGTERMs n02's task, the daemon learns the node is lost
        t0 = time.monotonic()
        rc, took = terminate(procs[1])
        assert rc == 128 + signal.SIGTERM and took < 2
        with daemon.lock:
            co.set_target("4242", ["n01"], time.time(), lost=["n02"])
            assert co.current("4242").number == 3, "no checkpoint wait on a preemption"
        resumed_alone(3, _last_checkpoint(n01))
        print(f"preemption 2→1: launcher gone after {took:.2f} s, first step of the new "
              f"epoch after {time.monotonic() - t0:.1f} s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        daemon.close()


def test_refusals_end_an_idle_launcher_but_never_a_running_epoch(munged, tmp_path):
    from malletrain_core.wire.api import ApiError

    class Refusing:
        calls = 0

        def call(self, op, **args):
            Refusing.calls += 1
            raise ApiError("job 12 belongs to uid 7, not to uid 8")

    la = mr.Launcher(mr.Identity("12", "0", "n01"), ["true"], Refusing(), munged.client(),
                     checkpoint_dir=str(tmp_path), control_dir=str(tmp_path), poll_s=0.001,
                     max_backoff_s=0.001)
    assert la.run() == 2 and Refusing.calls == 10
    la.state = LauncherState.RUNNING  # as if an epoch were running: keep it, keep asking
    la.workers = None
    Refusing.calls = 0

    def stop_after_20(seconds):
        if Refusing.calls >= 20:
            raise KeyboardInterrupt

    la.sleep = stop_after_20
    with pytest.raises(KeyboardInterrupt):
        la.run()
    assert Refusing.calls == 20
