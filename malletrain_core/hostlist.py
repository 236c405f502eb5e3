"""Slurm hostlists (``n[01-04,07]``): expand to node names and fold back.

A thin wrapper over ClusterShell's :class:`~ClusterShell.NodeSet.NodeSet`, restricted to the
syntax Slurm prints: bracketed ranges and comma-separated lists. ClusterShell's group
(``@name``) and set-operator (``!``, ``&``, ``^``) syntax is refused, so that a node name can
never be read as an expression. Expanded names come back sorted (ClusterShell's order), not
in the order of the input.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException

from .errors import ValidationError

EMPTY_MARKERS = frozenset({"", "(null)", "None", "N/A", "(none)"})
"""What Slurm prints where a hostlist is empty."""

_FORBIDDEN = set("@!&^*? \t\r\n\x00")
MAX_NODES = 1 << 20
"""The most names a hostlist may expand to (a short text must not make a process build a
hundred million names)."""


def _check(text: str) -> str:
    text = text.strip()
    bad = sorted(_FORBIDDEN.intersection(text))
    if bad:
        raise ValidationError("hostlist", repr(text), f"character(s) {''.join(bad)!r} are not "
                              "part of a Slurm hostlist; only names like n[01-04,07] are "
                              "accepted")
    return text


def bound(text: str, limit: int = MAX_NODES) -> int:
    """An upper bound of the names in a hostlist, computed without expanding it: stops
    counting a range once it passes ``limit``."""
    total, depth, element = 0, 0, ""
    for char in text + ",":
        depth += (char == "[") - (char == "]")
        if char != "," or depth:
            element += char
            continue
        count = 1
        for inner in re.findall(r"\[([^\]]*)\]", element):
            size = 0
            for piece in inner.split(","):
                lo, _, hi = piece.split("/")[0].partition("-")
                lo, hi = lo.strip(), hi.strip()
                if lo.isdigit() and hi.isdigit():
                    size += max(int(hi[:19]) - int(lo[:19]) + 1, 1) if len(hi) < 19 \
                        else limit + 1
                else:
                    size += 1
            count *= size
        total += count
        element = ""
    return total


def nodeset(text: str, max_nodes: int = MAX_NODES) -> NodeSet:
    """Parse a Slurm hostlist into a NodeSet (empty for Slurm's empty markers); refused when
    it would name more than ``max_nodes`` nodes."""
    if text.strip() in EMPTY_MARKERS:
        return NodeSet(resolver=RESOLVER_NOGROUP)
    text = _check(text)
    if bound(text, max_nodes) > max_nodes:
        raise ValidationError("hostlist", repr(text[:60]), f"names more than {max_nodes} nodes")
    try:
        return NodeSet(text, resolver=RESOLVER_NOGROUP)
    except (NodeSetException, ValueError, OverflowError, AssertionError) as exc:
        reason = " ".join(str(exc).split())[:80]
        raise ValidationError("hostlist", repr(text[:60]), f"bad hostlist: {reason}; write "
                              "names like n[01-04,07]") from None


def expand(text: str, max_nodes: int = MAX_NODES) -> list[str]:
    """Node names in a Slurm hostlist, e.g. ``n[01-03]`` → ``['n01', 'n02', 'n03']``."""
    return list(nodeset(text, max_nodes))


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
