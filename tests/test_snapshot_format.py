"""The on-disk snapshot format: a snapshot of every format version this one reads still loads
into the same state, and an unknown version is refused in one line.

``tests/golden/snapshot_v<N>.json`` is a snapshot of a router over two trainers' engines
(lifetime prediction on, so the reclaim predictor's counts are in it) after :data:`SCRIPT`:
jobs queued, profiling, running and finished, harvested and idle nodes, measured throughput
and rescale costs, and the model store. ``snapshot_v<N>.expected.json`` holds, as the code of
that version saw them in the engine that snapshot restores to, the public views and the
actions taken for :data:`LATER`. Both files are written by running this module as a script
with the version that wrote the format on the path::

    git worktree add ../format-1 07a42dd   # a commit that writes format 1
    PYTHONPATH=../format-1 python3 tests/test_snapshot_format.py
    git worktree remove ../format-1

Run with the current code, it rewrites the fixture of the current format (only when the
format is changed on purpose, with a new version number).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from malletrain_core import events as ev
from malletrain_core.config import from_mapping
from malletrain_core.daemon import codec
from malletrain_core.daemon import snapshot as snapshots
from malletrain_core.engine.build import make_engine
from malletrain_core.engine.planner import Planner
from malletrain_core.engine.router import trainers
from malletrain_core.model import Curve

GOLDEN = Path(__file__).resolve().parent / "golden"

CONFIG = {
    "allocator": {"lifetime": True},
    "profiler": {"window_s": 20.0},
    "daemon": {"finished_job_retention_s": 100_000.0},
    "trainer": [{"name": "a100", "nodes": "n[01-10]", "max_running_jobs": 4},
                {"name": "h100", "nodes": "n[11-14]", "lookahead_s": 600.0},
                {"name": "spare", "nodes": "n[19-20]"}],
}

JOBS = (
    ev.JobRequest("1", 1, 8, owner="ana", model="resnet"),
    ev.JobRequest("2", 1, 6, owner="ben", model="resnet"),
    ev.JobRequest("3", 2, 4, owner="ana", curve=Curve.of([1, 2, 4], [10.0, 19.0, 35.0])),
    ev.JobRequest("4", 1, 4, owner="cy", profile=False, scale_up_s=15.0),
    ev.JobRequest("5", 1, 3, owner="ben", model="vit"),
    ev.JobRequest("6", 1, 4, owner="cy", model="bert", trainer="h100"),
    ev.JobRequest("7", 1, 2, owner="ana", curve=Curve.of([1, 2], [5.0, 9.0]), trainer="h100"),
)


def rate(job_id: str, k: int) -> float:
    """Samples per second of job ``job_id`` on ``k`` nodes (a sublinear curve per job)."""
    return (40.0 + 7 * int(job_id)) * k ** 0.85


def script() -> list[list[ev.Event]]:
    """The batches that build the fixture's state: nodes offered and reclaimed, jobs submitted
    and ended, and every job holding nodes reporting its progress every 4 s."""
    batches: list[list[ev.Event]] = [[ev.NodesIdle(0.0, tuple(
        ev.IdleNode(f"n{i:02d}", 4000.0 if i in (3, 12) else None, "r1" if i <= 7 else "r2")
        for i in (*range(1, 15), 19, 20)))]]
    batches.append([ev.JobSubmitted(1.0, job) for job in JOBS])
    return batches


def drive(engine: Planner, start_s: float, stop_s: float, events: dict[float, list[ev.Event]],
          samples: dict[str, float]) -> list[Any]:
    """Every 4 s from ``start_s``: ``events`` due then, a tick and each running job's report;
    returns the actions taken, as the journal writes them."""
    actions: list[Any] = []
    t = start_s
    while t < stop_s:
        sizes: dict[str, int] = {}
        for job in engine.node_map.values():
            sizes[job] = sizes.get(job, 0) + 1
        batch: list[ev.Event] = list(events.get(t, []))
        batch.append(ev.Tick(t))
        for job, k in sorted(sizes.items()):
            samples[job] = samples.get(job, 0.0) + 4.0 * rate(job, k)
            batch.append(ev.ProgressReport(t, job, samples[job], k))
        actions += [codec.to_dict(a) for a in engine.handle_many(batch)]
        t += 4.0
    return actions


SCRIPT: dict[float, list[ev.Event]] = {
    90.0: [ev.NodesReclaimed(90.0, ("n02", "n12"))],
    130.0: [ev.NodesIdle(130.0, (ev.IdleNode("n02", None, "r1"), ev.IdleNode("n15", None, "r2")))],
    170.0: [ev.JobEnded(170.0, "3")],
    210.0: [ev.NodesReclaimed(210.0, ("n05", "n06", "n09"))],
    230.0: [ev.JobSubmitted(230.0, ev.JobRequest("9", 1, 4, owner="di", model="gpt", trainer="h100"))],
    238.0: [ev.JobSubmitted(238.0, ev.JobRequest("10", 1, 2, owner="di", model="vit"))],
}
LATER: dict[float, list[ev.Event]] = {
    262.0: [ev.NodesIdle(262.0, (ev.IdleNode("n05", 9000.0, "r1"), ev.IdleNode("n16", None, "r2")))],
    270.0: [ev.JobSubmitted(270.0, ev.JobRequest("8", 1, 4, model="resnet"))],
    290.0: [ev.NodesReclaimed(290.0, ("n01",)), ev.JobEnded(290.0, "1")],
}


def build() -> tuple[Planner, dict[str, float]]:
    """The fixture's engine after :func:`script` and :data:`SCRIPT` (up to 250 s)."""
    engine = make_engine(from_mapping(CONFIG).validate())
    for batch in script():
        engine.handle_many(batch)
    samples: dict[str, float] = {}
    drive(engine, 2.0, 250.0, SCRIPT, samples)
    return engine, samples


def fresh() -> Planner:
    return make_engine(from_mapping(CONFIG).validate())


def views(engine: Planner) -> dict[str, Any]:
    """What the daemon shows of an engine, as plain data (timings left out)."""
    jobs = {}
    for jid, v in sorted(engine.jobs.items()):
        jobs[jid] = {"phase": v.phase.value, "nodes": list(v.nodes),
                     "curve": None if v.curve is None else v.curve.to_dict(),
                     "measured": sorted(v.measured.items()), "costs": [v.scale_up_s, v.scale_down_s],
                     "trainer": engine.trainer_of_job(jid), "submitted": v.submitted}
    stats = {k: v for k, v in engine.stats.to_dict().items() if k != "solve_ms"}
    lifetimes = {}
    for name, one in (trainers(engine) or {}).items():
        lifetime = one.config.lifetime
        lifetimes[name] = None if lifetime is None else lifetime.to_dict()
    return json.loads(json.dumps({"jobs": jobs, "node_map": sorted(engine.node_map.items()),
            "idle": sorted(engine.idle_nodes), "hole_ends": sorted(engine.hole_ends.items()),
            "trainers": sorted((n, engine.trainer_of_node(n)) for n in
                               {*engine.node_map, *engine.idle_nodes}),
            "stats": stats, "lifetime": lifetimes}))


def expected(engine: Planner, samples: dict[str, float]) -> dict[str, Any]:
    """The views of ``engine`` and the actions it takes for :data:`LATER`."""
    seen = views(engine)
    return {"views": seen, "next": drive(engine, 250.0, 320.0, LATER, dict(samples))}


def load(version: int) -> tuple[str, dict[str, Any]]:
    text = (GOLDEN / f"snapshot_v{version}.json").read_text()
    return text, json.loads((GOLDEN / f"snapshot_v{version}.expected.json").read_text())


def write() -> None:
    """Write the fixture of the format the code on the path writes."""
    live, samples = build()
    text = snapshots.snapshot(live)
    restored = fresh()
    snapshots.restore(restored, text)
    version = json.loads(text)["format"]
    out = expected(restored, samples)
    assert out == expected(live, samples), "a restored engine differs from the live one"
    out["samples"] = sorted(samples.items())
    (GOLDEN / f"snapshot_v{version}.json").write_text(text + "\n")
    (GOLDEN / f"snapshot_v{version}.expected.json").write_text(
        json.dumps(out, indent=1, sort_keys=True) + "\n")
    phases = {k: v["phase"] for k, v in out["views"]["jobs"].items()}
    print(f"wrote snapshot_v{version}: {len(text)} bytes, jobs {phases}", file=sys.stderr)


VERSIONS = sorted(int(path.name.split("_v")[1].split(".")[0])
                  for path in GOLDEN.glob("snapshot_v*.expected.json"))


def test_every_format_read_has_its_fixture() -> None:
    assert VERSIONS == sorted(snapshots.READERS)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_snapshot_of_every_format_loads_into_the_state_its_code_saw(version: int) -> None:
    text, seen = load(version)
    engine = fresh()
    snapshots.restore(engine, text)
    assert views(engine) == seen["views"]
    assert drive(engine, 250.0, 320.0, LATER, dict(seen["samples"])) == seen["next"]


def test_every_format_restores_the_state_the_events_build_today() -> None:
    live, samples = build()
    restored = []
    for version in VERSIONS:
        engine = fresh()
        snapshots.restore(engine, load(version)[0])
        restored.append(snapshots.canonical(engine))
    assert restored == [snapshots.canonical(live)] * len(VERSIONS)
    assert sorted(samples.items()) == [tuple(p) for p in load(VERSIONS[-1])[1]["samples"]]


def test_the_format_written_is_the_fixture_s() -> None:
    """A field renamed inside the engine must not change what is written; a change of what a
    state dict holds is a new FORMAT with its own fixture (run this module as a script)."""
    text = load(snapshots.FORMAT)[0].strip()
    engine = fresh()
    snapshots.restore(engine, text)
    assert snapshots.snapshot(engine) == text


@pytest.mark.parametrize("version", [0, 99, "2", None])
def test_an_unknown_format_is_refused_in_one_line(version: object) -> None:
    body = json.loads(load(snapshots.FORMAT)[0])
    body["format"] = version
    with pytest.raises(snapshots.UnknownFormat, match=f"format {version!r}") as err:
        snapshots.restore(fresh(), json.dumps(body))
    assert "\n" not in str(err.value) and "batch system" in str(err.value)


def test_a_snapshot_that_does_not_fit_the_engine_is_refused_in_one_line() -> None:
    body = json.loads(load(snapshots.FORMAT)[0])
    del body["state"]["engines"]["h100"]["pool"]
    with pytest.raises(snapshots.SnapshotError, match="does not fit this engine .KeyError: 'pool'"):
        snapshots.restore(fresh(), json.dumps(body))
    with pytest.raises(snapshots.SnapshotError, match="state is of a router"):
        snapshots.restore(fresh().engines["a100"], json.dumps(body))  # type: ignore[attr-defined]


if __name__ == "__main__":
    write()
