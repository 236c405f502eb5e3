"""bench/gpu.py and its halves (bench/gpu_child.py, gpu_parts.py, gpu_examples.py,
gpu_report.py): without CUDA it prints one skip JSON and exits 0 at once; its report, pause and
step-time arithmetic on made-up runs; bad options refused. The GPU figures themselves come
from running it on a machine with one (``--cpu-check`` runs every part on gloo here)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from script_module import ROOT

from bench import gpu_examples, gpu_parts, gpu_report


@pytest.fixture(scope="module")
def gpu() -> ModuleType:
    return importlib.import_module("bench.gpu")


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # no GPU, even on a host that has one
    return subprocess.run([sys.executable, "-m", "bench.gpu", *args], capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=ROOT)


def test_without_cuda_it_prints_the_skip_json_and_exits_0(tmp_path: Path) -> None:
    md = tmp_path / "BENCH.md"
    md.write_text("# Benchmarks\n")
    t0 = time.monotonic()
    proc = _run("--json", "--markdown", str(md))
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    out = json.loads(lines[0])
    assert out["bench"] == "gpu"
    assert isinstance(out["skipped"], str)
    assert out["skipped"].startswith("no CUDA: ") or "torch is not installed" in out["skipped"]
    assert out["command"] == f"python -m bench.gpu --json --markdown {md}"
    assert out["date"].endswith("UTC") and out["machine"] and "failed" not in out
    assert not any(k.startswith(("stale", "reform", "communicator")) for k in out)
    assert md.read_text() == "# Benchmarks\n"  # a skipped run rewrites nothing
    assert "not rewritten" in proc.stderr
    assert took < 60  # quick: no part starts


def test_bad_options_are_usage_errors() -> None:
    proc = _run("--parts", "stale,warp")
    assert proc.returncode == 2 and "--parts: unknown warp" in proc.stderr
    proc = _run("--trials", "0")
    assert proc.returncode == 2 and "must be ≥ 1" in proc.stderr


def test_a_failing_child_is_one_line_naming_its_part() -> None:
    with pytest.raises(gpu_parts.PartFailed, match=r"^nope: exit 1: KeyError: 'nope'$"):
        gpu_parts.run_children("nope", [{"backend": "gloo", "rank": 0}], 60)


def _spread(*xs: float) -> dict[str, Any]:
    return {"median": sorted(xs)[len(xs) // 2], "min": min(xs), "max": max(xs), "all": list(xs)}


RUN: dict[str, Any] = {
    "bench": "gpu", "backend": "nccl", "failed": ["examples"], "date": "2026-11-27 10:00 UTC",
    "machine": "CPU, 16 cores, 1 × NVIDIA H100 80GB HBM3, torch 2.11.0+cu130, NCCL 2.28.9",
    "stale/world1": {"observable": True, "bytes": 1 << 30, "ranks": 1,
                     "fixed": {"trials": 40, "stale_reads": 0, "early": 38, "wrong_final": 0},
                     "naive": {"trials": 40, "stale_reads": 17, "early": 39, "wrong_final": 0}},
    "stale/world2": {"skipped": "1 GPU visible: world 2 needs 2"},
    "communicator/world1": {
        "eager": {"init_s": _spread(0.3), "first_allreduce_s": _spread(0.05, 0.04, 0.06),
                  "second_allreduce_s": _spread(0.0001)},
        "lazy": {"init_s": _spread(0.01), "first_allreduce_s": _spread(0.39, 0.62, 0.5),
                 "second_allreduce_s": _spread(0.0001)}},
    "communicator/world2": {"skipped": "1 GPU visible: world 2 needs 2"},
    "reform/world1": {"abandon_action": "abort", "destroy_s": _spread(0.41, 0.5),
                      "init_s": _spread(0.03), "first_allreduce_s": _spread(0.05),
                      "pause_s": _spread(0.09, 0.51), "let_go_s": _spread(0.2),
                      "abandon_reform_s": _spread(0.96)},
    "reform/world2": {"skipped": "1 GPU visible: world 2 needs 2"},
    "elastic/world1": {"ready_s": 11.5, "first_step_after_membership_s": 0.4,
                       "planned": {"pause_s": _spread(0.5), "reform_s": _spread(0.45),
                                   "step_interval_s": 0.01},
                       "abandon": {"pause_s": _spread(0.96), "reform_s": _spread(0.9),
                                   "step_interval_s": 0.01}},
    "joiner": {k: _spread(v) for k, v in dict[str, float]({
        "interpreter_s": 0.05, "import_torch_s": 4.2, "cuda_context_s": 0.6, "model_s": 0.3,
        "dynamo_import_s": 6.2, "optimizer_s": 0.1, "first_step_s": 1.0, "second_step_s": 0.01,
        "ready_s": 11.4, "total_s": 12.4}).items()},
    "examples": {"error": "examples: no result within 240 s"},
}


def test_the_section_reports_a_made_up_gpu_run() -> None:
    text = gpu_report.section(RUN, "python -m bench.gpu --json")
    lines = text.splitlines()
    assert lines[0] == gpu_report.BEGIN and lines[-1] == gpu_report.END
    assert "NVIDIA H100" in lines[1] and "`python -m bench.gpu --json`" in lines[1]
    assert "CPU/gloo check" not in text
    assert "an async all-reduce of 1024 MiB" in text
    assert "| world 1, future done → `work.wait()` → read (now) | 0 of 40 | 38 of 40 | 0 |" in lines
    assert "| world 1, future done → `value()` → read | 17 of 40 | 39 of 40 | 0 |" in lines
    assert "| world 2 | 1 GPU visible: world 2 needs 2 | | |" in lines
    assert ("| lazy: first all-reduce | 0.500 s (0.390–0.620) | 1 GPU visible: world 2 needs 2 |"
            in lines)
    assert "| re-form pause (all three) | 0.510 s (0.090–0.510) | 1 GPU visible: world 2 needs 2 |" \
        in lines
    assert "process start → ready 11.5 s" in text and "abandon re-form: pause 0.960 s" in text
    assert "`import torch` 4.200 s" in text and "first optimizer's import) 6.200 s" in text
    assert "Examples: failed: examples: no result within 240 s." in text
    assert "Failed parts: examples." in text


def test_the_section_of_a_skipped_run_says_why() -> None:
    text = gpu_report.section({"skipped": "no CUDA: a CPU build of torch", "date": "d"}, "cmd")
    assert text.splitlines() == [gpu_report.BEGIN, "Not measured (d, `cmd`): no CUDA: a CPU "
                                 "build of torch.", gpu_report.END]


def test_pauses_are_the_gaps_between_epochs() -> None:
    records: list[dict[str, Any]] = [{"t": t, "step": i, "epoch": e, "failed": False}
               for i, (t, e) in enumerate([(1.0, 0), (1.1, 0), (1.2, 0), (1.9, 1), (2.0, 1),
                                           (3.5, 2)])]
    records.insert(3, {"change": {"epoch": 1, "reform_s": 0.6}})
    records.insert(4, {"t": 1.5, "step": 3, "epoch": 1, "failed": True})  # a dropped step
    got = gpu_parts.pauses(records)
    assert [g["epoch"] for g in got] == [1, 2]
    assert [g["pause_s"] for g in got] == pytest.approx([0.7, 1.5])
    assert [g["step_interval_s"] for g in got] == pytest.approx([0.1, 0.1])


def test_step_times_skip_the_warm_up() -> None:
    arrivals = [0.0, 2.0, 2.1, 2.2, 2.35, 2.45]
    got = gpu_examples.step_times(arrivals, 2)
    assert got["steps"] == 5 and got["first_interval_s"] == pytest.approx(2.0)
    assert got["step_s"] == pytest.approx(0.1)
    assert gpu_examples.step_times([], 2) == {"steps": 0, "step_s": None, "first_interval_s": None}


def test_from_json_rewrites_only_its_section(gpu: ModuleType, tmp_path: Path) -> None:
    md = tmp_path / "BENCH.md"
    md.write_text(f"# Benchmarks\n\nbefore\n\n{gpu.BEGIN}\nold\n{gpu.END}\n\nafter\n")
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps({**RUN, "failed": [], "examples": {},
                                 "command": "python -m bench.gpu --json"}))
    assert gpu.main(["--from-json", str(saved), "--markdown", str(md), "--json"]) == 0
    text = md.read_text()
    assert text.startswith("# Benchmarks\n\nbefore\n\n" + gpu.BEGIN + "\nMeasured 2026-11-27")
    assert text.endswith(gpu.END + "\n\nafter\n") and "\nold\n" not in text


@pytest.mark.torch
@pytest.mark.slow
def test_cpu_check_runs_every_part_on_gloo() -> None:
    """Every part's children on the CPU with gloo (no GPU figure): the script itself works."""
    proc = _run("--cpu-check", "--json", "--trials", "3", "--rounds", "1", "--reforms", "2",
                "--abandons", "1", "--joiners", "1", "--example-steps", "20",
                "--leak-reforms", "12", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["backend"] == "gloo" and out["failed"] == []
    assert out["stale/world2"]["fixed"]["stale_reads"] == 0  # gloo's futures are results
    assert out["reform/world1"]["abandon_action"] == "forget"
    assert len(out["reform/world2"]["pause_s"]["all"]) == 2
    el = out["elastic/world1"]
    assert el["exit_code"] == 0 and len(el["planned"]["pause_s"]["all"]) == 2
    assert len(el["abandon"]["pause_s"]["all"]) == 1
    assert out["joiner"]["import_torch_s"]["median"] > 0
    assert out["joiner"]["dynamo_import_s"]["median"] > 0  # plain: torch._dynamo not yet in
    deferred = out["joiner"]["deferred"]
    assert len(deferred["ready_s"]["all"]) == 1
    assert deferred["dynamo_loaded"]["max"] == 0  # as a MalleTrain process starts: never
    assert len(out["reform/world2"]["side_pause_s"]["all"]) == 2
    assert out["elastic/world1"]["let_go_shutdown_s"]["median"] is not None  # in a thread
    leak = out["leak"]
    assert leak["leaked"] is False and leak["footprint"]["to_epoch"] == 12
    # none more at the end; fewer is fine (a let-go thread may still be live when counting starts)
    assert leak["footprint"]["threads"]["growth"] <= 0
    ex = out["examples"]
    assert ex["train_elastic/cpu"]["exit_code"] == 0 and ex["train_elastic/cpu"]["step_s"] > 0
    assert ex["nas_cell/cpu"]["exit_code"] == 0 and ex["nas_cell/cpu"]["compute_s"] > 0
    # where Elastic's re-forms went, and the leak check's series
    phases = el["planned"]["phases"]
    assert set(phases) == {"wait_retiring_s", "store_s", "form_s", "hand_over_s"}
    assert len(phases["form_s"]["all"]) == 2 and el["min_epoch_s"] == 1.5
    assert list(leak["rss_mb_by_epoch"]) == ["0", "12"]


@pytest.mark.torch
@pytest.mark.slow
def test_an_interrupted_run_prints_what_it_measured() -> None:
    """SIGTERM (``timeout``, a lease's end) during a part: the parts before it are printed, the
    interrupted one is failed with the signal's name, the rest are not run, no child is left."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    proc = subprocess.Popen([sys.executable, "-m", "bench.gpu", "--cpu-check", "--json",
                             "--parts", "joiner,leak,examples", "--joiners", "1",
                             "--leak-reforms", "1000", "--budget-s", "3600"], cwd=ROOT,
                            env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    import psutil

    def elastic_child() -> bool:
        for k in psutil.Process(proc.pid).children(recursive=True):
            try:
                if "elastic" in " ".join(k.cmdline()):
                    return True
            except psutil.Error:  # a child of an earlier part, ending
                pass
        return False

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not elastic_child():  # the leak part is running
        time.sleep(0.2)
    time.sleep(2)
    kids = psutil.Process(proc.pid).children(recursive=True)
    proc.terminate()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err[-2000:]
    res = json.loads(out)
    assert res["failed"] == ["leak"], res["failed"]
    assert "interrupted by signal SIGTERM" in res["leak"]["error"]
    assert res["examples"] == {"skipped": "not run: interrupted by signal SIGTERM"}
    assert len(res["joiner"]["ready_s"]["all"]) == 1
    psutil.wait_procs(kids, timeout=10)
    assert not [k for k in kids if k.is_running() and k.status() != psutil.STATUS_ZOMBIE]


def test_the_child_half_imports_nothing_of_the_parent() -> None:
    """A child measures from its own start: bench/gpu_child.py imports only the standard library
    at its top (torch and the package inside each part), and no other bench module."""
    import ast

    tree = ast.parse((ROOT / "bench" / "gpu_child.py").read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {a.name.split(".")[0] for n in top if isinstance(n, ast.Import) for a in n.names}
    names |= {(n.module or "").split(".")[0] for n in top if isinstance(n, ast.ImportFrom)}
    assert names <= set(sys.stdlib_module_names) | {"__future__"}, names
    assert not any(isinstance(n, ast.ImportFrom) and (n.module or "").startswith("bench")
                   for n in ast.walk(tree))
