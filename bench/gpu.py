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

The parts' children are :mod:`bench.gpu_child` (the child half: what runs in each fresh
process), started and read by :mod:`bench.gpu_parts` (the parent half) and
:mod:`bench.gpu_examples`; the BENCHMARKS.md section is :mod:`bench.gpu_report`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

if not __package__:  # started as a file: bench/ is a package, run from the repository's root
    sys.exit("run it as a module from the repository's root: python -m bench.gpu "
             + " ".join(sys.argv[1:]))

from bench import gpu_parts  # noqa: E402
from bench.gpu_examples import part_examples  # noqa: E402
from bench.gpu_parts import (  # noqa: E402
    PartFailed,
    part_communicator,
    part_elastic,
    part_joiner,
    part_leak,
    part_reform,
    part_stale,
)
from bench.gpu_report import BEGIN, END, HEADING, section  # noqa: E402
from bench.sections import host, replace_section, say  # noqa: E402

STALE_NUMEL = 1 << 28          # 1 GiB of float32: a collective long enough to race a read
PARTS = ("stale", "communicator", "reform", "elastic", "joiner", "leak", "examples")


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
    budget = gpu_parts.set_budget(args.budget_s)
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
    args = p.parse_args(argv)
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
