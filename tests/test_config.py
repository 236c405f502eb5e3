"""The configuration loader: defaults, precedence, and every kind of bad input."""

from __future__ import annotations

from typing import get_type_hints

import pytest

from malletrain_core import config
from malletrain_core.errors import ConfigError


def write(tmp_path, text):
    path = tmp_path / "malletrain.toml"
    path.write_text(text)
    return path


def test_documented_file_matches_defaults():
    documented = config.load(config.DOCUMENTED_DEFAULTS, env={})
    assert config.to_mapping(documented) == config.to_mapping(config.Config())


@pytest.mark.skipif(config.DEFAULT_PATH.exists(), reason="this host has a site config")
def test_missing_default_file_means_defaults():
    assert config.load(env={}) == config.Config()


def test_precedence_file_env_flag(tmp_path):
    path = write(tmp_path, "[daemon]\npoll_interval_s = 2\nmetrics_port = 1234\n")
    cfg = config.load(path, env={"MALLETRAIN_DAEMON_POLL_INTERVAL_S": "3"},
                      overrides={"daemon": {"metrics_port": 0}})
    assert cfg.daemon.poll_interval_s == 3.0
    assert cfg.daemon.metrics_port == 0
    assert cfg.allocator.lookahead_s == 120.0


def test_tables_and_lists(tmp_path):
    path = write(tmp_path, '[allocator]\nuser_max_nodes = { alice = 8 }\n'
                           '[daemon]\nadmin_users = ["root", "slurmadm"]\n')
    cfg = config.load(path, env={})
    assert cfg.allocator.user_max_nodes == {"alice": 8}
    assert cfg.daemon.admin_users == ("root", "slurmadm")


@pytest.mark.parametrize("text, message", [
    ("[daemon]\npoll_intervall_s = 2\n", "unknown key 'poll_intervall_s'"),
    ("[deamon]\n", "unknown section [deamon]"),
    ("[daemon]\napi_port = \"x\"\n", "daemon.api_port: 'x' is not an int"),
    ("[daemon]\napi_port = 70000\n", "is not a port number"),
    ("[daemon]\nbatch_system = \" \"\n", "daemon.batch_system is empty"),
    ("[allocator]\nuser_max_nodes = { alice = \"8\" }\n", "a table of whole numbers"),
    ("[allocator]\nmin_share = 2\n", "must lie in [0, 1]"),
    ("[epochs]\njoin_wait_s = -1.0\n", "epochs.join_wait_s: -1.0 must be a finite number ≥ 0"),
    ("[pbs]\nqueue = \" \"\n", "pbs.queue is empty; name the preemptable execution queue"),
    ("[pbs]\ngrant_timeout_s = 0\n", "pbs.grant_timeout_s: 0.0 must be a finite number of seconds"),
    ("[pbs]\ncommand_timeout_s = -1.0\n", "pbs.command_timeout_s: -1.0 must be a finite number"),
    ("[slurm]\ntask_failures_max = 0\n", "slurm.task_failures_max: 0 must be at least 1"),
    ("[daemon\n", "not valid TOML"),
    ("daemon = 3\n", "must be a table"),
])
def test_bad_files_name_the_problem(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        config.load(path, env={})
    assert message in str(err.value)
    assert str(path) in str(err.value) or "." in str(err.value)
    assert "\n" not in str(err.value)


def test_explicit_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        config.load(tmp_path / "nope.toml", env={})


def test_bad_environment_value(tmp_path):
    with pytest.raises(ConfigError, match="poll_interval_s"):
        config.load(write(tmp_path, ""), env={"MALLETRAIN_DAEMON_POLL_INTERVAL_S": "soon"})


def test_every_key_of_the_documented_file_has_its_own_comment():
    lines = config.DOCUMENTED_DEFAULTS.read_text().splitlines()
    undocumented = [line.split("=")[0].strip() for prev, line in zip([""] + lines, lines)
                    if "=" in line and not line.startswith("#") and not prev.startswith("#")]
    assert undocumented == []
    keys = {k for section in config.to_mapping(config.Config()).values() for k in section}
    documented = {line.split("=")[0].strip() for line in lines
                  if "=" in line and not line.startswith("#")}
    assert keys == documented


def test_bad_type_in_every_kind_of_field(tmp_path):
    cases = {'[daemon]\npoll_interval_s = "soon"\n': "daemon.poll_interval_s: 'soon' is not a float",
             "[profiler]\nenabled = 3\n": "profiler.enabled: 3 is not a bool",
             "[daemon]\nadmin_users = [1, 2]\n": "daemon.admin_users: [1, 2] is not a list of strings",
             "[slurm]\npartition = 5\n": "slurm.partition: 5 is not a str"}
    for text, message in cases.items():
        with pytest.raises(ConfigError) as err:
            config.load(write(tmp_path, text), env={})
        assert message in str(err.value) and str(tmp_path) in str(err.value)


def test_unknown_environment_key_is_rejected_by_name(tmp_path):
    with pytest.raises(ConfigError, match="unknown key 'metrics_prot'"):
        config.load(write(tmp_path, ""), env={"MALLETRAIN_DAEMON_METRICS_PROT": "1"})


def test_each_batch_systems_settings_are_its_entrys_and_a_field_of_the_config():
    """A batch system's section is declared once, on its registry entry (``section``,
    ``options``), and read by ``Config`` under that name with that class; every section of
    ``Config`` whose class lives in a backend's package belongs to one entry."""
    from typing import get_type_hints

    from malletrain_core.backends.registry import BATCH_SYSTEMS

    hints = get_type_hints(config.Config)
    declared = {e.section: e.options for e in BATCH_SYSTEMS.values() if e.section}
    assert declared and all(hints[name] is cls for name, cls in declared.items())
    owned = {name for name, cls in hints.items()
             if getattr(cls, "__module__", "").startswith("malletrain_core.backends.")}
    assert owned == set(declared)
    for name, cls in declared.items():
        assert cls is not None
        cls().validate()  # the defaults are valid
        assert f"[{name}]" in config.DOCUMENTED_DEFAULTS.read_text()


def test_every_batch_systems_section_is_validated_by_load(tmp_path):
    """``Config.validate`` runs each batch system's own checks (its options' ``validate()``),
    found from the fields of :class:`~malletrain_core.backends.sections.BatchSystemSections`,
    none named in config.py; each field is the section and class its registry entry names."""
    from malletrain_core.backends import sections
    from malletrain_core.backends.registry import BATCH_SYSTEMS

    marked = set(sections.SECTIONS)
    hints = get_type_hints(config.Config)
    assert {(e.section, e.options) for e in BATCH_SYSTEMS.values() if e.section} == {
        (name, hints[name]) for name in marked}
    calls = []

    class Counting:
        def __init__(self, name):
            self.name = name

        def validate(self):
            calls.append(self.name)

    config.Config(**{name: Counting(name) for name in marked}).validate()
    assert sorted(calls) == sorted(marked)
