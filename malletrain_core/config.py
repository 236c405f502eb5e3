"""The daemon's configuration: one typed object, one documented defaults file.

Precedence: built-in defaults < the TOML file (``/etc/malletrain/malletrain.toml`` unless told
otherwise) < environment (``MALLETRAIN_<SECTION>_<KEY>``, e.g. ``MALLETRAIN_DAEMON_POLL_INTERVAL_S``)
< command-line flags. Unknown sections and keys are rejected by name, with the file, so a typo
never silently falls back to a default. ``malletrain_core/malletrain.toml`` documents every key
and is checked against these defaults by the tests.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python < 3.11 only
    import tomli as tomllib

from . import hostlist
from .backends.sections import BatchSystemSections
from .defaults import DEFAULT_LOOKAHEAD_S as DEFAULT_LOOKAHEAD_S
from .errors import ConfigError, MalleTrainError
from .tomltables import dataclass_from_table

DEFAULT_PATH = Path("/etc/malletrain/malletrain.toml")
DOCUMENTED_DEFAULTS = Path(__file__).with_name("malletrain.toml")


@dataclass(frozen=True)
class DaemonConfig:
    batch_system: str = "slurm"
    state_dir: str = "/var/lib/malletrain"
    hook_socket: str = "/run/malletrain/hook.sock"
    api_socket: str = "/run/malletrain/api.sock"
    api_host: str = "0.0.0.0"
    api_port: int = 7817
    advertise_host: str = ""
    poll_interval_s: float = 5.0
    idle_poll_interval_s: float = 60.0
    metrics_port: int = 9817
    log_level: str = "info"
    admin_users: tuple[str, ...] = ("root", "slurm")
    api_group: str = ""
    hook_group: str = "slurm"
    journal_max_events: int = 50_000
    finished_job_retention_s: float = 600.0


@dataclass(frozen=True)
class AllocatorConfig:
    lookahead_s: float = DEFAULT_LOOKAHEAD_S
    objective: str = "throughput"
    solver: str = "auto"
    max_running_jobs: int = 0
    min_share: float = 0.0
    user_max_nodes: Mapping[str, int] = field(default_factory=dict)
    lifetime: bool = False
    lifetime_fragments: str = ""


@dataclass(frozen=True)
class ProfilerConfig:
    enabled: bool = True
    window_s: float = 60.0
    default_scale_up_s: float = 20.0
    default_scale_down_s: float = 12.0


@dataclass(frozen=True)
class MungeConfig:
    socket: str = ""
    credential_ttl_s: int = 300


@dataclass(frozen=True)
class EpochsConfig:
    checkpoint_timeout_s: float = 60.0
    join_timeout_s: float = 20.0
    join_wait_s: float = 5.0
    launcher_timeout_s: float = 15.0
    max_failures: int = 10
    port_min: int = 29500
    port_max: int = 29999


@dataclass(frozen=True)
class TrainerConfig:
    """One of several trainers (``[[trainer]]``): an engine of its own over a disjoint node set.

    ``nodes`` is a hostlist; the one trainer that leaves it empty takes every node no other
    trainer names. ``solver``/``lookahead_s``/``max_running_jobs`` default to the
    ``[allocator]`` values (empty, 0 and -1 mean "as [allocator]"). A job picks its trainer
    with ``--comment=trainer=NAME``; a job that names none goes to the first trainer.
    """

    name: str = ""
    nodes: str = ""
    solver: str = ""
    lookahead_s: float = 0.0
    max_running_jobs: int = -1


TRAINER_NAME = re.compile(r"^[A-Za-z0-9_.+/-]{1,64}$")
"""What ``--comment=trainer=NAME`` can carry through job_submit.lua."""


@dataclass(frozen=True)
class Config(BatchSystemSections):
    """Every setting of ``malletraind``; see ``malletrain.toml`` beside this module. The batch
    systems' sections (``slurm``, ``pbs``) come from :class:`~.backends.sections.BatchSystemSections`."""

    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    allocator: AllocatorConfig = field(default_factory=AllocatorConfig)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
    munge: MungeConfig = field(default_factory=MungeConfig)
    epochs: EpochsConfig = field(default_factory=EpochsConfig)
    trainer: tuple[TrainerConfig, ...] = ()

    def validate(self) -> Config:
        """Cross-field checks; returns self for chaining."""
        d = self.daemon
        if not d.batch_system.strip():
            raise ConfigError("daemon.batch_system is empty; name the batch system, e.g. "
                              "\"slurm\" or \"pbs\"")
        if self.allocator.objective not in ("throughput", "speedup"):
            raise ConfigError(f"allocator.objective: {self.allocator.objective!r}; use "
                              "\"throughput\" or \"speedup\"")
        if not self.allocator.solver.strip() or self.allocator.solver == "pernode":
            raise ConfigError(f"allocator.solver: {self.allocator.solver!r}; use \"auto\", "
                              "\"dp\", \"milp\" or another registered policy (the per-node "
                              "MILP is a slow reference, not for the daemon)")
        a = self.allocator
        if a.lifetime and (a.min_share or a.user_max_nodes):
            raise ConfigError("allocator.lifetime = true cannot honour min_share or "
                              "user_max_nodes; set lifetime = false or drop those caps")
        if a.lifetime_fragments and not a.lifetime:
            raise ConfigError("allocator.lifetime_fragments is set but allocator.lifetime is "
                              "false; set lifetime = true to use it")
        if d.log_level.lower() not in ("debug", "info", "warning", "error"):
            raise ConfigError(f"daemon.log_level: {d.log_level!r}; use debug, info, warning "
                              "or error")
        for name, value in (("daemon.poll_interval_s", d.poll_interval_s),
                            ("daemon.idle_poll_interval_s", d.idle_poll_interval_s),
                            ("daemon.finished_job_retention_s", d.finished_job_retention_s),
                            ("allocator.lookahead_s", self.allocator.lookahead_s),
                            ("profiler.window_s", self.profiler.window_s),
                            ("munge.credential_ttl_s", self.munge.credential_ttl_s)):
            if not value > 0 or not math.isfinite(value):
                raise ConfigError(f"{name}: {value!r} must be a finite number > 0")
        for name, value in (("profiler.default_scale_up_s", self.profiler.default_scale_up_s),
                            ("profiler.default_scale_down_s",
                             self.profiler.default_scale_down_s),
                            ("allocator.max_running_jobs", self.allocator.max_running_jobs),
                            *((f"allocator.user_max_nodes.{user}", cap) for user, cap
                              in self.allocator.user_max_nodes.items())):
            if not value >= 0 or not math.isfinite(value):
                raise ConfigError(f"{name}: {value!r} must be a finite number ≥ 0")
        self.validate_sections()
        for name, port in (("daemon.api_port", d.api_port), ("daemon.metrics_port", d.metrics_port)):
            if not 0 <= port <= 65535:
                raise ConfigError(f"{name}: {port!r} is not a port number (0 turns it off)")
        e = self.epochs
        if not 1024 <= e.port_min <= e.port_max <= 65535:
            raise ConfigError(f"epochs.port_min/port_max: {e.port_min}-{e.port_max} must be "
                              "LO ≤ HI within 1024-65535")
        if e.checkpoint_timeout_s <= 0 or e.launcher_timeout_s <= 0 or e.join_timeout_s < 0:
            raise ConfigError("epochs: checkpoint_timeout_s and launcher_timeout_s must be > 0, "
                              "join_timeout_s ≥ 0")
        if not 0 <= e.join_wait_s < math.inf:
            raise ConfigError(f"epochs.join_wait_s: {e.join_wait_s!r} must be a finite number "
                              "≥ 0 (seconds a ready new node waits for the others)")
        if not 1000 <= d.journal_max_events <= 10_000_000:
            raise ConfigError(f"daemon.journal_max_events: {d.journal_max_events!r} must lie in "
                              "1000-10000000 (events kept before the journal is compacted)")
        if e.max_failures < 1:
            raise ConfigError(f"epochs.max_failures: {e.max_failures!r} must be ≥ 1")
        if not 0.0 <= self.allocator.min_share <= 1.0:
            raise ConfigError(f"allocator.min_share: {self.allocator.min_share!r} must lie in [0, 1]")
        self._validate_trainers()
        return self

    def _validate_trainers(self) -> None:
        names: set[str] = set()
        catch_all: list[str] = []
        owner: dict[str, str] = {}
        for t in self.trainer:
            if not TRAINER_NAME.match(t.name):
                raise ConfigError(f"[[trainer]] name {t.name!r}: give each trainer a name of "
                                  "letters, digits and _ . + / - (at most 64)")
            if t.name in names:
                raise ConfigError(f"[[trainer]] name {t.name!r} is used twice; names must differ")
            names.add(t.name)
            if t.solver.strip() == "pernode":
                raise ConfigError(f"trainer {t.name}: solver 'pernode' is a slow reference, "
                                  "not for the daemon")
            if t.lookahead_s < 0 or not math.isfinite(t.lookahead_s):
                raise ConfigError(f"trainer {t.name}: lookahead_s {t.lookahead_s!r} must be a "
                                  "finite number ≥ 0 (0: as [allocator])")
            if t.max_running_jobs < -1:
                raise ConfigError(f"trainer {t.name}: max_running_jobs {t.max_running_jobs!r} "
                                  "must be ≥ 0, or -1 for the [allocator] value")
            if not t.nodes.strip():
                catch_all.append(t.name)
                continue
            try:
                members = hostlist.expand(t.nodes)
            except MalleTrainError as exc:
                raise ConfigError(f"trainer {t.name}: nodes: {exc}") from None
            for node in members:
                if node in owner:
                    raise ConfigError(f"trainer {t.name}: node {node} is also trainer "
                                      f"{owner[node]}'s; node sets must be disjoint")
                owner[node] = t.name
        if len(catch_all) > 1:
            raise ConfigError(f"trainers {', '.join(catch_all)} leave nodes empty; at most one "
                              "trainer may take the nodes no other trainer names")


def from_mapping(data: Mapping[str, Any], source: str = "<config>") -> Config:
    """Build a :class:`Config` from nested tables (as TOML gives them)."""
    hints = get_type_hints(Config)
    sections: dict[str, Any] = {}
    for name, table in data.items():
        if name == "trainer":
            if not isinstance(table, list) or not all(isinstance(t, dict) for t in table):
                raise ConfigError(f"{source}: trainer must be an array of tables: write each "
                                  "trainer as a [[trainer]] section")
            sections[name] = tuple(dataclass_from_table(TrainerConfig, t, f"{source}: trainer[{i}]")
                                   for i, t in enumerate(table))
            continue
        if name not in hints:
            raise ConfigError(f"{source}: unknown section [{name}]; valid sections: "
                              f"{', '.join(hints)}")
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: [{name}] must be a table of keys")
        sections[name] = dataclass_from_table(hints[name], table, f"{source}: {name}")
    return Config(**sections)


def _environment(env: Mapping[str, str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    hints = get_type_hints(Config)
    for var, value in env.items():
        if not var.startswith("MALLETRAIN_"):
            continue
        rest = var[len("MALLETRAIN_"):].lower()
        for section in hints:
            if section != "trainer" and rest.startswith(section + "_"):
                out.setdefault(section, {})[rest[len(section) + 1:]] = value
                break
    return out


def load(path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None,
         overrides: Mapping[str, Mapping[str, Any]] | None = None) -> Config:
    """Load the configuration: defaults < file < environment < ``overrides`` (flags).

    ``path=None`` reads ``$MALLETRAIN_CONFIG`` or ``/etc/malletrain/malletrain.toml`` if it
    exists (a missing default file means built-in defaults); an explicit path must exist.
    """
    env = os.environ if env is None else env
    explicit = path is not None or "MALLETRAIN_CONFIG" in env
    file = Path(path) if path is not None else Path(env.get("MALLETRAIN_CONFIG", DEFAULT_PATH))
    merged: dict[str, dict[str, Any]] = {}
    if file.exists() or explicit:
        try:
            with open(file, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"{file}: no such file; create it (see {DOCUMENTED_DEFAULTS.name} "
                              "in the package for every key) or point --config elsewhere") from None
        except PermissionError:
            raise ConfigError(f"{file}: permission denied; make it readable by the daemon") from None
        except IsADirectoryError:
            raise ConfigError(f"{file}: is a directory; give the path of the TOML file") from None
        except OSError as exc:
            raise ConfigError(f"{file}: cannot read: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{file}: not valid TOML: {exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{file}: not valid TOML: not UTF-8 (byte {exc.start})") from None
        except RecursionError:
            raise ConfigError(f"{file}: not valid TOML: values nested too deeply") from None
        for name, table in data.items():
            merged[name] = dict(table) if isinstance(table, dict) else table
    source = str(file)
    for layer in (_environment(env), overrides or {}):
        for name, table in layer.items():
            base = merged.setdefault(name, {})
            if isinstance(base, dict):
                base.update(table)
    return from_mapping(merged, source).validate()


def to_mapping(config: Config) -> dict[str, dict[str, Any]]:
    """Plain nested dict (for ``malletrain status --json`` and the docs test)."""
    out: dict[str, dict[str, Any]] = {}
    for f in dataclasses.fields(config):
        section = getattr(config, f.name)
        if f.name == "trainer":
            out[f.name] = [dataclasses.asdict(t) for t in section]  # type: ignore[assignment]
            continue
        out[f.name] = {k: (list(v) if isinstance(v, tuple) else dict(v) if isinstance(v, Mapping)
                           else v) for k, v in dataclasses.asdict(section).items()}
    return out
