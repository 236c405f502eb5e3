#!/usr/bin/env python3
"""examples/train_elastic.py as bench/soak.py runs it: real torch training whose chief also
records how many progress reports it has sent, as examples/standin_worker.py does, so that the
soak compares every report sent with the reports the daemon received.

    python bench/soak_torch.py --sent-dir DIR -- [train_elastic.py flags]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples"))

import train_elastic  # noqa: E402

from malletrain_core.worker import training  # noqa: E402


def counting(sent_dir: Path) -> None:
    """Make every Session record its sent reports in ``sent_dir/<job>.<epoch>.<pid>``."""
    report = training.Session.report

    def counted(self: training.Session, samples: float, force: bool = False) -> None:
        seq = self._seq
        report(self, samples, force)
        if self._seq != seq and self.job_id:  # a send was attempted
            record = sent_dir / f"{self.job_id}.{self.epoch}.{os.getpid()}"
            tmp = record.with_name(f".{record.name}.tmp")
            tmp.write_text(str(self._seq - self.dropped_reports))
            os.replace(tmp, record)

    training.Session.report = counted  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sent-dir", required=True, type=Path)
    p.add_argument("rest", nargs=argparse.REMAINDER, help="-- then train_elastic.py's flags")
    args = p.parse_args(argv)
    rest: list[Any] = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    counting(args.sent_dir)
    return int(train_elastic.main(rest))


if __name__ == "__main__":
    sys.exit(main())
