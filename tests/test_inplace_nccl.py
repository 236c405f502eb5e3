"""The NCCL side of the in-place path, checked on the CPU with stand-ins (the GPU check is
bench/gpu.py): no result of a collective is used before the collective itself is waited for,
setup errors are not taken for a lost peer, each process binds its own GPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from malletrain_core.worker import elastic, inplace  # noqa: E402


class QueuedWork:
    """A collective whose future is done once it is queued (NCCL's behaviour), and whose
    result is final only after ``wait()``: reading ``buf`` before it gives the stale value."""

    def __init__(self, buf: torch.Tensor, final: torch.Tensor, log: list[str]) -> None:
        self.buf, self.final, self.log = buf, final, log
        self.fut = torch.futures.Future()
        self.fut.set_result([buf])

    def get_future(self) -> torch.futures.Future:
        return self.fut

    def wait(self) -> bool:
        self.log.append("wait")
        self.buf.copy_(self.final)
        return True

    def is_completed(self) -> bool:
        return True


def test_a_wait_on_nccl_waits_for_the_work_itself() -> None:
    log: list[str] = []
    buf = torch.zeros(1)
    p = inplace._Pending(device_sync=True)
    p.wait(QueuedWork(buf, torch.ones(1) * 7, log))
    assert log == ["wait"] and int(buf[0]) == 7  # the host read after wait() is the result
    gloo = inplace._Pending()
    buf = torch.zeros(1)
    gloo.wait(QueuedWork(buf, torch.ones(1) * 7, log))
    assert log == ["wait"]  # gloo's future is its result: no extra call on the tested path


def test_the_ddp_hook_divides_the_reduced_buckets_not_the_queued_ones(monkeypatch) -> None:
    """The hook's result is the all-reduced bucket divided by the world: the division must
    come after the collective (on the GPU: after work.wait() on the caller's stream)."""
    log: list[str] = []

    class Bucket:
        def __init__(self) -> None:
            self.t = torch.ones(2)

        def buffer(self) -> torch.Tensor:
            return self.t

    b = Bucket()
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    monkeypatch.setattr(torch.distributed, "all_reduce",
                        lambda buf, async_op: QueuedWork(buf, torch.full((2,), 6.0), log))
    p = inplace._Pending(device_sync=True)
    out = p.hook(None, b)
    try:
        assert out.wait().tolist() == [3.0, 3.0] and log == ["wait"]
    finally:
        p.close()


@pytest.mark.parametrize("text, peer", [
    ("NCCL error in: ProcessGroupNCCL.cpp:1, invalid usage (run with NCCL_DEBUG=WARN for "
     "details), NCCL version 2.28.9\nncclInvalidUsage: This usually reflects invalid usage of "
     "NCCL library.\nLast error:\nDuplicate GPU detected : rank 1 and rank 0 both on CUDA "
     "device 1b000", False),
    ("No backend type associated with device type cpu", False),
    ("CUDA error: invalid device ordinal", False),
    ("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer", True),
    ("NCCL communicator was aborted on rank 1", True),
])
def test_setup_errors_are_not_a_lost_peer(text: str, peer: bool) -> None:
    assert bool(inplace.configuration_error(RuntimeError(text))) is not peer
    el = inplace.Elastic.__new__(inplace.Elastic)
    el._pending = inplace._Pending()
    if peer:  # NCCL's own errors are DistBackendError; gloo's a RuntimeError with its text
        kind = torch.distributed.DistBackendError if "NCCL" in text else RuntimeError
        assert el._is_peer_failure(kind(text))
    else:
        with pytest.raises(RuntimeError, match="^malletrain: ") as info:
            el._is_peer_failure(torch.distributed.DistBackendError(text))
        assert len(str(info.value).splitlines()) == 1


def test_each_process_binds_its_own_gpu(monkeypatch) -> None:
    bound: list[int] = []
    monkeypatch.setattr(torch.cuda, "set_device", bound.append)
    for var in ("LOCAL_RANK", "SLURM_LOCALID", "PALS_LOCAL_RANKID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(RuntimeError, match="sees no GPU"):
        inplace.bind_device()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert inplace.bind_device() == 2
    monkeypatch.setenv("LOCAL_RANK", "5")
    with pytest.raises(RuntimeError, match="local rank 5 but 4 GPUs visible"):
        inplace.bind_device()
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.setenv("SLURM_LOCALID", "3")
    assert inplace.bind_device() == 3
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # CUDA_VISIBLE_DEVICES=<one>
    assert inplace.bind_device() == 0
    assert bound == [2, 3, 0]


def test_the_boundary_agreement_puts_its_tensor_on_the_groups_device(monkeypatch) -> None:
    monkeypatch.setattr(torch.distributed, "get_backend", lambda: "gloo")
    assert elastic.group_device() == torch.device("cpu")
    monkeypatch.setattr(torch.distributed, "get_backend", lambda: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert elastic.group_device() == torch.device("cuda", 1)
