"""The engine's allocation policy, by its registered name."""

from __future__ import annotations

from ..allocator import POLICIES, policy
from ..errors import ConfigError, ValidationError
from .config import Policy


def default_policy(solver: str = "auto") -> Policy:
    """The registered allocation policy ``solver`` (``malletrain_core.allocator.POLICIES``)."""
    try:
        return policy(solver)
    except ValidationError:
        raise ConfigError(f"engine: solver = {solver!r}: choose one of "
                          f"{', '.join(POLICIES)}") from None
