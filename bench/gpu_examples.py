"""The examples part of :mod:`bench.gpu`: the repository's example scripts run alone (world 1)
as a user would start them, on each device, and their step times read from their own output.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.gpu_child import last_line
from bench.gpu_parts import REPO, Budget, Lines, child_env, median

STEP_LINE = re.compile(r"^(start )?step=\d+ ")  # train_elastic.py: its start, then each step


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
    return proc.returncode, time.time() - t0, last_line("\n".join(x for _, x in got)), steps


def nas_cell_run(device: str, steps: int, budget: Budget, *extra: str) -> dict[str, Any]:
    """examples/nas_cell.py alone on ``device``: its step times from its own step log."""
    with tempfile.TemporaryDirectory(prefix="bench-gpu-ex-") as tmp:
        env = child_env(None, {"MALLETRAIN_CHECKPOINT_DIR": tmp, "SLURMD_NODENAME": "bench"})
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
            env = child_env(None, {"MALLETRAIN_CHECKPOINT_DIR": tmp})
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
                env = child_env(None, {"MALLETRAIN_CHECKPOINT_DIR": tmp})
                code, wall, last, _ = run_example([a.format(tmp=tmp) for a in argv], env,
                                                  budget.cap(180))
            out[f"byo/{name}"] = {"exit_code": code, "wall_s": round(wall, 2), "last": last}
    return out
