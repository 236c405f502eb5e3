"""``--device auto|cpu|cuda`` in the examples: auto is the GPU with NCCL when one is visible,
else the CPU with gloo; ``cuda`` without a GPU is one line; Elastic is told NCCL on a GPU; the
bring-your-own-loop pairs carry the same option on both sides (so it is not in their diffs).
The GPU side itself is run by bench/gpu.py on a machine that has one."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from script_module import ROOT, load_script

torch = pytest.importorskip("torch")

SCRIPTS = {"train_elastic": "examples/train_elastic.py", "nas_cell": "examples/nas_cell.py"}
OPTION = '"--device", choices=("auto", "cpu", "cuda"), default="auto"'


@pytest.fixture(scope="module", params=sorted(SCRIPTS))
def script(request: pytest.FixtureRequest) -> Any:
    return load_script(SCRIPTS[request.param], f"{request.param}_device")


def test_auto_is_the_cpu_without_a_gpu_and_cuda_is_refused_in_one_line(script, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert script.pick_device("auto") == torch.device("cpu")
    assert script.pick_device("cpu") == torch.device("cpu")
    with pytest.raises(SystemExit) as info:
        script.pick_device("cuda")
    text = str(info.value)
    assert text.startswith("--device cuda: ") and "no GPU" in text and "\n" not in text
    assert script.parse_args([]).device == "auto"
    with pytest.raises(SystemExit):
        script.parse_args(["--device", "tpu"])


def test_auto_binds_the_processs_gpu_when_one_is_visible(script, monkeypatch):
    bound: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", bound.append)
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert script.pick_device("auto") == torch.device("cuda", 2)
    assert script.pick_device("cpu") == torch.device("cpu")  # cpu stays cpu with a GPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # CUDA_VISIBLE_DEVICES=<one>
    assert script.pick_device("cuda") == torch.device("cuda", 0)
    assert bound == [2, 0]


class _Stop(Exception):
    pass


class _Stays(torch.nn.Linear):  # type: ignore[name-defined,misc]
    """A model that stays on the CPU whatever device it is sent to (no GPU here)."""

    def to(self, *_args: Any, **_kwargs: Any) -> _Stays:  # type: ignore[override]
        return self


@pytest.mark.parametrize("device, backend", [("cuda", "nccl"), ("cpu", "gloo")])
def test_elastic_is_told_nccl_on_a_gpu(script, monkeypatch, tmp_path: Path, device: str,
                                       backend: str) -> None:
    monkeypatch.setenv("MALLETRAIN_CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.setattr(torch, "set_num_threads", lambda _n: None)  # nas_cell's --threads
    monkeypatch.setattr(script, "pick_device", lambda _name: SimpleNamespace(type=device))
    for builder in ("build_model", "Network"):
        if hasattr(script, builder):
            monkeypatch.setattr(script, builder, lambda *_a: _Stays(2, 2))
    seen: dict[str, Any] = {}

    def elastic(*_args: Any, **kwargs: Any) -> None:
        seen.update(kwargs)
        raise _Stop

    monkeypatch.setattr(script.inplace, "Elastic", elastic)
    with pytest.raises(_Stop):
        script.main(["--steps", "1"])
    assert seen["backend"] == backend


@pytest.mark.parametrize("name", ["torchrun", "lightning", "hf"])
def test_both_sides_of_each_byo_pair_take_the_device_option(name: str) -> None:
    for side in ("before", "after"):
        text = (ROOT / "examples" / name / f"{side}.py").read_text()
        assert OPTION in text, f"{name}/{side}.py"
        assert "use_cpu=True" not in text and 'accelerator="cpu"' not in text
        assert 'init_process_group("gloo")' not in text


@pytest.mark.torch
def test_train_elastic_trains_on_the_cpu_with_auto(monkeypatch, tmp_path: Path, capsys) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("MALLETRAIN_CHECKPOINT_DIR", str(tmp_path))
    mod = load_script(SCRIPTS["train_elastic"], "train_elastic_auto")
    assert mod.main(["--steps", "2", "--batch", "4", "--log-every", "1"]) == 0
    out = capsys.readouterr().out
    assert "step=2 " in out and "done step=2 world=1 rank=0" in out
