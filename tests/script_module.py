"""Load a script of the checkout that is not a package module (bench/, examples/) by its path."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(relpath: str, name: str) -> ModuleType:
    """``ROOT/relpath`` imported as module ``name`` (registered in ``sys.modules``, so that its
    dataclasses and pickles resolve)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relpath)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
