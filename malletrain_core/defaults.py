"""Defaults shared by the settings (:mod:`.config`) and the model (:mod:`.model`), in a module
that imports nothing: the model needs no TOML loader for them, and the launcher
(``malletrain-run``, started on every newly idle node) reads the configuration without numpy."""

DEFAULT_LOOKAHEAD_S = 120.0
"""FreeTrain's look-ahead (the prototype used 10 s, shorter than one ~18 s scale-up)."""
