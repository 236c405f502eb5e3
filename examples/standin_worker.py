#!/usr/bin/env python3
"""A stand-in training worker for load tests: no torch, no model, only progress reports.

It loops calling :meth:`malletrain_core.worker.training.Session.report` (``--interval-s`` apart, a
fixed number of samples per step) and, on the chief, records how many reports it has sent in
``DIR/<job>.<epoch>.<pid>`` after every send, so a load test can compare the reports the
workers sent with the reports the daemon received. It exits at once on SIGTERM, like a real
worker, and with 0 (training done) once ``--finish-dir`` holds a file named by its job id.
Run under ``malletrain-run`` (with examples/standin_torchrun.py as its torchrun).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from malletrain_core.worker import training  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sent-dir", required=True, help="where the chief records its sent count")
    p.add_argument("--interval-s", type=float, default=0.5, help="seconds between reports")
    p.add_argument("--samples", type=float, default=64.0, help="samples per step")
    p.add_argument("--finish-dir", help="exit 0 (training done) once DIR/<job id> exists")
    args = p.parse_args(argv)
    if args.interval_s <= 0:
        p.error("--interval-s must be > 0")
    session = training.Session(report_interval_s=args.interval_s)
    sends = (session.is_chief and bool(os.environ.get(training.ENV_REPORT_ADDR))
             and bool(os.environ.get(training.ENV_REPORT_KEY)) and bool(session.job_id))
    record = Path(args.sent_dir) / f"{session.job_id or 'none'}.{session.epoch}.{os.getpid()}"
    tmp = record.with_name(f".{record.name}.tmp")
    finish = Path(args.finish_dir) / (session.job_id or "none") if args.finish_dir else None
    calls = 0
    while finish is None or not finish.exists():
        session.report(args.samples * session.world_size, force=True)
        if sends:
            calls += 1
            tmp.write_text(str(calls - session.dropped_reports))
            os.replace(tmp, record)
        time.sleep(args.interval_s)
    return 0

if __name__ == "__main__":
    sys.exit(main())
