"""The ``[pbs]`` section of malletrain.toml: the PBS backend's settings, their defaults and their
checks, in one place.

A leaf module (it imports only the TOML helpers and the errors): :mod:`malletrain_core.config`
reads the section into a :class:`PbsOptions` without importing the backend, and the PBS
registry entry (:mod:`.system`) names it. The backend's own defaults and checks come from
here.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import ConfigError
from ...tomltables import positive


@dataclass(frozen=True)
class PbsOptions:
    """The ``[pbs]`` section (malletrain.toml documents each key); the backend's defaults
    (``DEFAULT_QUEUE``, ``grant_timeout_s``) are read from here."""

    queue: str = "mt_preemptable"
    command_timeout_s: float = 30.0
    grant_timeout_s: float = 30.0
    """A subjob ``qrun`` has not started after this long is a failed grow: ``qrun -H`` bypasses
    the scheduler, so a subjob runs within seconds or not at all. The one default: the
    backend's own comes from here."""
    bin_dir: str = ""
    job_key_file: str = ""
    """Where munge is absent: the site key from which each job's launcher secret is derived
    (pbs_hooks/install.sh --job-key-file writes it; docs/pbs.md). Empty: launchers use munge."""

    def validate(self) -> None:
        """The ``[pbs]`` section's own checks (one line naming the key); the backend runs them
        on its own arguments too, so they are written once."""
        if not self.queue.strip():
            raise ConfigError("pbs.queue is empty; name the preemptable execution queue "
                              "(pbs_hooks/install.sh makes mt_preemptable)")
        positive(("pbs.command_timeout_s", self.command_timeout_s))
        positive(("pbs.grant_timeout_s", self.grant_timeout_s), unit="seconds")
