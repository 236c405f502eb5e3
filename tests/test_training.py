"""The training-side API: reports on the wire, checkpoint requests, atomic checkpoints."""

from __future__ import annotations

import socket

import pytest

from malletrain_core.wire import reports
from malletrain_core.worker import training

KEY = b"k" * 32


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


@pytest.fixture
def receiver():
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(2)
    yield sock
    sock.close()


def env_for(tmp_path, sock, rank=0):
    return {training.ENV_JOB: "7", training.ENV_EPOCH: "2", "RANK": str(rank), "WORLD_SIZE": "2",
            training.ENV_REPORT_ADDR: f"127.0.0.1:{sock.getsockname()[1]}",
            training.ENV_REPORT_KEY: KEY.hex(),
            training.ENV_CHECKPOINT_DIR: str(tmp_path / "ckpt"),
            training.ENV_CONTROL_DIR: str(tmp_path)}


def test_scale_lr():
    assert training.scale_lr(0.1, 1024, 256) == pytest.approx(0.4)
    with pytest.raises(ValueError):
        training.scale_lr(0.1, 0, 256)


def test_reports_are_signed_and_rate_limited(tmp_path, receiver):
    clock = Clock()
    s = training.Session(env=env_for(tmp_path, receiver), clock=clock, report_interval_s=2,
                         handle_sigterm=False)
    s.report(64)                       # first report goes out at once
    clock.t += 1
    s.report(64)                       # within the interval: counted, not sent
    clock.t += 1.5
    s.report(64)
    first = reports.verify(receiver.recv(2048), KEY)
    second = reports.verify(receiver.recv(2048), KEY)
    assert (first.job, first.epoch, first.world, first.samples) == ("7", 2, 2, 64)
    assert second.samples == 192 and second.seq == first.seq + 1


def test_other_ranks_send_nothing(tmp_path, receiver):
    s = training.Session(env=env_for(tmp_path, receiver, rank=1), handle_sigterm=False)
    s.report(10, force=True)
    receiver.settimeout(0.2)
    with pytest.raises(socket.timeout):
        receiver.recv(2048)
    assert not s.should_checkpoint()


def test_no_launcher_environment_is_a_plain_run(tmp_path):
    s = training.Session(env={training.ENV_CHECKPOINT_DIR: str(tmp_path)}, handle_sigterm=False)
    s.report(5, force=True)
    assert s.samples == 5 and s.rank == 0 and s.world_size == 1


def test_checkpoint_request_flag(tmp_path, receiver):
    clock = Clock()
    s = training.Session(env=env_for(tmp_path, receiver), clock=clock, checkpoint_every_s=1e9,
                         handle_sigterm=False)
    assert not s.should_checkpoint()
    flag = tmp_path / training.REQUEST_NAME
    flag.write_text("1")
    import os
    os.utime(flag, (clock.t + 5, clock.t + 5))
    assert s.should_checkpoint()


@pytest.mark.torch
def test_checkpoint_is_atomic_unwrapped_and_acknowledged(tmp_path, receiver):
    torch = pytest.importorskip("torch")
    clock = Clock()
    s = training.Session(env=env_for(tmp_path, receiver), clock=clock, handle_sigterm=False)
    s.report(100, force=True)
    receiver.recv(2048)
    model = torch.nn.Linear(3, 2)
    wrapped = {"module." + k: v for k, v in model.state_dict().items()}
    path = s.checkpoint({"model": wrapped}, step=12)
    assert path is not None and path.exists()
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    ack = reports.verify(receiver.recv(2048), KEY)
    assert ack.ckpt == 12 and ack.samples == 100
    fresh = training.Session(env={training.ENV_CHECKPOINT_DIR: str(path.parent)},
                             handle_sigterm=False)
    payload = fresh.resume()
    assert payload["step"] == 12 and fresh.samples == 100
    other = torch.nn.Linear(3, 2)
    other.load_state_dict(payload["state"]["model"])
    assert torch.equal(other.weight, model.weight)


@pytest.mark.torch
def test_a_failed_checkpoint_keeps_the_last_one_and_training_goes_on(tmp_path, receiver,
                                                                      monkeypatch, capsys):
    """A full or read-only checkpoint folder: the save fails without raising, the partial
    file is gone, the previous checkpoint is intact, one line says why (not one per try), the
    daemon gets no acknowledgement, and the next period tries again."""
    torch = pytest.importorskip("torch")
    clock = Clock()
    s = training.Session(env=env_for(tmp_path, receiver), clock=clock, checkpoint_every_s=10,
                         handle_sigterm=False)
    assert s.checkpoint({"w": torch.zeros(2)}, step=5) is not None
    reports.verify(receiver.recv(2048), KEY)  # the acknowledgement of step 5
    real_save = torch.save

    def full_disk(obj, fh):
        fh.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    flag = tmp_path / training.REQUEST_NAME
    flag.write_text("1")  # the daemon asks for a checkpoint
    import os
    os.utime(flag, (clock.t + 5, clock.t + 5))
    clock.t += 11
    assert s.should_checkpoint()
    for step in (9, 10):
        assert s.checkpoint({"w": torch.ones(2)}, step=step) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left on device" in err[0] and "step 9" in err[0], err
    assert not [p for p in (tmp_path / "ckpt").iterdir() if p.name.endswith(".tmp")]
    assert not s.should_checkpoint(), "a failed save must not be retried at every step"
    receiver.settimeout(0.2)
    with pytest.raises(socket.timeout):
        receiver.recv(2048)  # no acknowledgement of a checkpoint that was not made
    fresh = training.Session(env={training.ENV_CHECKPOINT_DIR: str(tmp_path / "ckpt")},
                             handle_sigterm=False)
    assert fresh.resume()["step"] == 5
    clock.t += 11
    assert s.should_checkpoint()  # the next period tries again
    monkeypatch.setattr(torch, "save", real_save)
    assert s.checkpoint({"w": torch.ones(2)}, step=30) is not None
    assert fresh.resume()["step"] == 30
