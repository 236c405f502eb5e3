"""Slurm hostlists (``n[01-04,07]``): expand to node names and fold back.

A thin wrapper over ClusterShell's :class:`~ClusterShell.NodeSet.NodeSet`, restricted to the
syntax Slurm prints: bracketed ranges and comma-separated lists. ClusterShell's group
(``@name``) and set-operator (``!``, ``&``, ``^``) syntax is refused, so that a node name can
never be read as an expression. Expanded names come back sorted (ClusterShell's order), not
in the order of the input.
"""

from __future__ import annotations

from collections.abc import Iterable

from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException

from .errors import ValidationError

EMPTY_MARKERS = frozenset({"", "(null)", "None", "N/A", "(none)"})
"""What Slurm prints where a hostlist is empty."""

_FORBIDDEN = set("@!&^ \t\n")


def _check(text: str) -> str:
    text = text.strip()
    bad = sorted(_FORBIDDEN.intersection(text))
    if bad:
        raise ValidationError("hostlist", repr(text), f"character(s) {''.join(bad)!r} are not "
                              "part of a Slurm hostlist; write names like n[01-04,07]")
    return text


def nodeset(text: str) -> NodeSet:
    """Parse a Slurm hostlist into a NodeSet (empty for Slurm's empty markers)."""
    if text.strip() in EMPTY_MARKERS:
        return NodeSet(resolver=RESOLVER_NOGROUP)
    text = _check(text)
    try:
        return NodeSet(text, resolver=RESOLVER_NOGROUP)
    except NodeSetException as exc:
        raise ValidationError("hostlist", repr(text), f"{exc}; write names like "
                              "n[01-04,07]") from None


def expand(text: str) -> list[str]:
    """Node names in a Slurm hostlist, e.g. ``n[01-03]`` → ``['n01', 'n02', 'n03']``."""
    return list(nodeset(text))


def fold(names: Iterable[str]) -> str:
    """The shortest hostlist for ``names``, e.g. ``['n01', 'n02', 'n07']`` → ``n[01-02,07]``."""
    names = list(names)
    if not names:
        return ""
    for name in names:
        if not name or _FORBIDDEN.intersection(name) or set("[],").intersection(name):
            raise ValidationError("hostlist", repr(name), "is not a plain node name")
    try:
        return str(NodeSet.fromlist(names, resolver=RESOLVER_NOGROUP))
    except NodeSetException as exc:
        raise ValidationError("hostlist", repr(names[:3]), str(exc)) from None


def count(text: str) -> int:
    """How many nodes a hostlist names."""
    return len(nodeset(text))
