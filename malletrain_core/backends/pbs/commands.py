"""The PBS commands the backend runs, each with its arguments and what its failure means.

:class:`~.backend.PbsBackend` decides; this runs ``pbsnodes``, ``qstat``, ``qrun``, ``qrerun``
and ``qdel`` through the one runner (:mod:`malletrain_core.runner`) and reads their output with
:mod:`.parse`. A command that is not installed (CommandNotFound) always propagates: the daemon
cannot work without it. Any other failure of an action is logged and reported as ``False``:
the next poll shows the truth.
"""

from __future__ import annotations

import logging

from ...errors import CommandError, CommandNotFound, CommandTimeout
from ...runner import CommandRunner
from . import parse as pp

log = logging.getLogger(__name__)


class PbsCommands:
    """The commands of one backend, scoped to its queue."""

    def __init__(self, runner: CommandRunner, queue: str) -> None:
        self.runner = runner
        self.queue = queue

    def vnodes(self) -> dict[str, pp.PbsNode]:
        """``pbsnodes -a -F json``; a failure raises (the poll fails, and is tried again)."""
        argv = ["pbsnodes", "-a", "-F", "json"]
        return pp.parse_pbsnodes(self.runner.run(argv).stdout, argv)

    def fresh_vnodes(self) -> dict[str, pp.PbsNode] | None:
        """The vnodes as PBS shows them now, or None (logged) when pbsnodes did not answer."""
        try:
            return self.vnodes()
        except CommandNotFound:
            raise
        except CommandError as exc:
            log.warning("%s: grows go ahead on the last poll's view", exc)
            return None

    def jobs(self) -> dict[str, pp.PbsJob]:
        """The queue's arrays and their subjobs. Given a queue, ``qstat -t`` lists the subjobs
        but not their arrays (OpenPBS 23.06, measured): the arrays come from a second call
        without -t, both scoped to the queue."""
        argv = ["qstat", "-f", "-F", "json", self.queue]
        jobs = pp.parse_qstat(self.runner.run(argv).stdout, argv)
        argv = ["qstat", "-f", "-t", "-F", "json", self.queue]
        jobs.update(pp.parse_qstat(self.runner.run(argv).stdout, argv))
        return jobs

    def act(self, *argv: str) -> bool:
        """One ``qrun`` or ``qrerun``: True when PBS took it, False (logged) when it refused or
        did not answer."""
        try:
            self.runner.run(list(argv))
            return True
        except CommandNotFound:
            raise
        except CommandError as exc:  # CommandTimeout included
            log.warning("%s", exc)
            return False

    def qdel(self, array_id: str) -> bool:
        """``qdel`` an array: False when PBS did not answer (try again at the next poll); an
        array already gone, or a refusal (logged), is not tried again."""
        try:
            self.runner.run(["qdel", array_id])
        except CommandNotFound:
            raise
        except CommandTimeout as exc:
            log.warning("%s: retried at the next poll", exc)
            return False
        except CommandError as exc:
            if "Unknown Job Id" not in exc.stderr and "Job has finished" not in exc.stderr:
                log.warning("%s", exc)
        return True
