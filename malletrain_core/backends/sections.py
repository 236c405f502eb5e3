"""The batch systems' sections of malletrain.toml, as one typed dataclass that
:class:`malletrain_core.config.Config` inherits.

A batch system with settings adds here the import of its options class (its package's
``options.py``) and one field named after its section; nothing in ``config.py`` names it.
The configuration is read by every layer, the worker's launcher too, before any backend, so this
module imports only the options leaves (``tests/test_layout.py`` keeps it so), never the
registry; the registry entry names the same section and class, and a test checks they agree.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .pbs.options import PbsOptions
from .slurm.options import SlurmOptions


@dataclass(frozen=True)
class BatchSystemSections:
    """One field a batch system with settings: its malletrain.toml section, with the defaults
    of its options class."""

    slurm: SlurmOptions = field(default_factory=SlurmOptions)
    pbs: PbsOptions = field(default_factory=PbsOptions)

    def validate_sections(self) -> None:
        """Each section's own checks (a one-line ConfigError naming the key at fault)."""
        for f in dataclasses.fields(BatchSystemSections):
            getattr(self, f.name).validate()


SECTIONS = tuple(f.name for f in dataclasses.fields(BatchSystemSections))
"""The section names, in the order of the fields."""
