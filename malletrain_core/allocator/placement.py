"""Placement: node counts onto node names by the keep rule.

No job both gains and loses nodes: a shrinking job releases some of its own nodes, a growing
job keeps all of its nodes and takes free or released ones. Among candidates a growing job
prefers, where nodes carry a topology group, the fewest groups (its own groups first), and then
the longest remaining idle time (unknown counts as longest: no job is planned there). A
shrinking job releases its shortest-lived nodes, from its smallest groups first.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence

from .. import shortcuts
from ..errors import ValidationError
from ..model import Node


def _life(node: Node | None) -> float:
    if node is None or node.remaining_s is None:
        return math.inf
    return node.remaining_s


def place(counts: Mapping[str, int], current: Mapping[str, Sequence[str]],
          free: Iterable[Node], known: Mapping[str, Node] | None = None) -> dict[str, tuple[str, ...]]:
    """New node map for ``counts``.

    ``current``: job → nodes it holds now; ``free``: idle nodes nobody holds; ``known``: node
    name → :class:`Node` for held nodes (for their group and remaining time).
    """
    info: dict[str, Node] = dict(known or {})
    pool: list[Node] = []
    for n in free:
        info[n.name] = n
        pool.append(n)
    held = {name for nodes in current.values() for name in nodes}
    if not held.isdisjoint([n.name for n in pool]):
        dup = sorted(n.name for n in pool if n.name in held)
        raise ValidationError("placement", "free", f"node(s) {dup[:5]} are both free and held")

    result: dict[str, list[str]] = {}
    for job, nodes in current.items():
        want = int(counts.get(job, 0))
        mine = list(nodes)
        if want >= len(mine):
            result[job] = mine
            continue
        per_group: dict[str | None, int] = defaultdict(int)
        for name in mine:
            per_group[info[name].group if name in info else None] += 1

        def release_key(name: str, per_group: dict[str | None, int] = per_group
                        ) -> tuple[int, float, str]:
            node = info.get(name)
            group = node.group if node else None
            return (per_group[group], _life(node), name)

        mine.sort(key=release_key)
        drop = len(mine) - want
        for name in mine[:drop]:
            pool.append(info.get(name) or Node(name))
        result[job] = mine[drop:]

    need_total = sum(max(0, int(k) - len(result.get(j, ()))) for j, k in counts.items())
    if need_total > len(pool):
        raise ValidationError("placement", "counts", f"{need_total} nodes needed but only "
                              f"{len(pool)} free after shrinking")

    growers = sorted((j for j, k in counts.items() if int(k) > len(result.get(j, ()))),
                     key=lambda j: (-(int(counts[j]) - len(result.get(j, ()))), j))
    available: dict[str | None, list[Node]] = defaultdict(list)
    for node in pool:
        available[node.group].append(node)
    for group_nodes in available.values():  # _life inlined: every free node, every re-plan
        group_nodes.sort(key=lambda n: (-(math.inf if n.remaining_s is None else n.remaining_s),
                                        n.name))

    for job in growers:
        mine = result.setdefault(job, [])
        need = int(counts[job]) - len(mine)
        own_groups = {info[n].group for n in mine if n in info}
        while need > 0:
            groups = [g for g, nodes in available.items() if nodes]
            # Fewest groups: a group that fits the whole need, own groups first, then largest.
            group = min(groups, key=lambda g: (
                len(available[g]) < need, g not in own_groups,
                -len(available[g]) if len(available[g]) < need else len(available[g]),
                -_life(available[g][0]), str(g)))
            take = available[group][:need]
            del available[group][:need]
            mine.extend(n.name for n in take)
            own_groups.add(group)
            need -= len(take)
    return {job: tuple(sorted(nodes)) for job, nodes in result.items() if nodes}


def place_moves(counts: Mapping[str, int], holding: Mapping[str, Collection[str]],
                free: Sequence[Node], known: Mapping[str, Node] | None = None
                ) -> dict[str, tuple[str, ...]]:
    """:func:`place` for the jobs whose count differs from the nodes they hold (``holding``:
    job → its nodes), the node map of those jobs only.

    The same as :func:`place` over every job, for them: a job whose count stays keeps all its
    nodes and releases none, so it adds nothing to the nodes handed out, and a grower's
    preferences read only its own nodes and the pool. The engine re-plans with every running
    job, while a re-plan moves a few: this spares placement every held node each time.
    """
    moved = {job: k for job, k in counts.items() if k != len(holding.get(job, ()))}
    result = place(moved, {job: tuple(holding.get(job, ())) for job in moved}, free, known)
    if shortcuts.CHECKED:
        full = place(counts, {job: tuple(nodes) for job, nodes in holding.items()}, free, known)
        shortcuts.check("placement.moves", result, {j: n for j, n in full.items() if j in moved})
    return result
