"""Journal compaction: an engine snapshot replaces the journal before it, the bound holds, a
restart from the compacted journal gives the engine a full replay gives, and a crash at any
step of a compaction leaves the old journal or the new snapshot.

The daemon runs for real (Store on disk, Daemon.cycle) against the seeded stand-in backend
:class:`~malletrain_core.sim.churn.ChurnBackend`; engines are compared by their whole state
(:func:`~malletrain_core.daemon.snapshot.canonical`) and by the actions they take next.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from malletrain_core.config import load
from malletrain_core.daemon import snapshot as snapshots
from malletrain_core.daemon.core import Daemon
from malletrain_core.daemon.store import COMPACTION_STEPS, Store
from malletrain_core.engine import Engine, EngineConfig
from malletrain_core.engine.survival import LifetimePredictor, SurvivalModel
from malletrain_core.errors import ConfigError
from malletrain_core.events import Action
from malletrain_core.sim.churn import ChurnBackend

ROOT = Path(__file__).resolve().parents[1]


def engine_config(lifetime: bool) -> EngineConfig:
    if not lifetime:
        return EngineConfig()
    return EngineConfig(lifetime=LifetimePredictor(SurvivalModel()), max_running_jobs=None)


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def run(state: Path, cycles: int, bound: int | None, seed: int = 1, lifetime: bool = False,
        start: float = 1000.0) -> tuple[Daemon, list[int], list[Action]]:
    """A daemon on ``state`` driven for ``cycles`` cycles; returns it, the journal's row count
    after every cycle and every action it executed."""
    clock = Clock(start)
    daemon = Daemon(Engine(engine_config(lifetime)), ChurnBackend(seed), Store(state),
                    clock=clock, tick_interval_s=5.0, journal_max_events=bound)
    daemon.recover()
    rows: list[int] = []
    actions: list[Action] = []
    for _ in range(cycles):
        actions += daemon.cycle()
        rows.append(daemon.store.rows)
        clock.t += 2.0
    return daemon, rows, actions


def recovered(state: Path, lifetime: bool = False) -> Engine:
    store = Store(state)
    engine = Engine(engine_config(lifetime))
    Daemon(engine, ChurnBackend(0), store).recover()
    store.close()
    return engine


@pytest.mark.parametrize("lifetime", [False, True])
def test_restart_from_a_compacted_journal_gives_the_engine_a_full_replay_gives(
        tmp_path: Path, lifetime: bool) -> None:
    full, _, _ = run(tmp_path / "full", 1500, None, lifetime=lifetime)
    compacted, _, _ = run(tmp_path / "compacted", 1500, 1000, lifetime=lifetime)
    assert full.counters.events > 12_000
    assert compacted.compactions >= 10
    assert full.store.journal_length() == full.counters.events
    assert compacted.store.journal_length() <= 1000 + 200
    live = snapshots.canonical(full.engine)
    assert snapshots.canonical(compacted.engine) == live  # same inputs, same engine
    if lifetime:
        assert full.engine.config.lifetime is not None
        survival = full.engine.config.lifetime.survival
        assert survival is not None and survival.count > 100  # learned state is compared
    full.store.close()
    compacted.store.close()
    replayed = recovered(tmp_path / "full", lifetime)
    restored = recovered(tmp_path / "compacted", lifetime)
    assert snapshots.canonical(replayed) == live
    assert snapshots.canonical(restored) == live
    # ... and both go on to decide alike: another 300 cycles from the restarted state.
    again_full, _, acts_full = run(tmp_path / "full", 300, None, seed=2, lifetime=lifetime,
                                   start=5000.0)
    again_comp, _, acts_comp = run(tmp_path / "compacted", 300, 1000, seed=2,
                                   lifetime=lifetime, start=5000.0)
    assert len(acts_full) > 50
    assert acts_full == acts_comp
    assert snapshots.canonical(again_full.engine) == snapshots.canonical(again_comp.engine)
    again_full.store.close()
    again_comp.store.close()


def test_the_journal_stays_within_its_bound(tmp_path: Path) -> None:
    daemon, rows, _ = run(tmp_path / "s", 3000, 1000)
    per_cycle = daemon.counters.events / 3000
    assert daemon.counters.events > 25_000
    assert daemon.compactions >= 20
    assert max(rows) <= 1000, max(rows)  # compaction runs at the end of the cycle that crosses
    assert min(rows) <= per_cycle * 5
    daemon.compact()
    assert daemon.store.size_bytes("-wal") == 0  # the deletion's log space is given back
    daemon.store.close()


CRASHER = """
import os, sys
from malletrain_core.daemon.core import Daemon
from malletrain_core.daemon.store import Store
from malletrain_core.engine import Engine, EngineConfig
from malletrain_core.sim.churn import ChurnBackend
state, at = sys.argv[1], sys.argv[2]
daemon = Daemon(Engine(EngineConfig()), ChurnBackend(0), Store(state))
daemon.recover()
def step(name):
    if name == at:
        os._exit(17)  # no cleanup, no rollback: as a SIGKILL would leave it
daemon.compact(step)
os._exit(3)
"""


@pytest.mark.parametrize("at", COMPACTION_STEPS)
def test_a_crash_at_any_step_of_a_compaction_leaves_the_old_or_the_new_state(
        tmp_path: Path, at: str) -> None:
    state = tmp_path / "s"
    daemon, _, _ = run(state, 400, None)
    reference = snapshots.canonical(daemon.engine)
    rows = daemon.store.rows
    daemon.store.close()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-c", CRASHER, str(state), at], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 17, proc.stderr
    store = Store(state)
    saved, length = store.snapshot(), store.journal_length()
    store.close()
    if at == "done":  # the commit happened: the new state
        assert saved is not None and length == 0
    else:  # killed inside the transaction: the old state, untouched
        assert saved is None and length == rows
    assert snapshots.canonical(recovered(state)) == reference


def test_a_failed_compaction_rolls_back_and_the_daemon_goes_on(tmp_path: Path) -> None:
    daemon, _, _ = run(tmp_path / "s", 300, None)
    rows = daemon.store.rows

    def fail(name: str) -> None:
        if name == "truncate":
            raise OSError("injected")

    with pytest.raises(OSError):
        daemon.compact(fail)
    assert daemon.store.snapshot() is None and daemon.store.rows == rows
    daemon.cycle()  # the store is still usable
    assert daemon.compact() > rows
    reference = snapshots.canonical(daemon.engine)
    daemon.store.close()
    assert snapshots.canonical(recovered(tmp_path / "s")) == reference


def test_an_unwritable_snapshot_leaves_the_journal_and_is_retried_a_bound_later(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    daemon, _, _ = run(tmp_path / "s", 10, None)
    daemon.journal_max_events = 50

    def broken(engine: object) -> str:
        raise snapshots.SnapshotError("cannot snapshot")

    monkeypatch.setattr(snapshots, "snapshot", broken)
    while daemon.store.rows <= 50:
        daemon.cycle()
    assert daemon.compactions == 0
    first = daemon.store.rows
    assert daemon._compact_after == first + 50
    monkeypatch.undo()
    while daemon.compactions == 0:
        daemon.cycle()
        assert daemon.store.rows <= first + 50 + 100
    daemon.store.close()


def test_a_format_1_snapshot_names_only_this_package_s_classes() -> None:
    body = json.loads((ROOT / "tests" / "golden" / "snapshot_v1.json").read_text())
    state = body["engines"]["a100"]["state"]
    state["v"][0][1] = {"O": 999, "c": "os:system", "v": []}
    with pytest.raises(snapshots.SnapshotError, match="outside malletrain_core"):
        snapshots.restore(Engine(), json.dumps(body))
    with pytest.raises(snapshots.CorruptSnapshot, match="not JSON"):
        snapshots.restore(Engine(), "{")
    body["format"] = 99
    with pytest.raises(snapshots.UnknownFormat, match="format 99"):
        snapshots.restore(Engine(), json.dumps(body))


def test_journal_max_events_is_validated(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text("[daemon]\njournal_max_events = 10\n")
    with pytest.raises(ConfigError, match="journal_max_events: 10 must lie in"):
        load(path)
    path.write_text("[daemon]\njournal_max_events = 20000\n")
    assert load(path).daemon.journal_max_events == 20000
