"""bench/sharded.py's figures from hand-written lines (no cluster, no torch): the example's and
the daemon's lines read with their times, each change's pause, steps lost and disk bytes, the
medians, the done-when conditions, the reference's comparison and the report's section."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

import pytest

from bench import sharded_figures as sf
from bench import sharded_reference as ref
from devtools.runlogs.sharded_logs import daemon_epoch_times, parse_sharded

T0 = 1_800_000_000.0


def start(step: int, epoch: int, world: int, rank: int, t: float, moved: str) -> str:
    return (f"start step={step} epoch={epoch} world={world} rank={rank} mode=fsdp "
            f"params=13800000 reform_s=0.2 t={t:.3f} moved={moved}\n")


def step(n: int, epoch: int, world: int, rank: int, t: float) -> str:
    return (f"step={n} epoch={epoch} world={world} rank={rank} samples={n * 8} loss=8.1 "
            f"t={t:.3f} copies={{'step': 5, 'bytes': 10}}\n")


def daemon_line(t: float, job: str, epoch: int, world: int, path: str, abandon: bool) -> str:
    stamp = datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
    return (f"{stamp} INFO malletrain_core.daemon.main: job={job} epoch {epoch}, world {world},"
            f" path {path}{' (abandon)' if abandon else ''}\n")


def run_text() -> str:
    """Epoch 1 at world 2 to step 10; a preemption at T0 + 20 (epoch 2, world 1, rolled back
    to step 8 from the buddy copies); a grow ordered at T0 + 40 (epoch 3, world 2)."""
    text = start(0, 1, 2, 0, T0, "{'mode': 'fsdp', 'from_disk': True}")
    text += "".join(step(n, 1, 2, r, T0 + n) for n in range(1, 11) for r in (0, 1))
    text += start(8, 2, 1, 0, T0 + 24, "{'mode': 'fsdp', 'received_bytes': 0, "
                  "'from_disk': False, 'from_buddy': True, 'steps_lost': 2}")
    text += "".join(step(n, 2, 1, 0, T0 + 16 + n) for n in range(9, 13))
    # two processes writing at once: one line holds both (the patterns are not anchored)
    text += start(12, 3, 2, 0, T0 + 41, "{'mode': 'fsdp', 'received_bytes': 500, "
                  "'from_disk': False, 'peak_extra_ratio': 0.25}").rstrip("\n")
    text += start(12, 3, 2, 1, T0 + 41, "{'mode': 'fsdp', 'received_bytes': 700, "
                  "'from_disk': False, 'peak_extra_ratio': 0.5}")
    text += step(13, 3, 2, 0, T0 + 42.5) + step(13, 3, 2, 1, T0 + 42.6)
    return text


def epochs() -> str:
    return (daemon_line(T0 - 5, "7", 1, 2, "inplace", False)
            + daemon_line(T0 + 23, "7", 2, 1, "inplace", True)
            + daemon_line(T0 + 40, "7", 3, 2, "inplace", False)
            + daemon_line(T0 + 40, "8", 3, 2, "disk", False))


def test_the_lines_are_read_with_their_times_even_two_on_one_line() -> None:
    log = parse_sharded(run_text())
    assert sorted(log.begun) == [1, 2, 3] and sorted(log.begun[3]) == [0, 1]
    assert log.starts[2][0]["from_buddy"] is True
    assert log.first_step_t(3) == pytest.approx(T0 + 42.5)
    assert log.last_step(1) == 10 and log.start_step(2) == 8
    assert log.latest() == (3, 2, {0, 1}) and log.trained(3, 2, 1) and not log.trained(3, 2, 2)
    got = daemon_epoch_times(epochs(), "7")
    assert sorted(got) == [1, 2, 3] and got[2].abandon and got[3].path == "inplace"
    assert got[3].t == pytest.approx(T0 + 40, abs=0.001)


def test_a_preemption_is_timed_from_its_trigger_and_a_grow_from_the_daemons_order() -> None:
    log, times = parse_sharded(run_text()), daemon_epoch_times(epochs(), "7")
    lost = sf.figures(sf.Change("preempt", 1, 2, T0 + 20), log, times)
    assert lost["pause_s"] == pytest.approx(T0 + 25 - (T0 + 20))   # first step of epoch 2
    assert lost["steps_lost"] == 2 and lost["peak_extra_ratio"] is None
    assert lost["paths"] == ["inplace"] and not lost["from_disk"]
    grow = sf.figures(sf.Change("grow", 2, 3, T0 + 30), log, times)
    assert grow["pause_s"] == pytest.approx(2.5)                   # T0 + 40 → T0 + 42.5
    assert grow["steps_lost"] == 0 and grow["peak_extra_ratio"] == 0.5
    assert grow["received_bytes"] == 1200


def test_disk_bytes_count_new_and_rewritten_files(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 10)
    before = sf.folder_files(tmp_path)
    assert sf.written_bytes(before, sf.folder_files(tmp_path)) == 0
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"y" * 7)
    (tmp_path / "a").write_bytes(b"z" * 12)
    os.utime(tmp_path / "a", ns=(1, 1))
    assert sf.written_bytes(before, sf.folder_files(tmp_path)) == 19
    assert sf.folder_files(tmp_path / "missing") == {}


def row(kind: str, pause: float | None, lost: int = 0, disk: int = 0,
        peak: float | None = None) -> dict:
    return {"kind": kind, "pause_s": pause, "steps_lost": lost, "disk_bytes": disk,
            "peak_extra_ratio": peak, "from_disk": False, "paths": ["inplace"]}


def test_medians_sums_and_the_done_when_conditions() -> None:
    inplace = sf.summarize([row("grow", 1.0, peak=0.5), row("grow", 2.0), row("grow", 4.0),
                            row("shrink", 0.5, peak=1.0), row("preempt", 3.0, lost=2),
                            row("preempt", None)])
    assert (inplace["grow_s"], inplace["shrink_s"], inplace["preempt_s"]) == (2.0, 0.5, 3.0)
    assert inplace["steps_lost"] == 2 and inplace["disk_bytes"] == 0
    assert inplace["peak_extra_ratio"] == 1.0 and inplace["peak_extra_ratio_from"] == [
        "grow", "shrink"]
    restart = sf.summarize([row("grow", 12.0, disk=100), row("shrink", 2.0),
                            row("preempt", 14.0, lost=30)])
    faster = sf.summarize([row("grow", 10.0), row("shrink", 4.0), row("preempt", 20.0)])
    assert sf.fastest_restart({"a": restart, "b": faster}) == {
        "grow_s": 10.0, "shrink_s": 2.0, "preempt_s": 14.0}
    done = sf.done_when({**inplace, "matches_reference": True}, restart)
    assert done["grow_fifth"] and not done["shrink_fifth"] and not done["preempt_fifth"]
    assert done["grow_ratio"] == 6.0 and done["zero_disk_bytes"] and done["peak_within_limit"]
    assert not done["all"]
    missing = sf.done_when({"error": "no cluster"}, {})
    assert missing["grow_fifth"] is None and not missing["matches_reference"]
    assert not missing["all"]


def test_the_reference_compares_every_kept_step_and_names_a_mismatch() -> None:
    def rec(epoch: int, world: int, s: int, digest: str = "") -> dict:
        return {"epoch": epoch, "world": world, "step": s, "before": digest or f"d{s}",
                "pos": 8 * (s + 1), "scheduled": s + 1}
    rows = [rec(1, 2, s) for s in range(0, 6)] + [rec(2, 3, s) for s in range(6, 9)]
    rows += [rec(3, 2, s) for s in range(7, 10)]     # a loss: rolled back to step 7
    plan = ref.segments(rows)
    assert plan == [(1, 2, 0, 6), (2, 3, 6, 7), (3, 2, 7, 10)]
    replay = [ref.by_step([rec(0, w, s) for s in range(a, b)]) for _, w, a, b in plan]
    assert ref.compare(rows, plan, replay) == (10, [])
    replay[2][8] = {("other", 72, 9)}
    compared, bad = ref.compare(rows, plan, replay)
    assert compared == 10 and len(bad) == 1 and bad[0].startswith("epoch 3 (world 2) step 8")


def test_the_section_says_the_machine_the_command_and_which_conditions_failed() -> None:
    pytest.importorskip("bench.sharded")
    from bench import sharded

    mode = {**sf.summarize([row("grow", 1.0, peak=0.5), row("shrink", 0.5),
                            row("preempt", 3.0)]),
            "matches_reference": True, "reference": {"matches": True, "steps_compared": 40}}
    restart = sf.summarize([row("grow", 12.0), row("shrink", 3.0), row("preempt", 14.0)])
    results = {"model_params": 13_800_000, "modes": {"hsdp": mode},
               "restart": {**sf.fastest_restart({"hsdp": restart}), "hsdp": restart},
               "done_when": {"hsdp": sf.done_when(mode, restart)},
               "meta": {"date": "2026-12-07 08:00 UTC", "host": "a machine", "rounds": 2,
                        "seconds": 900.0}}
    text = sharded.section(results, "python -m bench.sharded --json --rounds 2")
    assert text.startswith(sharded.BEGIN) and text.endswith(sharded.END)
    assert "`python -m bench.sharded --json --rounds 2` on a machine" in text
    assert "| hsdp | in place | 1.00 s | 0.50 s | 3.00 s | 0 | 0 | 0.5 | True (40 steps) |" \
        in text
    assert "hsdp: done-when NOT met" in text and "failed: preempt_fifth)" in text
