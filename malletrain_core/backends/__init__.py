"""Backends: translate a batch system's state into engine events and execute its actions."""

from .base import Backend

__all__ = ["Backend"]
