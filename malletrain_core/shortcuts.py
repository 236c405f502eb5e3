"""The checked mode of the replay's exact shortcuts.

The engine and the allocator skip work where the answer is proven to be the one the full
computation gives: the DP reuses its last answer when the jobs are the same (``dp.reuse``) and
computes only the cells that the prices' bounds leave possible (``dp.bound``), the
store-learning check skips a job whose full-window scales and model's stored scales are
unchanged (``learning.unchanged``), a believed curve reads its prior's values from a memo
(``curves.prior_value``), checks that the measured ratios agree on the smallest and the
largest only (``curves.agree``) and, with every measured scale inside the prior's range,
scales the prior in its own order (``curves.in_range``); the DP takes each table's useful top
from its cache (``dp.tops``), the monitor does not rewrite the other scales' estimates with
the drift ratio they already have (``monitor.followed``), and placement looks at the jobs
whose count changes only (``placement.moves``). With :data:`CHECKED` set, every place where a shortcut is
taken computes the full answer too and raises :class:`ShortcutMismatch` where they differ;
:data:`counts` says how often each shortcut was taken (and so checked). ``bench.whatif
--verify`` and the tests replay in this mode.
"""

from __future__ import annotations

from collections import Counter

CHECKED = False
"""Compute the full answer beside every shortcut and compare."""
counts: Counter[str] = Counter()
"""Shortcut name -> how many times it was taken while :data:`CHECKED` was set."""


class ShortcutMismatch(AssertionError):
    """A shortcut gave another answer than the full computation (a bug: report it)."""


def check(name: str, fast: object, full: object) -> None:
    """Count the shortcut ``name`` and refuse an answer that differs from the full one."""
    counts[name] += 1
    if fast != full:
        raise ShortcutMismatch(f"{name}: the shortcut gave {fast!r}, the full computation "
                               f"{full!r}")
