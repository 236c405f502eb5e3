#!/usr/bin/env python3
"""A stand-in for ``qmgr -c "<directive>"`` that records the hook directives install.sh sends.

Keeps the hooks it has created in ``$FAKE_QMGR_STATE`` (so ``list hook`` answers as a server
would), appends each directive to ``$FAKE_QMGR_STATE/log`` with file paths cut to their base
name, and keeps a copy of every imported file. Only hook directives are understood.
"""

import os
import shutil
import sys
from pathlib import Path

state = Path(os.environ["FAKE_QMGR_STATE"])
if len(sys.argv) != 3 or sys.argv[1] != "-c":
    sys.exit("usage: qmgr -c <directive>")
words = sys.argv[2].split()
verb, kind = words[0], words[1]
if kind != "hook":
    sys.exit(f"qmgr: unexpected object {kind!r} in {sys.argv[2]!r}")
hook = state / f"hook.{words[2]}"
if verb == "import":
    source = Path(words[5])
    if not source.is_file():
        sys.exit(f"qmgr: {source}: No such file")
    shutil.copy(source, state / f"{words[2]}.{source.name}")
    words[5] = source.name
with open(state / "log", "a") as log:
    log.write(" ".join(words) + "\n")
if verb == "list":
    if not hook.exists():
        print(f"qmgr obj={words[2]} svr=default: Unknown Hook", file=sys.stderr)
        sys.exit(1)
    print(f"Hook {words[2]}")
elif verb == "create":
    if hook.exists():
        sys.exit(f"qmgr obj={words[2]} svr=default: Duplicate entry in list")
    hook.touch()
elif verb == "delete":
    hook.unlink()
elif verb == "set" and not hook.exists():
    sys.exit(f"qmgr obj={words[2]} svr=default: Unknown Hook")
