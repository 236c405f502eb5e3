"""``python -m pbs --hook -i IN [-o OUT] [-L DIR] [-l FILE] SCRIPT``: run one hook, like PBS.

The same command line as ``pbs_python --hook``, so the same fixture files drive this fake and a
real PBS installation. Each run is a fresh process, as PBS forks one per hook event. The hook
alarm (``pbs.event().alarm=N``) interrupts the script with KeyboardInterrupt after N seconds.
What PBS does after the script, this does too: ``accept()``/``reject()`` decide; a script that
ends without either accepts; an exception or an unhandled alarm rejects the request and is
logged. Exit status 0 when the hook ran (whatever it decided), 2 for a bad command line or
input file.

Unlike ``pbs_python``, which runs only job and execjob events offline, every event type is
accepted here, so periodic, modifyvnode and jobobit fixtures run too.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import traceback

import pbs
from pbs import _hookinput


def _alarm(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt("hook alarm")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pbs")
    parser.add_argument("--hook", action="store_true", required=True)
    parser.add_argument("-i", dest="input", required=True, help="event input file")
    parser.add_argument("-o", dest="output", help="hook execution record (default: stdout)")
    parser.add_argument("-L", dest="logdir", default=".", help="directory of the log file")
    parser.add_argument("-l", dest="logfile", help="log file (default: YYYYMMDD)")
    parser.add_argument("-e", dest="mask", help="log event mask (accepted, ignored)")
    parser.add_argument("script")
    args = parser.parse_args(argv)

    try:
        with open(args.input, encoding="utf-8") as fh:
            lines = _hookinput.read_lines(fh.read())
        event, fields = _hookinput.build_event(lines)
    except (OSError, _hookinput.HookInputError) as exc:
        print(f"python -m pbs: {args.input}: {exc}", file=sys.stderr)
        return 2
    try:
        with open(args.script, encoding="utf-8") as fh:
            code = compile(fh.read(), args.script, "exec")
    except (OSError, SyntaxError) as exc:
        print(f"python -m pbs: {args.script}: {exc}", file=sys.stderr)
        return 2

    logname = os.path.join(args.logdir, args.logfile or time.strftime("%Y%m%d"))
    pbs._LOG = open(logname, "a", encoding="utf-8")  # noqa: SIM115 - lives for the run
    pbs._EVENT = event
    object.__setattr__(event, "_running", True)
    alarm_s = int(fields.get("alarm", "0") or 0)
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(max(alarm_s, 0))
    what = f"{fields.get('type', '?')} hook '{event.hook_name}'"
    try:
        exec(code, {"__name__": "__main__", "__file__": args.script})
    except SystemExit:
        pass
    except KeyboardInterrupt:
        object.__setattr__(event, "_accepted", False)
        pbs.logmsg(pbs.LOG_ERROR, f"alarm call while running {what}, request rejected")
    except Exception:  # noqa: BLE001 - PBS turns any escaping exception into a rejection
        object.__setattr__(event, "_accepted", False)
        pbs.logmsg(pbs.LOG_ERROR, f"{what} encountered an exception, request rejected: "
                   + traceback.format_exc().strip().replace("\n", " | "))
    finally:
        signal.alarm(0)
        object.__setattr__(event, "_running", False)

    text = _hookinput.record(event)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    pbs._LOG.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
