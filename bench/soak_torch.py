#!/usr/bin/env python3
"""examples/train_elastic.py as bench/soak.py runs it: real torch training whose chief also
records how many progress reports it has sent, as examples/standin_worker.py does, so that the
soak compares every report sent with the reports the daemon received.

    python bench/soak_torch.py --sent-dir DIR -- [train_elastic.py flags]

(bench/soak.py runs it by its path inside each job; it imports no other bench module.)
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from malletrain_core.worker import training

REPO = Path(__file__).resolve().parents[1]


def _example(name: str) -> Any:
    """``examples/NAME.py`` (a script, not a package module) loaded by its path."""
    spec = importlib.util.spec_from_file_location(name, REPO / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


train_elastic = _example("train_elastic")


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
