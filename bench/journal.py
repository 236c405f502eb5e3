"""Journal compaction over a long run: the state database stays bounded, a restart is exact.

Drives a real :class:`~malletrain_core.daemon.core.Daemon` (real engine, real SQLite store on
disk) with the seeded stand-in backend :class:`~malletrain_core.sim.churn.ChurnBackend` (nodes
idle and reclaimed, jobs submitted and ending, workers lost, a progress report per running job
and poll) until ``--events`` events were journalled, with compaction at ``--bound`` events
(malletrain.toml's default unless told). Every ``--sample`` cycles it records the journal's
rows, the database's bytes on disk (with its write-ahead log), the last snapshot's bytes and the
process's RSS. A second daemon on the same seed journals the same events without compaction;
at the end both state databases are reopened into fresh engines and compared with the live
engine, state for state (``snapshot.canonical``).

    python -m bench.journal [--events 200000] [--bound 50000] [--markdown BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

if __name__ == "__main__" and not __package__:  # started as a file; bench/ is a package
    sys.exit("run it as a module from the repository's root: python -m bench.journal "
             + " ".join(sys.argv[1:]))
from bench.sections import host, replace_section  # noqa: E402
from malletrain_core.config import DaemonConfig  # noqa: E402
from malletrain_core.daemon import snapshot as snapshots  # noqa: E402
from malletrain_core.daemon.core import Daemon  # noqa: E402
from malletrain_core.daemon.store import Store  # noqa: E402
from malletrain_core.engine import Engine, EngineConfig  # noqa: E402
from malletrain_core.sim.churn import ChurnBackend  # noqa: E402

BEGIN, END = "<!-- journal:begin -->", "<!-- journal:end -->"


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def daemon(state: Path, seed: int, bound: int | None, clock: Clock) -> Daemon:
    return Daemon(Engine(EngineConfig()), ChurnBackend(seed), Store(state), clock=clock,
                  tick_interval_s=5.0, journal_max_events=bound)


def recovered(state: Path) -> Engine:
    store = Store(state)
    engine = Engine(EngineConfig())
    Daemon(engine, ChurnBackend(0), store).recover()
    store.close()
    return engine


def run(events: int, bound: int, seed: int, sample_every: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="malletrain-journal-"))
    clock = Clock()
    live = daemon(tmp / "compacted", seed, bound, clock)
    plain = daemon(tmp / "full", seed, None, clock)
    samples: list[dict[str, float]] = []
    compaction_s: list[float] = []
    cycles = 0
    t0 = time.perf_counter()
    last_report = t0
    while live.counters.events < events:
        before = live.compactions
        c0 = time.perf_counter()
        live.cycle()
        if live.compactions > before:
            compaction_s.append(time.perf_counter() - c0)
        plain.cycle()
        cycles += 1
        clock.t += 2.0
        if cycles % sample_every == 0:
            saved = live.store.snapshot()
            samples.append({"events": live.counters.events, "rows": live.store.rows,
                            "db_bytes": live.store.size_bytes(),
                            "db_file_bytes": live.store.size_bytes(""),
                            "wal_bytes": live.store.size_bytes("-wal"),
                            "snapshot_bytes": 0 if saved is None else len(saved[1]),
                            "rss_mib": round(rss_mib(), 1)})
        if time.perf_counter() - last_report > 10:
            last_report = time.perf_counter()
            print(f"{live.counters.events} events, {live.store.rows} rows, "
                  f"{live.compactions} compactions", file=sys.stderr)
    seconds = time.perf_counter() - t0
    # (Engine.jobs is not read during the run: its views fill the jobs' curve caches, which
    # the state comparison would then see in one engine and not in the other.)
    reference = snapshots.canonical(live.engine)
    jobs = len(live.engine.jobs)
    same_live = snapshots.canonical(plain.engine) == reference
    full_rows = plain.store.journal_length()
    full_bytes = plain.store.size_bytes()
    for d in (live, plain):
        d.store.close()
        d.close()
    t1 = time.perf_counter()
    from_snapshot = snapshots.canonical(recovered(tmp / "compacted")) == reference
    restart_snapshot_s = time.perf_counter() - t1
    t1 = time.perf_counter()
    from_full = snapshots.canonical(recovered(tmp / "full")) == reference
    restart_full_s = time.perf_counter() - t1
    for name in ("compacted", "full"):
        for f in (tmp / name).iterdir():
            f.unlink()
        (tmp / name).rmdir()
    tmp.rmdir()
    after_first = [s for s in samples if s["events"] > 2 * bound]
    return {
        "events": live.counters.events, "cycles": cycles, "bound": bound, "seed": seed,
        "seconds": round(seconds, 1), "compactions": live.compactions,
        "compaction_ms": {"max": round(max(compaction_s, default=0) * 1e3, 1),
                          "median": round(sorted(compaction_s)[len(compaction_s) // 2] * 1e3, 1)
                          if compaction_s else 0},
        "max_rows": max(s["rows"] for s in samples),
        "max_db_bytes": max(s["db_bytes"] for s in samples),
        "max_db_bytes_after_second_bound": max((s["db_bytes"] for s in after_first),
                                               default=None),
        "final_snapshot_bytes": samples[-1]["snapshot_bytes"],
        "final_jobs": jobs,
        "rss_mib": {"first": samples[0]["rss_mib"], "last": samples[-1]["rss_mib"]},
        "uncompacted": {"rows": full_rows, "db_bytes": full_bytes},
        "equal": {"uncompacted_live_engine": same_live,
                  "restart_from_compacted": from_snapshot, "restart_from_full_replay": from_full},
        "restart_s": {"compacted": round(restart_snapshot_s, 2),
                      "full_replay": round(restart_full_s, 2)},
        "samples": samples,
    }


def section(r: dict[str, Any]) -> str:
    eq = r["equal"]
    mib = 1024 * 1024
    samples = r["samples"]
    files = max(x.get("db_file_bytes", 0) for x in samples)
    wal = max(x.get("wal_bytes", 0) for x in samples)
    return "\n".join([
        BEGIN,
        f"Measured {r['date']} on {r['machine']}, with `{r['command']}`.",
        "",
        f"A real daemon (engine, SQLite store on disk) against a seeded stand-in batch system "
        f"with random churn (`ChurnBackend`): {r['events']} events in {r['cycles']} cycles, "
        f"{r['seconds']} s for both daemons below (niced, on a shared machine); compaction at {r['bound']} events ran {r['compactions']} times "
        f"(median {r['compaction_ms']['median']} ms, max {r['compaction_ms']['max']} ms, the "
        "cycle waits for it). A second daemon on the same seed journalled the same events "
        "without compaction.",
        "",
        "| | journal rows | state database on disk (file + log) |",
        "|---|---|---|",
        f"| compacted, largest sample over the run | {r['max_rows']} | "
        f"{r['max_db_bytes'] / mib:.1f} MiB (file ≤ {files / mib:.1f}, log ≤ {wal / mib:.1f}) |",
        f"| not compacted, at the end | {r['uncompacted']['rows']} | "
        f"{r['uncompacted']['db_bytes'] / mib:.1f} MiB |",
        "",
        f"The last snapshot is {r['final_snapshot_bytes'] / 1024:.0f} KiB for the "
        f"{r['final_jobs']} jobs the engine has seen: finished jobs stay in the engine's state, "
        "so the snapshot, the database file and the daemon's memory (RSS "
        f"{r['rss_mib']['first']} → {r['rss_mib']['last']} MiB) still grow with them, slowly; "
        "the journal does not. Restarted engines equal, state for state, to the live one: "
        f"from the compacted database {'yes' if eq['restart_from_compacted'] else 'NO'} "
        f"({r['restart_s']['compacted']} s), from the uncompacted one "
        f"{'yes' if eq['restart_from_full_replay'] else 'NO'} "
        f"({r['restart_s']['full_replay']} s). Samples: bench/results/journal.json.",
        END])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--bound", type=int, default=DaemonConfig().journal_max_events,
                   help="daemon.journal_max_events (default: the configuration's)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--sample", type=int, default=200, help="cycles between samples")
    p.add_argument("--markdown", metavar="FILE", help="rewrite the journal section of FILE")
    p.add_argument("--from-json", metavar="FILE",
                   help="no run: write the section from the JSON a previous run printed")
    args = p.parse_args(argv)
    if args.from_json:
        previous = json.loads(Path(args.from_json).read_text())
        if args.markdown:
            replace_section(Path(args.markdown), BEGIN, END, section(previous),
                            "Journal compaction over a long run")
        print(json.dumps(previous))
        return 0
    if args.events < 1 or args.bound < 1 or args.sample < 1:
        p.error("--events, --bound and --sample must be ≥ 1")
    result = run(args.events, args.bound, args.seed, args.sample)
    flags = list(argv if argv is not None else sys.argv[1:])
    result["command"] = "python -m bench.journal " + shlex.join(flags)
    result["machine"] = host()
    result["date"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if args.markdown:
        replace_section(Path(args.markdown), BEGIN, END, section(result),
                        "Journal compaction over a long run")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
