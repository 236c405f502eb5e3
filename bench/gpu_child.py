"""The child half of :mod:`bench.gpu`: what runs in the fresh processes each part starts.

    python -m bench.gpu_child NAME SPEC_JSON

runs the child ``NAME`` (:data:`CHILDREN`) with ``SPEC_JSON`` (its backend, world, rank, port
and the part's own settings, made by :mod:`bench.gpu_parts`) and prints its result as one line
``RESULT <json>``, which the parent reads. Each child measures from its own start: it imports
no torch before its part does, and nothing of the parent.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULT = "RESULT "


def last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


def _device(spec: dict[str, Any]) -> Any:
    """This rank's device: its GPU (bound the way Elastic binds it) or the CPU."""
    import torch

    if spec["backend"] != "nccl":
        return torch.device("cpu")
    from malletrain_core.worker import inplace

    return torch.device("cuda", inplace.bind_device())


def _sync(dev: Any) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _group(spec: dict[str, Any], store: Any, dev: Any, prefix: str, eager: bool = True) -> None:
    import datetime as dt

    import torch.distributed as dist

    extra = {"device_id": dev} if eager and dev.type == "cuda" else {}
    dist.init_process_group(spec["backend"], store=dist.PrefixStore(prefix, store),
                            rank=spec["rank"], world_size=spec["world"],
                            timeout=dt.timedelta(seconds=120), **extra)


def _store(spec: dict[str, Any]) -> Any:
    import datetime as dt

    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", spec["port"], spec["world"], spec["rank"] == 0,
                         timeout=dt.timedelta(seconds=120))


def child_stale(spec: dict[str, Any]) -> dict[str, Any]:
    """Alternate fixed and naive reads of an async all-reduce's result; count stale ones."""
    import torch
    import torch.distributed as dist

    from malletrain_core.worker import inplace

    dev = _device(spec)
    _group(spec, _store(spec), dev, "stale")
    world, rank = spec["world"], spec["rank"]
    op: Any = dist.ReduceOp.SUM
    factor = 1.0
    if world == 1:
        make = getattr(dist, "_make_nccl_premul_sum", None)
        if dev.type != "cuda" or make is None:
            return {"observable": False, "why": "world 1 needs NCCL's PREMUL_SUM so that the "
                    "result differs from the input"}
        op, factor = make(2.0), 2.0
    t = torch.empty(spec["numel"], dtype=torch.float32, device=dev)
    counts = {way: {"trials": 0, "stale_reads": 0, "early": 0, "wrong_final": 0}
              for way in ("fixed", "naive")}
    for trial in range(2 * spec["trials"]):
        way = "fixed" if trial % 2 == 0 else "naive"
        base = float(trial % 1000 + 1)
        t.fill_(base + rank)
        expected = factor * (world * base + world * (world - 1) / 2)
        work = dist.all_reduce(t, op=op, async_op=True)
        inplace._Pending(device_sync=way == "fixed").wait(work)
        early = not work.is_completed()
        seen = float(t[-1].item())  # the host read, on the caller's stream
        _sync(dev)
        c = counts[way]
        c["trials"] += 1
        c["early"] += int(early)
        c["stale_reads"] += int(seen != expected)
        c["wrong_final"] += int(float(t[-1].item()) != expected)
    dist.destroy_process_group()
    return {"observable": True, "numel": spec["numel"], **counts}


def child_communicator(spec: dict[str, Any]) -> dict[str, Any]:
    """Init (eager or lazy) and the first two all-reduces, in a fresh process."""
    import torch
    import torch.distributed as dist

    dev = _device(spec)
    torch.zeros(1, device=dev)  # the CUDA context, made before the clocks start
    _sync(dev)
    store = _store(spec)
    t0 = time.perf_counter()
    _group(spec, store, dev, "comm", eager=spec["eager"])
    t1 = time.perf_counter()
    x = torch.ones(1024, device=dev)
    dist.all_reduce(x)
    _sync(dev)
    t2 = time.perf_counter()
    dist.all_reduce(x)
    _sync(dev)
    t3 = time.perf_counter()
    dist.destroy_process_group()
    return {"eager": spec["eager"], "init_s": t1 - t0, "first_allreduce_s": t2 - t1,
            "second_allreduce_s": t3 - t2}


def child_reform(spec: dict[str, Any]) -> dict[str, Any]:
    """Re-forms (destroy, init, first all-reduce) and abandons (let go, new group)."""
    import torch
    import torch.distributed as dist

    from malletrain_core.worker import inplace

    dev = _device(spec)
    store = _store(spec)
    x = torch.ones(1024, device=dev)
    _group(spec, store, dev, "r0")
    dist.all_reduce(x)
    _sync(dev)
    rows: dict[str, list[float]] = {k: [] for k in (
        "destroy_s", "init_s", "first_allreduce_s", "pause_s", "let_go_s", "abandon_reform_s")}
    for i in range(spec["rounds"]):
        t0 = time.perf_counter()
        dist.destroy_process_group()
        t1 = time.perf_counter()
        _group(spec, store, dev, f"r{i + 1}")
        t2 = time.perf_counter()
        dist.all_reduce(x)
        _sync(dev)
        t3 = time.perf_counter()
        rows["destroy_s"].append(t1 - t0)
        rows["init_s"].append(t2 - t1)
        rows["first_allreduce_s"].append(t3 - t2)
        rows["pause_s"].append(t3 - t0)
    # The way Elastic re-forms now: the old group forgotten, shut down in a thread, the new
    # one formed beside it and trained on at once; all-reduces are counted until every
    # rank's old group has shut down (each round all-reduces a "mine is done" flag too, so
    # that the ranks stop together: a rank that stopped alone left its peer's all-reduce
    # without a partner, 1 run in 1 at a load of 3 on the 2-core machine).
    for key in ("side_pause_s", "side_teardown_s", "side_overlap_ops"):
        rows[key] = []
    for i in range(spec["rounds"]):
        t0 = time.perf_counter()
        side = _beside("shutdown")
        _group(spec, store, dev, f"s{i}")
        dist.all_reduce(x)
        _sync(dev)
        rows["side_pause_s"].append(time.perf_counter() - t0)
        ops = 0
        while True:  # until every rank's old group is shut down (they must stop together)
            dist.all_reduce(x)
            flag = torch.tensor([1.0 if side.done.is_set() else 0.0], device=dev)
            dist.all_reduce(flag)
            _sync(dev)
            ops += 1
            if int(flag.item()) == spec["world"]:
                break
        rows["side_teardown_s"].append(side.seconds)
        rows["side_overlap_ops"].append(float(ops))
    action = inplace.abandon_action(dist.get_backend())
    if action == "abort":  # NCCL: the abort beside the new group, as Elastic lets it go
        rows["bg_abandon_pause_s"], rows["bg_abort_s"] = [], []
        for i in range(spec["abandons"]):
            dist.all_reduce(x, async_op=True)  # an operation in flight when the group goes
            t0 = time.perf_counter()
            side = _beside("abort")
            _group(spec, store, dev, f"b{i}")
            dist.all_reduce(x)
            _sync(dev)
            rows["bg_abandon_pause_s"].append(time.perf_counter() - t0)
            side.done.wait(60)
            rows["bg_abort_s"].append(side.seconds)
    let_go = inplace._abort_default_group if action == "abort" else inplace._forget_default_group
    error = ""
    try:
        for i in range(spec["abandons"]):
            dist.all_reduce(x, async_op=True)  # an operation in flight when the group goes
            t0 = time.perf_counter()
            let_go()
            t1 = time.perf_counter()
            _group(spec, store, dev, f"a{i}")
            dist.all_reduce(x)
            _sync(dev)
            t2 = time.perf_counter()
            rows["let_go_s"].append(t1 - t0)
            rows["abandon_reform_s"].append(t2 - t0)
        dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - the re-form figures above still stand
        error = f"{type(exc).__name__}: {last_line(str(exc))}"
    return {"abandon_action": action, **rows, **({"abandon_error": error} if error else {})}


def _beside(kind: str) -> Any:
    """The current default group, forgotten and let go in a thread the way ``Elastic`` does
    it (``inplace._Retiring``: ``done``, and ``seconds`` once done)."""
    import torch.distributed as dist

    from malletrain_core.worker import inplace

    group, backend = dist.group.WORLD, str(dist.get_backend())
    inplace._forget_default_group()
    return inplace._Retiring(kind, None, backend, [None, group, None], [])


def child_joiner(spec: dict[str, Any]) -> dict[str, Any]:
    """A joiner's start-up, part by part, from this process's start (``spec["spawned"]``).

    ``plain``: as torch does it, the first optimizer importing ``torch._dynamo``
    (``Optimizer.add_param_group`` is wrapped by ``torch._disable_dynamo``; the first ``step``
    imports it too), timed apart as ``dynamo_import_s``. ``deferred``: as a MalleTrain
    training process starts (``worker.startup.defer_dynamo``, what ``training.Session`` does),
    where nothing imports it; ``dynamo_loaded`` says whether anything did after all."""
    t0 = time.time()
    import torch  # noqa: PLC0415 - the import is what is timed
    t1 = time.time()
    deferred = bool(spec.get("deferred"))
    if deferred:
        from malletrain_core.worker import startup

        startup.defer_dynamo()
    else:
        os.environ["MALLETRAIN_DEFER_DYNAMO"] = "0"
    t1d = time.time()
    dev = torch.device("cuda", 0) if spec["backend"] == "nccl" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    torch.zeros(1, device=dev)
    _sync(dev)
    t2 = time.time()
    nas = _load_example("nas_cell")
    model = nas.Network(nas.random_cell(3)).to(dev)
    _sync(dev)
    t3 = time.time()
    if not deferred:
        importlib.import_module("torch._dynamo")
    t3d = time.time()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    t4 = time.time()
    marks = [t4]
    for step in range(2):
        x, y = nas.batch(3, step, 0, 16)
        loss = torch.nn.functional.cross_entropy(model(x.to(dev)), y.to(dev))
        opt.zero_grad()
        loss.backward()
        opt.step()
        _sync(dev)
        marks.append(time.time())
    return {"interpreter_s": t0 - spec["spawned"], "import_torch_s": t1 - t0,
            "defer_s": t1d - t1, "cuda_context_s": t2 - t1d, "model_s": t3 - t2,
            "dynamo_import_s": t3d - t3, "optimizer_s": t4 - t3d,
            "first_step_s": marks[1] - marks[0], "second_step_s": marks[2] - marks[1],
            "ready_s": t4 - spec["spawned"], "total_s": marks[2] - spec["spawned"],
            "dynamo_loaded": float("torch._dynamo" in sys.modules)}


def child_elastic(spec: dict[str, Any]) -> dict[str, Any]:
    """An ``inplace.Elastic`` process driven by membership files: one JSON line per step."""
    import torch
    from torch import nn

    from malletrain_core.worker import inplace, training

    dev = _device(spec)
    session = training.Session(handle_sigterm=False, checkpoint_every_s=3600.0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    el = inplace.Elastic(session, model, opt, backend=spec["backend"], collective_timeout_s=60)
    shown = retired = 0
    for _step in el.steps(0):
        with el.guard():
            x = torch.randn(64, 256, device=dev)
            y = torch.randint(0, 10, (64,), device=dev)
            loss = nn.functional.cross_entropy(el.net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            _sync(dev)
        for change in el.changes[shown:]:
            print(json.dumps({"change": change}), flush=True)
        shown = len(el.changes)
        for gone in el.retired[retired:]:
            print(json.dumps({"retired": gone}), flush=True)
        retired = len(el.retired)
        print(json.dumps({"t": time.time(), "step": el.step, "epoch": el.epoch,
                          "failed": el._step_failed, **_footprint(dev)}), flush=True)
        time.sleep(spec["sleep"])
    el.close()
    return {}


def _footprint(dev: Any) -> dict[str, float]:
    """This process's resident memory, threads and (CUDA) allocated and reserved memory."""
    import torch

    with open("/proc/self/status") as f:
        status = dict(ln.split(":", 1) for ln in f if ":" in ln)
    out = {"rss_mb": int(status["VmRSS"].split()[0]) / 1024,
           "threads": float(int(status["Threads"]))}
    if dev.type == "cuda":
        out["gpu_allocated_mb"] = torch.cuda.memory_allocated(dev) / 2**20
        out["gpu_reserved_mb"] = torch.cuda.memory_reserved(dev) / 2**20
    return out


def _load_example(name: str) -> Any:
    import importlib.util

    path = REPO / "examples" / f"{name}.py"
    loaded = importlib.util.spec_from_file_location(f"bench_gpu_{name}", path)
    assert loaded is not None and loaded.loader is not None
    module = importlib.util.module_from_spec(loaded)
    sys.modules[loaded.name] = module
    loaded.loader.exec_module(module)
    return module


CHILDREN = {"stale": child_stale, "communicator": child_communicator, "reform": child_reform,
            "joiner": child_joiner, "elastic": child_elastic}


def child_main(name: str, spec: dict[str, Any]) -> int:
    out = CHILDREN[name](spec)
    print(RESULT + json.dumps(out), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    name, spec = sys.argv[1:3] if argv is None else argv
    return child_main(name, json.loads(spec))


if __name__ == "__main__":
    sys.exit(main())
