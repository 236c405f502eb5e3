"""A short digest of a model's parameters, printed in the workers' log lines so that the
members of an epoch (and a joiner after its hand-over) can be seen to hold the same model.

Its own module because both :mod:`.elastic` (the restart path) and :mod:`.byo_inplace` (the
in-process path, which :mod:`.elastic` drives) print it; it needs no torch import of its own.
"""

from __future__ import annotations

import hashlib
from typing import Any


def params_digest(model: Any) -> str:
    """A short digest of every parameter's bytes (a ``torch.nn.Module``): equal models give
    equal digests."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:12]
