"""The import rules of the package, checked on the source (no import is executed).

* No import cycle among modules (imports at module level).
* Arrows point down: the engine, allocator and shared vocabulary reach no backend, daemon,
  CLI, worker or development-cluster code; the worker side (``malletrain-run`` and the
  training API) reaches no daemon or backend code; the wire formats reach only the shared
  vocabulary. Function-local imports count for these rules too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "malletrain_core"
ROOT = "malletrain_core"

LAYERS = {
    # module prefix: prefixes it must never reach (directly or transitively)
    "malletrain_core.engine": ["backends", "daemon", "cli", "worker", "localcluster", "demo"],
    "malletrain_core.allocator": ["backends", "daemon", "cli", "worker", "localcluster",
                                  "demo", "engine", "sim"],
    "malletrain_core.model": ["backends", "daemon", "cli", "worker", "engine", "sim"],
    "malletrain_core.events": ["backends", "daemon", "cli", "worker", "engine", "sim"],
    "malletrain_core.worker": ["daemon", "backends", "localcluster", "cli", "engine",
                               "allocator", "sim", "demo"],
    "malletrain_core.wire": ["daemon", "backends", "localcluster", "cli", "engine",
                             "allocator", "sim", "demo", "worker"],
    "malletrain_core.backends": ["daemon", "cli", "worker", "engine", "allocator", "sim",
                                 "demo", "localcluster"],
    "malletrain_core.sim": ["daemon", "cli", "worker", "backends", "localcluster", "demo"],
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    mod = module_name(path)
    base = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.If) and top_level_only:  # TYPE_CHECKING blocks do not count
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith(ROOT)}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - node.level + 1]
                target = ".".join(anchor + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith(ROOT):
                continue
            for alias in node.names:  # "from pkg import module" names a module
                sub = f"{target}.{alias.name}"
                found.add(sub if MODULES.get(sub) else target)
    return found


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def graph(top_level_only: bool) -> dict[str, set[str]]:
    return {m: {t for t in imports(p, top_level_only) if t in MODULES and t != m}
            for m, p in MODULES.items()}


def reach(g: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in g[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_no_import_cycles() -> None:
    g = graph(top_level_only=True)
    cycles = sorted(m for m in g if m in reach(g, m) and not m.endswith("__init__"))
    # A package's __init__ importing its own modules is no cycle; anything else is.
    real = [m for m in cycles if any(m in reach(g, n) for n in g[m]
                                     if not m.startswith(n + ".") and not n.startswith(m))]
    assert real == [], f"modules on an import cycle: {real}"


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_arrows_point_down(layer: str) -> None:
    g = graph(top_level_only=False)
    banned = [f"{ROOT}.{b}" for b in LAYERS[layer]]
    bad = []
    for m in g:
        if m != layer and not m.startswith(layer + "."):
            continue
        for target in sorted(reach(g, m)):
            if any(target == b or target.startswith(b + ".") for b in banned):
                bad.append(f"{m} -> {target}")
    assert bad == [], f"{layer} reaches code above it: {bad[:10]}"


def test_the_rules_see_a_violation(tmp_path: Path) -> None:
    """The checker itself: an upward import is found."""
    g = {"malletrain_core.engine.x": {"malletrain_core.daemon.main"},
         "malletrain_core.daemon.main": set()}
    assert "malletrain_core.daemon.main" in reach(g, "malletrain_core.engine.x")
