"""The Prometheus endpoint: a real HTTP GET on an ephemeral port, values read from the daemon."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from cli_daemon import build, reclaim
from prometheus_client.parser import text_string_to_metric_families

from malletrain_core.daemon.api import Dispatcher
from malletrain_core.daemon.metrics import serve
from malletrain_core.daemon.service import attach
from malletrain_core.errors import ConfigError


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain")
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture
def daemon(tmp_path):
    return build(tmp_path / "state")


def test_metrics_over_http(daemon):
    d, backend, clock = daemon
    with serve(0, d, "127.0.0.1") as server:
        assert server.port > 0
        m = scrape(server.port)
        assert m[("malletrain_nodes", (("state", "held"),))] == 7
        assert m[("malletrain_nodes", (("state", "free"),))] == 1
        assert m[("malletrain_jobs", (("state", "running"),))] == 2
        assert m[("malletrain_jobs", (("state", "queued"),))] == 1
        assert m[("malletrain_rescales_total", (("direction", "up"),))] == 2
        assert m[("malletrain_rescales_total", (("direction", "down"),))] == 0
        assert m[("malletrain_preemptions_total", ())] == 0
        assert m[("malletrain_harvested_node_seconds_total", ())] == 7 * 50.0
        assert m[("malletrain_solver_duration_seconds_count", ())] == 1
        assert 0 < m[("malletrain_solver_duration_seconds_sum", ())] < 5
        assert m[("malletrain_daemon_cycles_total", ())] == 2
        assert m[("malletrain_actions_total", (("type", "grow"),))] == 4  # one per time limit
        assert m[("malletrain_last_poll_timestamp_seconds", ())] == clock.now

        reclaim(d, backend, clock, "n07", "n08")  # read live at the next scrape
        m = scrape(server.port)
        assert m[("malletrain_preemptions_total", ())] == 1
        assert m[("malletrain_nodes", (("state", "held"),))] + \
            m[("malletrain_nodes", (("state", "free"),))] == 6
        assert m[("malletrain_harvested_node_seconds_total", ())] > 7 * 50.0
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=2)


def test_port_in_use_is_one_line(daemon):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError) as err:
            serve(port, daemon[0], "127.0.0.1")
    assert f"daemon.metrics_port: cannot listen on 127.0.0.1:{port}" in str(err.value)
    assert "\n" not in str(err.value)


def test_attach_registers_the_ops_and_port_zero_turns_metrics_off(daemon):
    dispatcher = Dispatcher()
    assert attach(daemon[0], dispatcher, 0) is None
    assert dispatcher.ops() == ["jobs", "nodes", "profile", "status"]
