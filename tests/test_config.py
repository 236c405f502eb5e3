"""The configuration loader: defaults, precedence, and every kind of bad input."""

from __future__ import annotations

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
    ("[daemon]\nbatch_system = \"lsf\"\n", "use \"slurm\" or \"pbs\""),
    ("[allocator]\nuser_max_nodes = { alice = \"8\" }\n", "a table of whole numbers"),
    ("[allocator]\nmin_share = 2\n", "must lie in [0, 1]"),
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
