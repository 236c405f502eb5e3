"""The daemon's memory over journal compactions: RSS after each of N compactions must not grow.

Drives a real :class:`~malletrain_core.daemon.core.Daemon` (real engine with a finished-job
retention, real SQLite store) with the seeded stand-in backend
:class:`~malletrain_core.sim.churn.ChurnBackend`, compacting every ``--bound`` events, and
records after each compaction the process's RSS, glibc's main heap (``mallinfo2``) and the
allocator's value-table cache. Flat: the RSS after the last compaction is at most
``--max-growth-mib`` above the RSS after the first quarter of them (warm-up).

    python -m bench.compaction_rss [--compactions 24] [--bound 5000] [--json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

if __name__ == "__main__" and not __package__:  # started as a file; bench/ is a package
    sys.exit("run it as a module from the repository's root: python -m bench.compaction_rss "
             + " ".join(sys.argv[1:]))
from bench.journal import Clock, rss_mib  # noqa: E402
from malletrain_core.allocator import dp  # noqa: E402
from malletrain_core.daemon.core import Daemon  # noqa: E402
from malletrain_core.daemon.store import Store  # noqa: E402
from malletrain_core.engine import Engine, EngineConfig  # noqa: E402
from malletrain_core.sim.churn import ChurnBackend  # noqa: E402


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def heap_mib() -> float | None:
    """glibc's main heap in use (``mallinfo2().uordblks``), or None elsewhere."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        return round(libc.mallinfo2().uordblks / 2**20, 2)
    except (OSError, AttributeError):
        return None


def run(compactions: int, bound: int, seed: int, retention_s: float) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="malletrain-compaction-rss-"))
    clock = Clock()
    store = Store(tmp / "state")
    d = Daemon(Engine(EngineConfig(done_retention_s=retention_s)), ChurnBackend(seed), store,
               clock=clock, tick_interval_s=5.0, journal_max_events=bound)
    rows: list[dict[str, Any]] = []
    try:
        while d.compactions < compactions:
            before = d.compactions
            d.cycle()
            clock.t += 2.0
            if d.compactions > before:
                rows.append({"compaction": d.compactions, "events": d.counters.events,
                             "rss_mib": round(rss_mib(), 2), "heap_mib": heap_mib(),
                             "cached_tables": len(dp._tables),
                             "jobs": len(d.engine.node_map)})
    finally:
        store.close()
        d.close()
    warm = rows[max(0, compactions // 4 - 1)]["rss_mib"]
    growth = rows[-1]["rss_mib"] - warm
    return {"compactions": compactions, "bound": bound, "seed": seed,
            "retention_s": retention_s, "rows": rows, "rss_after_warmup_mib": warm,
            "rss_last_mib": rows[-1]["rss_mib"], "growth_mib": round(growth, 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compactions", type=int, default=24)
    p.add_argument("--bound", type=int, default=5000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--retention-s", type=float, default=600.0)
    p.add_argument("--max-growth-mib", type=float, default=1.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.compactions < 4 or args.bound < 1:
        p.error("--compactions must be at least 4 and --bound at least 1")
    r = run(args.compactions, args.bound, args.seed, args.retention_s)
    if args.json:
        print(json.dumps(r, indent=1))
    else:
        print("compaction  events  RSS MiB  heap MiB  cached tables")
        for row in r["rows"]:
            print(f"{row['compaction']:>10}  {row['events']:>6}  {row['rss_mib']:>7.2f}  "
                  f"{row['heap_mib'] if row['heap_mib'] is not None else '-':>8}  "
                  f"{row['cached_tables']:>13}")
    flat = r["growth_mib"] <= args.max_growth_mib
    print(f"RSS after compaction {max(1, args.compactions // 4)}: "
          f"{r['rss_after_warmup_mib']:.2f} MiB, after {args.compactions}: "
          f"{r['rss_last_mib']:.2f} MiB ({r['growth_mib']:+.2f} MiB): "
          f"{'flat' if flat else 'GROWING'}", file=sys.stderr)
    return 0 if flat else 1


if __name__ == "__main__":
    sys.exit(main())
