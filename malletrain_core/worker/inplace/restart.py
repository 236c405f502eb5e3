"""The restart path under ``malletrain-run --inplace``, where there is no in-process path.

A torch or framework release the in-process path was not tested with, several processes per
node for the frameworks, or ``MALLETRAIN_INPROCESS=0``: the process waits for its membership,
sets what torchrun would (``MASTER_ADDR``, ``RANK``, ``WORLD_SIZE``, ...), and exits with
``training.RESTART_EXIT_CODE`` at every change; ``malletrain-run --inplace`` starts it again at
once, and it resumes from the last disk checkpoint like a restarted worker.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .. import training
from ..control import Membership, local_layout, read_membership, ready_name

RESTART_WAIT_S = 120.0  # how long a process whose peer failed waits for the next membership


def restart_in_place(why: str, poll_s: float = 0.05) -> None:
    """Take the restart path under ``malletrain-run --inplace`` (see the module doc): wait for
    this process's membership, set torchrun's variables for it, and watch for the next one."""
    control = Path(os.environ[training.ENV_CONTROL_DIR])
    local_rank, local_world = local_layout(os.environ)
    print(f"malletrain: {why}: this job takes the restart path (the process restarts at every "
          "membership change and resumes from the last checkpoint)", file=sys.stderr, flush=True)
    (control / ready_name(local_rank, local_world)).write_text(f"{os.getpid()}\n")
    node = read_membership(control)
    while node is None:
        time.sleep(poll_s)
        node = read_membership(control)
    if node.leave:
        sys.exit(0)
    m = node.for_process(local_rank, local_world)
    os.environ.update({
        "MASTER_ADDR": m.master, "MASTER_PORT": str(m.port), "RANK": str(m.rank),
        "WORLD_SIZE": str(m.world), "GROUP_RANK": str(node.rank),
        "GROUP_WORLD_SIZE": str(node.world), "ROLE_RANK": str(m.rank),
        "ROLE_WORLD_SIZE": str(m.world), "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world), training.ENV_EPOCH: str(m.epoch),
        "TORCHELASTIC_RUN_ID": os.environ.get(training.ENV_JOB, "malletrain")})
    if not os.environ.get(training.ENV_REPORT_ADDR):  # started ahead: the launcher wrote it
        try:
            addr, key = (control / training.REPORT_CHANNEL_NAME).read_text().split()
            os.environ.update({training.ENV_REPORT_ADDR: addr, training.ENV_REPORT_KEY: key})
        except (OSError, ValueError):
            pass

    def newer() -> Membership | None:
        new = read_membership(control)
        return new if new is not None and new.epoch > m.epoch else None

    def restart(new: Membership) -> None:
        sys.stdout.flush()
        sys.stderr.flush()  # the launcher starts this command again (see RESTART_EXIT_CODE)
        os._exit(0 if new.leave else training.RESTART_EXIT_CODE)

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            new = newer()
            if new is not None:
                restart(new)

    previous = sys.excepthook

    def crashed(kind: Any, value: Any, tb: Any) -> None:
        """A peer that left or was lost fails this process's collective, often before the new
        membership is read: wait for it (as torchrun's restart would), else the crash stands."""
        deadline = time.monotonic() + RESTART_WAIT_S
        while time.monotonic() < deadline:
            new = newer()
            if new is not None:
                restart(new)
            time.sleep(poll_s)
        previous(kind, value, tb)

    sys.excepthook = crashed
    threading.Thread(target=watch, name="malletrain-restart", daemon=True).start()
