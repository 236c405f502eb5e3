"""The parent half of :mod:`bench.gpu`: each part's children started, waited for and their
results combined (the children are :mod:`bench.gpu_child`, one fresh process per rank).

A child's output goes to a file and its one ``RESULT`` line is read from there; a child that
fails or outlives the part's timeout is :class:`PartFailed` with its error's last line. The
time left of ``--budget-s`` (:data:`BUDGET`, set by :func:`set_budget`) caps every wait.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.gpu_child import RESULT, last_line
from devtools.runlogs.jsonlines import json_lines

REPO = Path(__file__).resolve().parents[1]


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


BUDGET = Budget(3600.0)  # replaced by set_budget() with --budget-s


def set_budget(seconds: float) -> Budget:
    """Start the run's budget of ``seconds``: every child's wait is capped by what is left."""
    global BUDGET
    BUDGET = Budget(seconds)
    return BUDGET


def child_env(rank: int | None = 0, extra: dict[str, str] | None = None) -> dict[str, str]:
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
                [sys.executable, "-m", "bench.gpu_child", name, json.dumps(spec)],
                env=child_env(spec.get("rank", 0)), stdout=out, stderr=subprocess.STDOUT,
                text=True), out))
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
                    raise PartFailed(f"{name}: exit {proc.returncode}: {last_line(text)}")
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
        return json_lines(line for _, line in self.snapshot())


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
        env = child_env(0, {training.ENV_CONTROL_DIR: str(control), training.ENV_INPLACE: "1",
                       training.ENV_CHECKPOINT_DIR: str(Path(tmp) / "checkpoints")})
        spawned = time.time()
        spec = {"backend": backend, "rank": 0, "sleep": 0.005}
        proc = subprocess.Popen([sys.executable, "-m", "bench.gpu_child", "elastic",
                                 json.dumps(spec)], env=env,
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
            raise PartFailed(f"{exc}: {last_line(errors.read())}") from None
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
