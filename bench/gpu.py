"""The in-place path on GPUs: NCCL's costs and pitfalls, measured on the CUDA devices of this host.

    python -m bench.gpu --json                       # prints the figures as one JSON object
    python -m bench.gpu --markdown BENCHMARKS.md     # and rewrites the GPU section there
    python -m bench.gpu --cpu-check --json           # the same parts on the CPU with gloo:
                                                     # checks the script, not a GPU figure

Without a CUDA device (no torch, a CPU build, ``CUDA_VISIBLE_DEVICES=``) it prints
``{"bench": "gpu", "skipped": "<reason>"}`` and exits 0 at once. Every part runs in fresh
Python processes (each measures from its own start; NCCL's state does not carry between
parts), on world 1 (one GPU, a local TCPStore) and, where 2 GPUs are visible, world 2 (else
that part says why it was skipped):

1. **stale reads** (``stale``) — many trials of an async all-reduce of a large tensor (1 GiB)
   followed by a host read of its last element, alternating the way
   ``inplace._Pending(device_sync=True).wait`` does it now (future done → ``value()`` →
   ``work.wait()`` → read) and the naive way (``_Pending(device_sync=False)``, the gloo path:
   future done → ``value()`` → read). NCCL completes a work's future when the collective is
   queued, not when it has run: ``stale_reads`` counts reads that saw the tensor before the
   collective wrote it (expected 0 for the fixed way), ``early`` the reads issued while the
   work had not finished. World 1 uses NCCL's PREMUL_SUM (×2), so that the result differs from
   the input even with one rank.
2. **eager vs lazy communicator** (``communicator``) — ``init_process_group`` with
   ``device_id`` (the communicator made at once) or without (made by the first collective):
   the init and the first and second all-reduce, each in a fresh process, alternating.
3. **re-form and abort** (``reform``) — in one process: destroy the group, init a new one
   (eager), its first all-reduce: the pause of a re-form as it was; then **beside**, as
   ``Elastic`` re-forms now: the old group forgotten and shut down in a thread
   (``inplace._shutdown_group``) while the new one is formed and all-reduced on (the pause, the
   shut-down's own time, and how many all-reduces ran on the new group meanwhile); then an
   ``abandon``: the group let go the way ``inplace.abandon_action`` says for the backend (NCCL:
   ``_abort_default_group``, gloo: ``_forget_default_group``) and a new group formed, and on
   NCCL the same with the abort in a thread (``inplace._abort_group``).
4. **Elastic's own re-form** (``elastic``) — one ``inplace.Elastic`` process at world 1 driven
   through membership files as the launcher does: start → ready, planned re-forms and
   ``abandon`` re-forms, each epoch at least 1.5 s (longer than an NCCL abort, as re-forms
   seconds apart are: a re-form that comes sooner waits for the last group's tear-down, at
   most one being let go at a time; the leak check shows that case); the pause is the gap
   between the last step timestamp in the old epoch and the first in the new one (as in
   docs/inplace.md), with Elastic's own ``reform_s`` (and
   its pieces: the wait for the last group, the store, the init, the hand-over) and
   what letting go of each old group took in its thread (``Elastic.retired``).
5. **joiner start-up** (``joiner``) — fresh processes timing ``import torch``, the first CUDA
   context, building the NAS example's model, the first optimizer, the first and second step:
   as torch starts them (``torch._dynamo`` imported by the first optimizer, timed apart) and as
   a MalleTrain training process does (``worker.startup.defer_dynamo``: never imported),
   alternated.
6. **leak check** (``leak``) — ``--leak-reforms`` (200) planned re-forms of one ``Elastic``
   process: resident memory, threads and GPU memory (allocated and reserved) from a quarter
   of them (the first NCCL re-forms warm up host memory) to the last, and the resident
   memory at every 20th; any growth fails the part.
7. **the examples** (``examples``) — examples/train_elastic.py and examples/nas_cell.py alone
   (world 1) on ``--device cuda`` and ``--device cpu``: the median step time after warm-up;
   examples/torchrun/after.py (and the Lightning and Hugging Face ones where installed) run on
   ``--device cuda`` as a check that they work there, started as a user would (no
   ``LOCAL_RANK`` without ``RANK``).

A part that fails is named in ``failed`` with its error's last line and the others go on (exit
1); ``--budget-s`` (default 540 s, for a 10-minute slot on a lent GPU machine) skips the parts
that no longer fit, saying so, and ``--parts`` runs a few of them (``--parts stale,reform``).

Over 400 lines on purpose: each measured part has a parent half and a child half (the child is
this file run again with ``--child``), kept side by side so that a part reads as one unit.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if not __package__:  # started as a file: bench/ is a package, run from the repository's root
    sys.exit("run it as a module from the repository's root: python -m bench.gpu "
             + " ".join(sys.argv[1:]))

from bench.sections import host, replace_section  # noqa: E402

BEGIN, END = "<!-- gpu:begin -->", "<!-- gpu:end -->"
HEADING = "GPU: the in-place path on NCCL"
RESULT = "RESULT "
STALE_NUMEL = 1 << 28          # 1 GiB of float32: a collective long enough to race a read
STEP_LINE = re.compile(r"^(start )?step=\d+ ")  # train_elastic.py: its start, then each step
PARTS = ("stale", "communicator", "reform", "elastic", "joiner", "leak", "examples")


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    """The next master port of 29500-29999 (the daemon's default range) that can be bound now
    (``inplace.PortCycle``). A port bound to 0 and let go was taken on an H100 before the
    training process bound it, and a TIME_WAIT kept its store from listening for 32 and 58 s."""
    from malletrain_core.worker.inplace import PortCycle

    global _ports
    if _ports is None:
        _ports = PortCycle(29500, 29999)
    return _ports()


_ports: Any = None


def median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 4) if xs else None


def spread(xs: list[float]) -> dict[str, Any]:
    """Median, min, max and every value (rounded), for a list of seconds."""
    if not xs:
        return {"median": None, "min": None, "max": None, "all": []}
    return {"median": median(xs), "min": round(min(xs), 4), "max": round(max(xs), 4),
            "all": [round(x, 4) for x in xs]}


# ----- what the host offers -----------------------------------------------------------------

def probe() -> dict[str, Any]:
    """torch's and CUDA's versions and the visible GPUs, or ``skipped`` with the reason.
    Creates no CUDA context in this process (the children measure from theirs)."""
    try:
        import torch
    except ImportError as exc:
        return {"skipped": f"torch is not installed ({exc})"}
    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if not torch.cuda.is_available():
        why = ("a CPU build of torch" if torch.version.cuda is None else
               "no CUDA device visible (CUDA_VISIBLE_DEVICES, the driver)")
        return {**info, "skipped": f"no CUDA: {why}, torch {torch.__version__}"}
    count = torch.cuda.device_count()
    try:  # nvidia-smi: naming the GPUs through torch would make a CUDA context here
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=30,
                               check=True).stdout.split("\n")
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None and all(v.strip().isdigit() for v in visible.split(",") if v):
            names = [names[int(v)] for v in visible.split(",") if v.strip()]
        info["gpus"] = [n.strip() for n in names if n.strip()][:count]
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        info["gpus"] = []
    if len(info["gpus"]) != count:
        info["gpus"] = ["CUDA GPU"] * count
    try:
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as exc:  # noqa: BLE001 - reported, not fatal
        info["nccl"] = f"unknown ({type(exc).__name__})"
    return info


def machine(info: dict[str, Any]) -> str:
    gpus = info.get("gpus") or []
    first = (f"{len(gpus)} × {gpus[0]}" if len(set(gpus)) == 1 else ", ".join(gpus)) or "no GPU"
    return host(f"{first}, torch {info.get('torch')}, CUDA {info.get('cuda')}, "
                f"NCCL {info.get('nccl')}")


# ----- the child processes --------------------------------------------------------------------

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
        error = f"{type(exc).__name__}: {_last_line(str(exc))}"
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


# ----- the parent: running children ---------------------------------------------------------

class PartFailed(RuntimeError):
    """A part's child failed: the message is its error's last line."""


class Budget:
    """What is left of ``--budget-s``: a part that does not fit is skipped, saying so, and no
    child is waited for past it."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def cap(self, timeout_s: float) -> float:
        """``timeout_s``, or less where the budget ends sooner (at least 5 s)."""
        return max(5.0, min(timeout_s, self.left()))


BUDGET = Budget(3600.0)  # replaced by run() with --budget-s


def _env(rank: int | None = 0, extra: dict[str, str] | None = None) -> dict[str, str]:
    """A child's environment; ``rank`` None: an example, started as a user would, with no
    ``LOCAL_RANK`` (the Hugging Face Trainer takes one without ``RANK`` for an ``env://``
    group and fails)."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONUNBUFFERED="1")
    for name in ("LOCAL_RANK", "RANK", "WORLD_SIZE"):
        env.pop(name, None)
    if rank is not None:
        env["LOCAL_RANK"] = str(rank)
    env.update(extra or {})
    return env


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


def run_children(name: str, specs: list[dict[str, Any]], timeout_s: float) -> list[dict[str, Any]]:
    """Start one child per spec (the ranks of one group), wait for all, return their RESULTs.
    Their output goes to files: a rank blocked on a full pipe would stall the others' group."""
    timeout_s = BUDGET.cap(timeout_s)
    with tempfile.TemporaryDirectory(prefix="bench-gpu-child-") as tmp:
        procs = []
        for spec in specs:
            spec = {**spec, "spawned": time.time()}
            out = open(Path(tmp) / f"{spec.get('rank', 0)}.out", "w+")
            procs.append((subprocess.Popen(
                [sys.executable, "-m", "bench.gpu", "--child", name, "--spec",
                 json.dumps(spec)], env=_env(spec.get("rank", 0)), stdout=out,
                stderr=subprocess.STDOUT, text=True), out))
        deadline = time.monotonic() + timeout_s
        try:
            for proc, _ in procs:
                try:
                    proc.wait(timeout=max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    for q, _ in procs:
                        q.kill()
                        q.wait()
                    raise PartFailed(f"{name}: no result within {timeout_s:.0f} s") from None
            results = []
            for proc, out in procs:
                out.seek(0)
                text = out.read()
                got = [ln[len(RESULT):] for ln in text.splitlines() if ln.startswith(RESULT)]
                if proc.returncode != 0 or not got:
                    raise PartFailed(f"{name}: exit {proc.returncode}: {_last_line(text)}")
                results.append(json.loads(got[-1]))
            return results
        finally:
            for _, out in procs:
                out.close()


def group_specs(backend: str, world: int, **extra: Any) -> list[dict[str, Any]]:
    port = free_port()
    return [{"backend": backend, "world": world, "rank": r, "port": port, **extra}
            for r in range(world)]


def part_stale(backend: str, world: int, trials: int, numel: int) -> dict[str, Any]:
    out = run_children("stale", group_specs(backend, world, trials=trials, numel=numel), 240)
    r0 = out[0]
    if not r0.get("observable"):
        return r0
    total = {way: {k: sum(o[way][k] for o in out) for k in r0[way]} for way in ("fixed",
                                                                              "naive")}
    return {"observable": True, "numel": numel, "bytes": numel * 4, "ranks": world, **total}


def part_communicator(backend: str, world: int, rounds: int) -> dict[str, Any]:
    rows: dict[str, list[dict[str, Any]]] = {"eager": [], "lazy": []}
    for _ in range(rounds):
        for kind in ("eager", "lazy"):
            out = run_children("communicator", group_specs(backend, world, eager=kind == "eager"),
                               180)
            rows[kind].append(max(out, key=lambda o: o["init_s"] + o["first_allreduce_s"]))
    return {kind: {k: spread([r[k] for r in rs]) for k in ("init_s", "first_allreduce_s",
                                                           "second_allreduce_s")}
            for kind, rs in rows.items()}


def part_reform(backend: str, world: int, rounds: int, abandons: int) -> dict[str, Any]:
    out = run_children("reform", group_specs(backend, world, rounds=rounds, abandons=abandons),
                       240)
    r0 = out[0]
    return {"abandon_action": r0["abandon_action"], "rounds": rounds, "abandons": abandons,
            **{k: spread(v) for k, v in r0.items() if isinstance(v, list)},
            **({"abandon_error": r0["abandon_error"]} if "abandon_error" in r0 else {})}


def part_joiner(backend: str, runs: int) -> dict[str, Any]:
    """Fresh joiners as torch starts them (``plain``) and as a MalleTrain training process
    does (``deferred``, no ``torch._dynamo``), alternated so that both see the same machine."""
    rows: dict[str, list[dict[str, Any]]] = {"plain": [], "deferred": []}
    for _ in range(runs):
        for kind in rows:
            rows[kind].append(run_children("joiner", [{"backend": backend, "rank": 0,
                                                       "deferred": kind == "deferred"}],
                                           240)[0])
    plain = {k: spread([r[k] for r in rows["plain"]]) for k in rows["plain"][0]}
    return {**plain, "deferred": {k: spread([r[k] for r in rows["deferred"]])
                                  for k in rows["deferred"][0]}}


class Lines:
    """A child's stdout read by a thread: each line with the time it arrived."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[tuple[float, str]] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.lock:
                self.lines.append((time.time(), line.rstrip("\n")))

    def snapshot(self) -> list[tuple[float, str]]:
        with self.lock:
            return list(self.lines)

    def records(self) -> list[dict[str, Any]]:
        out = []
        for _, line in self.snapshot():
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out


def _wait(cond: Any, timeout_s: float, what: str, proc: subprocess.Popen[str]) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        if proc.poll() is not None:
            raise PartFailed(f"{what}: the process exited {proc.returncode}")
        if time.monotonic() > end:
            raise PartFailed(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(0.02)


def pauses(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each epoch after the first: the gap between the last step timestamp of the epoch
    before and the first of this one (docs/inplace.md's pause), and the steps' median
    interval in the epoch before."""
    steps = [r for r in records if "step" in r and "change" not in r and not r.get("failed")]
    by_epoch: dict[int, list[dict[str, Any]]] = {}
    for r in steps:
        by_epoch.setdefault(r["epoch"], []).append(r)
    out = []
    epochs = sorted(e for e in by_epoch if e is not None)
    for before, after in zip(epochs, epochs[1:]):
        old, new = by_epoch[before], by_epoch[after]
        ts = [r["t"] for r in old]
        gaps = [b - a for a, b in zip(ts, ts[1:])]
        out.append({"epoch": after, "pause_s": round(new[0]["t"] - old[-1]["t"], 4),
                    "step_interval_s": median(gaps)})
    return out


def part_elastic(backend: str, reforms: int, abandons: int, steps_per_epoch: int,
                 min_epoch_s: float = 0.0, settle_epoch: int = 10) -> dict[str, Any]:
    """One Elastic process re-formed ``reforms`` times as planned, then ``abandons`` times
    abandoning; each epoch lasts ``steps_per_epoch`` steps and at least ``min_epoch_s``
    (0: back to back, the next re-form may come while the last group is still being let go,
    and then waits for it: at most one old group is let go at a time)."""
    from malletrain_core.worker import inplace, training

    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        control = Path(tmp) / "control"
        control.mkdir()
        errors = open(Path(tmp) / "stderr", "w+")  # a file: a full pipe would stop the child
        env = _env(0, {training.ENV_CONTROL_DIR: str(control), training.ENV_INPLACE: "1",
                       training.ENV_CHECKPOINT_DIR: str(Path(tmp) / "checkpoints")})
        spawned = time.time()
        spec = {"backend": backend, "rank": 0, "sleep": 0.005}
        proc = subprocess.Popen([sys.executable, "-m", "bench.gpu", "--child",
                                 "elastic", "--spec", json.dumps(spec)], env=env,
                                stdout=subprocess.PIPE, stderr=errors, text=True)
        lines = Lines(proc)
        try:
            _wait(lambda: inplace.is_ready(control), BUDGET.cap(180), "Elastic ready", proc)
            ready_s = time.time() - spawned
            kinds: dict[int, str] = {}
            first_step_s = None
            for epoch in range(1 + reforms + abandons):
                abandon = epoch > reforms
                kinds[epoch] = "start" if epoch == 0 else ("abandon" if abandon else "planned")
                told = time.time()
                inplace.write_membership(control, inplace.Membership(
                    epoch=epoch, rank=0, world=1, master="127.0.0.1", port=free_port(),
                    abandon=abandon))

                def enough(e: int = epoch) -> bool:
                    return sum(1 for r in lines.records()
                               if r.get("epoch") == e and "step" in r) >= steps_per_epoch

                _wait(enough, BUDGET.cap(120), f"{steps_per_epoch} steps in epoch {epoch}",
                      proc)
                while time.time() - told < min_epoch_s:
                    time.sleep(0.01)
                if epoch == 0:
                    first = next(r for r in lines.records() if r.get("epoch") == 0)
                    first_step_s = first["t"] - told
            inplace.write_membership(control, inplace.Membership(epoch=1 + reforms + abandons))
            proc.wait(timeout=BUDGET.cap(60))
        except (PartFailed, subprocess.TimeoutExpired) as exc:
            proc.kill()
            proc.wait()
            errors.seek(0)
            raise PartFailed(f"{exc}: {_last_line(errors.read())}") from None
        finally:
            errors.close()
        lines.thread.join(timeout=5)
        records = lines.records()
    changes = [r["change"] for r in records if "change" in r]
    retired = [r["retired"] for r in records if "retired" in r]
    gaps = pauses(records)
    out: dict[str, Any] = {"ready_s": round(ready_s, 3),
                           "first_step_after_membership_s": round(first_step_s or 0.0, 4),
                           "exit_code": proc.returncode}
    for kind in ("planned", "abandon"):
        mine = [g for g in gaps if kinds.get(g["epoch"]) == kind]
        out[kind] = {"pause_s": spread([g["pause_s"] for g in mine]),
                     "reform_s": spread([c["reform_s"] for c in changes
                                         if c.get("epoch") in {g["epoch"] for g in mine}
                                         and "reform_s" in c]),
                     "step_interval_s": median([g["step_interval_s"] for g in mine
                                               if g["step_interval_s"] is not None]),
                     # where Elastic's reform_s went (inplace.Elastic._apply's phases)
                     "phases": {ph: spread([c[ph] for c in changes
                                            if c.get("epoch") in {g["epoch"] for g in mine}
                                            and ph in c])
                                for ph in ("wait_retiring_s", "store_s", "form_s",
                                           "hand_over_s")}}
    for kind in ("shutdown", "abort"):
        out[f"let_go_{kind}_s"] = spread([r["seconds"] for r in retired if r["kind"] == kind])
    out["min_epoch_s"] = min_epoch_s
    out["footprint"] = footprint(records, settle_epoch=min(settle_epoch, reforms))
    # resident memory at the first step of every 20th epoch: growth that goes on, or settles
    firsts: dict[int, float] = {}
    for r in records:
        if "step" in r and "rss_mb" in r and isinstance(r.get("epoch"), int):
            firsts.setdefault(r["epoch"], r["rss_mb"])
    out["rss_mb_by_epoch"] = {str(e): round(v, 1) for e, v in sorted(firsts.items())
                              if e % 20 == 0 or e == max(firsts)}
    return out


def footprint(records: list[dict[str, Any]], settle_epoch: int) -> dict[str, Any]:
    """Resident memory, threads and GPU memory at the first step of ``settle_epoch`` (once
    the allocators have settled) and at the last step: a leak shows as growth."""
    steps = [r for r in records if "step" in r and "rss_mb" in r]
    early = next((r for r in steps if r.get("epoch") == settle_epoch), None)
    if early is None or not steps:
        return {}
    late = steps[-1]
    keys = [k for k in ("rss_mb", "threads", "gpu_allocated_mb", "gpu_reserved_mb") if k in late]
    return {"from_epoch": settle_epoch, "to_epoch": late.get("epoch"),
            **{k: {"from": round(early[k], 1), "to": round(late[k], 1),
                   "growth": round(late[k] - early[k], 1)} for k in keys}}


def part_leak(backend: str, reforms: int) -> dict[str, Any]:
    """``reforms`` planned re-forms of one Elastic process (world 1, two steps each): its
    memory, threads and GPU memory from a quarter of them (at least the 10th) to the last,
    and what letting go took. On an H100 the resident memory grew 115 MB over the first 40
    NCCL re-forms (where, not traced), then 0.2 MB over the next 80: growth measured from
    the 10th re-form is that warm-up, which settles, not a leak that goes on."""
    out = part_elastic(backend, reforms, 0, 2, settle_epoch=max(10, reforms // 4))
    grew = {k: v["growth"] for k, v in out["footprint"].items() if isinstance(v, dict)}
    # the allocator's and the interpreter's noise: a few MiB of RSS; nothing else may grow
    out["leaked"] = bool(grew.get("rss_mb", 0) > 16 or grew.get("threads", 0) > 0
                         or grew.get("gpu_allocated_mb", 0) > 0
                         or grew.get("gpu_reserved_mb", 0) > 0)
    return out


def step_times(arrivals: list[float], warmup: int) -> dict[str, Any]:
    """Median interval between consecutive steps after ``warmup`` steps, and the first
    (``arrivals`` starts with the first step's start)."""
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    return {"steps": len(gaps), "step_s": median(gaps[warmup:]),
            "first_interval_s": round(gaps[0], 4) if gaps else None}


def run_example(argv: list[str], env: dict[str, str], timeout_s: float) -> tuple[int, float, str,
                                                                                 list[float]]:
    """Run one example; (exit code, wall seconds, last line of output, arrival time of each
    ``step=N`` line)."""
    t0 = time.time()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=REPO)
    lines = Lines(proc)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    lines.thread.join(timeout=5)
    got = lines.snapshot()
    steps = [t for t, line in got if STEP_LINE.match(line)]
    return proc.returncode, time.time() - t0, _last_line("\n".join(x for _, x in got)), steps


def nas_cell_run(device: str, steps: int, budget: Budget, *extra: str) -> dict[str, Any]:
    """examples/nas_cell.py alone on ``device``: its step times from its own step log."""
    with tempfile.TemporaryDirectory(prefix="bench-gpu-ex-") as tmp:
        env = _env(None, {"MALLETRAIN_CHECKPOINT_DIR": tmp, "SLURMD_NODENAME": "bench"})
        code, wall, last, _ = run_example(
            [sys.executable, "examples/nas_cell.py", "--cell-seed", "3", "--steps", str(steps),
             "--batch", "16", "--log-every", str(steps + 1), "--checkpoint-every-s", "3600",
             "--device", device, *extra], env, budget.cap(240))
        log = Path(tmp) / "steps" / "bench.log"
        spans = []
        if log.exists():
            # a line is: start end step epoch
            spans = [(float(ln.split()[0]), float(ln.split()[1]))
                     for ln in log.read_text().splitlines() if ln.strip()]
    return {"exit_code": code, "wall_s": round(wall, 2),
            **step_times([s for s, _ in spans] + [e for _, e in spans[-1:]], 10),
            "compute_s": median([e - s for s, e in spans[10:]]),
            **({"error": last} if code else {})}


def part_examples(devices: list[str], steps: dict[str, int], budget: Budget) -> dict[str, Any]:
    """The examples alone (world 1): step times per device, and the BYO scripts on cuda."""
    import importlib.util

    out: dict[str, Any] = {}
    py = sys.executable
    for device in devices:
        n = steps[device]
        with tempfile.TemporaryDirectory(prefix="bench-gpu-ex-") as tmp:
            env = _env(None, {"MALLETRAIN_CHECKPOINT_DIR": tmp})
            code, wall, last, arrivals = run_example(
                [py, "examples/train_elastic.py", "--steps", str(n), "--batch", "32",
                 "--log-every", "1", "--checkpoint-every-s", "3600", "--device", device],
                env, budget.cap(240))
            out[f"train_elastic/{device}"] = {"exit_code": code, "wall_s": round(wall, 2),
                                              **step_times(arrivals, 10),
                                              **({"error": last} if code else {})}
        out[f"nas_cell/{device}"] = nas_cell_run(device, n, budget)
    if "cuda" in devices and budget.left() >= 90:
        # a script that compiles (inductor, Triton kernels on the GPU): it must still train
        # now that a training process starts without torch._dynamo
        out["nas_cell/cuda-inductor"] = nas_cell_run("cuda", 30, budget, "--compile", "inductor")
    if "cuda" in devices:
        byo = {"torchrun": ([py, "-m", "torch.distributed.run", "--standalone",
                             "--nproc-per-node=1", "examples/torchrun/after.py", "--epochs", "2",
                             "--device", "cuda"], "torch"),
               "lightning": ([py, "examples/lightning/after.py", "--epochs", "1", "--device",
                              "cuda", "--root-dir", "{tmp}"], "lightning"),
               "hf": ([py, "examples/hf/after.py", "--epochs", "0.2", "--device", "cuda",
                       "--output-dir", "{tmp}/hf"], "transformers")}
        for name, (argv, needs) in byo.items():
            if importlib.util.find_spec(needs) is None:
                out[f"byo/{name}"] = {"skipped": f"{needs} is not installed"}
                continue
            if budget.left() < 60:
                out[f"byo/{name}"] = {"skipped": "out of --budget-s"}
                continue
            with tempfile.TemporaryDirectory(prefix="bench-gpu-byo-") as tmp:
                env = _env(None, {"MALLETRAIN_CHECKPOINT_DIR": tmp})
                code, wall, last, _ = run_example([a.format(tmp=tmp) for a in argv], env,
                                                  budget.cap(180))
            out[f"byo/{name}"] = {"exit_code": code, "wall_s": round(wall, 2), "last": last}
    return out


# ----- the whole run --------------------------------------------------------------------------

class Interrupted(Exception):
    """SIGTERM (``timeout``, a lease's end) while a part ran."""


def _kill_children() -> None:
    """Kill this bench's child processes (a part left them when it was interrupted)."""
    try:
        import psutil
    except ImportError:
        return
    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:
            pass


def _interrupt(signum: int, _frame: Any) -> None:
    raise Interrupted(f"interrupted by signal {signal.Signals(signum).name}")


def run(args: argparse.Namespace, info: dict[str, Any]) -> dict[str, Any]:
    backend = "gloo" if args.cpu_check else "nccl"
    gpus = len(info.get("gpus") or [])
    worlds = [1, 2] if args.cpu_check or gpus >= 2 else [1]
    no_world2 = {"skipped": f"{gpus} GPU visible: world 2 needs 2"}
    global BUDGET
    budget = BUDGET = Budget(args.budget_s)
    signal.signal(signal.SIGTERM, _interrupt)
    result: dict[str, Any] = {"backend": backend, "failed": []}
    trials = args.trials
    numel = args.numel if not args.cpu_check else min(args.numel, 1 << 20)

    stopped: list[str] = []

    def attempt(key: str, fn: Any, need_s: float) -> None:
        if key.split("/")[0] not in args.parts:
            return
        if stopped:
            result[key] = {"skipped": stopped[0]}
            return
        if budget.left() < need_s:
            result[key] = {"skipped": f"out of --budget-s ({args.budget_s:g} s): "
                                      f"{budget.left():.0f} s left, about {need_s:.0f} s needed"}
            say(f"{key}: skipped, out of budget")
            return
        say(f"{key} ...")
        t0 = time.monotonic()
        try:
            result[key] = fn()
        except PartFailed as exc:
            result[key] = {"error": str(exc)}
            result["failed"].append(key)
            say(f"{key}: FAILED {exc}")
        except Interrupted as exc:
            # the figures of the parts done so far are still printed
            stopped.append(f"not run: {exc}")
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second one ends the bench
            _kill_children()
            result[key] = {"error": f"{exc} after {time.monotonic() - t0:.0f} s in this part"}
            result["failed"].append(key)
            say(f"{key}: {exc}; printing what the parts before it measured")
        else:
            say(f"{key}: {time.monotonic() - t0:.1f} s")

    for world in (1, 2):
        if world in worlds:
            attempt(f"stale/world{world}", lambda w=world: part_stale(backend, w, trials, numel),
                    60)
        elif "stale" in args.parts:
            result[f"stale/world{world}"] = no_world2
    for world in (1, 2):
        if world in worlds:
            attempt(f"communicator/world{world}",
                    lambda w=world: part_communicator(backend, w, args.rounds), 25 * args.rounds)
        elif "communicator" in args.parts:
            result[f"communicator/world{world}"] = no_world2
    for world in (1, 2):
        if world in worlds:
            attempt(f"reform/world{world}", lambda w=world: part_reform(
                backend, w, args.reforms, args.abandons), 40)
        elif "reform" in args.parts:
            result[f"reform/world{world}"] = no_world2
    # epochs of 1.5 s at least: longer than an NCCL abort (1.0 s on an H100), so that each
    # re-form finds the last group let go, as re-forms seconds apart do; the leak check
    # re-forms back to back (each waits for the last group's tear-down, the bound)
    attempt("elastic/world1", lambda: part_elastic(backend, args.reforms, args.abandons, 20,
                                                   min_epoch_s=1.5),
            60 + 1.5 * (args.reforms + args.abandons))
    attempt("joiner", lambda: part_joiner(backend, args.joiners), 20 * args.joiners)
    attempt("leak", lambda: part_leak(backend, args.leak_reforms), 0.5 * args.leak_reforms)
    if isinstance(result.get("leak"), dict) and result["leak"].get("leaked"):
        result["failed"].append("leak")
    devices = ["cpu"] if args.cpu_check else ["cuda", "cpu"]
    steps = {"cuda": args.example_steps, "cpu": max(20, args.example_steps // 5)}
    attempt("examples", lambda: part_examples(devices, steps, budget), 90)
    for key, ex in (result.get("examples") or {}).items():
        if isinstance(ex, dict) and ex.get("exit_code") not in (None, 0):
            result["failed"].append(f"examples/{key}")  # an example that fails on the device
    return result


# ----- the report -----------------------------------------------------------------------------

def _s(cell: Any, digits: int = 3) -> str:
    """A spread (median, min-max) in seconds, or what stood in for it."""
    if not isinstance(cell, dict):
        return "–"
    if "skipped" in cell or "error" in cell:
        return cell.get("skipped") or f"failed: {cell['error']}"
    if cell.get("median") is None:
        return "–"
    if cell["min"] == cell["max"]:
        return f"{cell['median']:.{digits}f} s"
    return f"{cell['median']:.{digits}f} s ({cell['min']:.{digits}f}–{cell['max']:.{digits}f})"


def _why(part: Any) -> str | None:
    if not isinstance(part, dict):
        return "not run"
    if "skipped" in part:
        return str(part["skipped"])
    if "error" in part:
        return f"failed: {part['error']}"
    return None


def stale_rows(r: dict[str, Any]) -> list[str]:
    rows = []
    for world in (1, 2):
        part: Any = r.get(f"stale/world{world}")
        why = _why(part)
        if why or not part.get("observable", False):
            rows.append(f"| world {world} | {why or part.get('why', 'not observable')} | | |")
            continue
        for way, how in (("fixed", "future done → `work.wait()` → read (now)"),
                         ("naive", "future done → `value()` → read")):
            c = part[way]
            rows.append(f"| world {world}, {how} | {c['stale_reads']} of {c['trials']} | "
                        f"{c['early']} of {c['trials']} | {c['wrong_final']} |")
    return rows


def section(r: dict[str, Any], command: str) -> str:
    """The BENCHMARKS.md section for one run (``r`` as ``--json`` printed it)."""
    date = r.get("date") or datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if "skipped" in r:
        return "\n".join([BEGIN, f"Not measured ({date}, `{command}`): {r['skipped']}.", END])
    lines = [BEGIN, f"Measured {date} on {r.get('machine', 'unknown')}, with `{command}`"
             f"{' (CPU/gloo check: no GPU figure)' if r.get('backend') == 'gloo' else ''}.", ""]
    size = next((p["bytes"] for p in (r.get("stale/world1"), r.get("stale/world2"))
                 if isinstance(p, dict) and "bytes" in p), None)
    lines += [f"Stale reads: an async all-reduce{f' of {size / 2**20:g} MiB' if size else ''}, "
              "then a host read of its last element (`inplace._Pending.wait`, each way in "
              "alternate trials):", "",
              "| how the result is read | stale reads | read before the work ended | wrong "
              "after a full sync |", "|---|---|---|---|", *stale_rows(r), ""]
    lines += ["| what | world 1 | world 2 |", "|---|---|---|"]

    def both(part: str, kind: str | None, key: str) -> str:
        cells = []
        for world in (1, 2):
            p: Any = r.get(f"{part}/world{world}")
            why = _why(p)
            if why:
                cells.append(why)
                continue
            cells.append(_s((p[kind] if kind else p).get(key)))
        return " | ".join(cells)

    lines += [
        f"| eager communicator (`device_id`): init | {both('communicator', 'eager', 'init_s')} |",
        f"| eager: first all-reduce | {both('communicator', 'eager', 'first_allreduce_s')} |",
        f"| lazy communicator: init | {both('communicator', 'lazy', 'init_s')} |",
        f"| lazy: first all-reduce | {both('communicator', 'lazy', 'first_allreduce_s')} |",
        f"| re-form: destroy the group | {both('reform', None, 'destroy_s')} |",
        f"| re-form: init a new one (eager) | {both('reform', None, 'init_s')} |",
        f"| re-form: its first all-reduce | {both('reform', None, 'first_allreduce_s')} |",
        f"| re-form pause (all three) | {both('reform', None, 'pause_s')} |",
        f"| abandon: let the group go (abort on NCCL) | {both('reform', None, 'let_go_s')} |",
        f"| abandon: let go + new group + all-reduce | "
        f"{both('reform', None, 'abandon_reform_s')} |",
        f"| **beside**: new group + all-reduce, the old one shut down in a thread | "
        f"{both('reform', None, 'side_pause_s')} |",
        f"| beside: the old group's shut-down, in its thread | "
        f"{both('reform', None, 'side_teardown_s')} |",
        f"| beside: all-reduces on the new group during it | "
        f"{both('reform', None, 'side_overlap_ops').replace(' s', '')} |",
        f"| **beside, abandon**: new group + all-reduce, the abort in a thread (NCCL) | "
        f"{both('reform', None, 'bg_abandon_pause_s')} |",
        f"| beside, abandon: the abort, in its thread (NCCL) | "
        f"{both('reform', None, 'bg_abort_s')} |", ""]
    el: Any = r.get("elastic/world1")
    why = _why(el)
    if why:
        lines += [f"`inplace.Elastic` driven by membership files: {why}.", ""]
    else:
        lines += ["`inplace.Elastic` at world 1, driven by membership files as the launcher "
                  f"does: process start → ready {el['ready_s']:.1f} s, membership → first step "
                  f"{el['first_step_after_membership_s']:.2f} s; planned re-form: pause "
                  f"{_s(el['planned']['pause_s'])}, Elastic's reform_s "
                  f"{_s(el['planned']['reform_s'])}; abandon re-form: pause "
                  f"{_s(el['abandon']['pause_s'])}, reform_s {_s(el['abandon']['reform_s'])} "
                  f"(a step every {el['planned']['step_interval_s'] or 0:.3f} s, "
                  + (f"epochs of at least {el['min_epoch_s']:g} s" if el.get("min_epoch_s")
                     else "epochs back to back: a re-form may wait for the last group's "
                     "let-go") + "). The old "
                  f"group, let go in a thread: shut-down {_s(el.get('let_go_shutdown_s'))}, "
                  f"abort {_s(el.get('let_go_abort_s'))}.", ""]
        for kind in ("planned", "abandon"):
            ph = el[kind].get("phases") or {}
            if any((v or {}).get("median") is not None for v in ph.values()):
                article = "an" if kind == "abandon" else "a"
                lines += [f"Where {article} {kind} re-form's reform_s goes: " + "; ".join(
                    f"{name} {_s(ph.get(key))}" for name, key in (
                        ("waiting for the last group's let-go", "wait_retiring_s"),
                        ("meeting at the store", "store_s"),
                        ("store and group init", "form_s"),
                        ("hand-over", "hand_over_s"))) + ".", ""]
    lk: Any = r.get("leak")
    why = _why(lk)
    if why:
        lines += [f"Leak check: {why}.", ""]
    else:
        fp = lk.get("footprint") or {}
        grew = "; ".join(f"{k} {v['from']:g} → {v['to']:g}" for k, v in fp.items()
                         if isinstance(v, dict))
        lines += [f"Leak check, {fp.get('to_epoch', '?')} planned re-forms of one Elastic "
                  f"process, from epoch {fp.get('from_epoch', '?')} to the last: {grew} "
                  f"({'GROWTH' if lk.get('leaked') else 'no growth'}); planned pause "
                  f"{_s(lk['planned']['pause_s'])}, back to back (two steps apart), so each "
                  "re-form first waits for the last group's let-go"
                  + (f": waiting {_s(lk['planned']['phases'].get('wait_retiring_s'))}"
                     if lk["planned"].get("phases") else "") + ".", ""]
        if lk.get("rss_mb_by_epoch"):
            lines += ["Resident memory (MB) at the first step of every 20th epoch: " + ", ".join(
                f"{e}: {v:g}" for e, v in lk["rss_mb_by_epoch"].items()) + ".", ""]
    j: Any = r.get("joiner")
    why = _why(j)
    if why:
        lines += [f"Joiner start-up: {why}.", ""]
    else:
        parts = [("interpreter", "interpreter_s"), ("`import torch`", "import_torch_s"),
                 ("first CUDA context", "cuda_context_s"),
                 ("model (the NAS example's module and a cell)", "model_s"),
                 ("`import torch._dynamo` (the first optimizer's import)", "dynamo_import_s"),
                 ("first optimizer, the rest", "optimizer_s"), ("first step", "first_step_s"),
                 ("second step", "second_step_s"), ("start → ready (optimizer built)",
                                                     "ready_s")]
        lines += ["Joiner start-up, a fresh process: "
                  + "; ".join(f"{name} {_s(j.get(key))}" for name, key in parts) + ".", ""]
        d = j.get("deferred")
        if isinstance(d, dict):
            loaded = (d.get("dynamo_loaded") or {}).get("max")
            lines += ["The same as a MalleTrain training process starts "
                      "(`worker.startup.defer_dynamo`, no `import torch._dynamo`): the "
                      f"deferral {_s(d.get('defer_s'))}, first optimizer "
                      f"{_s(d.get('optimizer_s'))}, first step {_s(d.get('first_step_s'))}; "
                      f"**start → ready {_s(d.get('ready_s'))}**, start → second step "
                      f"{_s(d.get('total_s'))}"
                      f"{' (torch._dynamo was imported after all)' if loaded else ''}.", ""]
    ex: Any = r.get("examples")
    why = _why(ex)
    if why:
        lines += [f"Examples: {why}.", ""]
    else:
        lines += ["| example (world 1, alone) | step (median after 10) | first step | exit |",
                  "|---|---|---|---|"]
        for key, v in ex.items():
            if "skipped" in v:
                lines.append(f"| {key} | {v['skipped']} | | |")
            elif key.startswith("byo/"):
                lines.append(f"| {key} | ran {v['wall_s']:.0f} s | | {v['exit_code']} |")
            else:
                step = f"{v['step_s'] * 1000:.1f} ms" if v.get("step_s") is not None else "–"
                first = (f"{v['first_interval_s']:.2f} s" if v.get("first_interval_s")
                         is not None else "–")
                lines.append(f"| {key} | {step} | {first} | {v['exit_code']} |")
        lines.append("")
    if r.get("failed"):
        lines += [f"Failed parts: {', '.join(r['failed'])}.", ""]
    lines.append(END)
    return "\n".join(lines)


def skip(reason: str, info: dict[str, Any]) -> dict[str, Any]:
    return {"bench": "gpu", "skipped": reason, **{k: v for k, v in info.items()
                                                  if k != "skipped"}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print only the JSON")
    p.add_argument("--markdown", metavar="FILE", help="rewrite the GPU section of FILE")
    p.add_argument("--from-json", metavar="FILE", help="no run: take the figures from the "
                   "JSON a previous --json run printed")
    p.add_argument("--cpu-check", action="store_true",
                   help="run every part on the CPU with gloo (checks the script; no GPU figure)")
    p.add_argument("--budget-s", type=float, default=540.0,
                   help="skip the parts that no longer fit in this many seconds (default 540)")
    p.add_argument("--trials", type=int, default=40, help="stale-read trials per way (40)")
    p.add_argument("--numel", type=int, default=STALE_NUMEL,
                   help="float32 elements of the stale-read tensor (default 2^28: 1 GiB)")
    p.add_argument("--rounds", type=int, default=3, help="fresh processes per communicator "
                   "kind and world (3)")
    p.add_argument("--reforms", type=int, default=8, help="re-forms per process (8)")
    p.add_argument("--abandons", type=int, default=4, help="abandon re-forms per process (4)")
    p.add_argument("--joiners", type=int, default=3, help="fresh joiner processes (3)")
    p.add_argument("--leak-reforms", type=int, default=200,
                   help="planned re-forms of the leak check (200)")
    p.add_argument("--example-steps", type=int, default=200,
                   help="steps per example on cuda (a fifth, at least 20, on the CPU)")
    p.add_argument("--parts", default=",".join(PARTS),
                   help=f"comma-separated parts to run (default: all of {','.join(PARTS)})")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child_main(args.child, json.loads(args.spec))
    args.parts = [x for x in args.parts.split(",") if x]
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown or not args.parts:
        p.error(f"--parts: unknown {', '.join(unknown) or '(none given)'}; choose from "
                f"{', '.join(PARTS)}")
    if min(args.trials, args.numel, args.rounds, args.reforms, args.abandons, args.joiners,
           args.example_steps, args.leak_reforms) < 1:
        p.error("--trials, --numel, --rounds, --reforms, --abandons, --joiners, "
                "--leak-reforms and --example-steps must be ≥ 1")
    t0 = time.monotonic()
    if args.from_json:
        result = json.loads(Path(args.from_json).read_text())
    else:
        info = probe()
        if args.cpu_check and "torch" in info:  # the CPU is enough: no GPU is used
            info = {**{k: v for k, v in info.items() if k != "skipped"}, "gpus": []}
        if "skipped" in info:
            result = skip(info["skipped"], info)
        else:
            result = {"bench": "gpu", **info, **run(args, info)}
        flags = list(argv if argv is not None else sys.argv[1:])
        result["command"] = "python -m bench.gpu " + shlex.join(flags)
        result["machine"] = machine(info) if "skipped" not in result else host()
        result["date"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        result["wall_s"] = round(time.monotonic() - t0, 1)
    if args.markdown and "skipped" in result:
        say(f"{args.markdown} not rewritten: {result['skipped']}")
    elif args.markdown:
        replace_section(Path(args.markdown), BEGIN, END,
                        section(result, result["command"].strip()), HEADING)
    print(json.dumps(result, indent=None if args.json else 1))
    if result.get("failed"):
        say(f"failed parts: {', '.join(result['failed'])}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
