"""The read-only sub-commands' failures: one line and exit code 1 (usage errors 2), the
daemon down, bad configuration files, and the munge TCP path used from login nodes."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
from pathlib import Path

import pytest
from cli_daemon import build, serving

from malletrain_core.cli import main
from malletrain_core.daemon.api import Dispatcher, TcpApiServer
from malletrain_core.daemon.service import StatusService
from malletrain_core.munge import PrivateMunged

HINT = ": is it running? (systemctl status malletraind)\n"


@pytest.fixture(autouse=True)
def no_daemon_env(monkeypatch):
    monkeypatch.delenv("MALLETRAIN_DAEMON", raising=False)
    monkeypatch.delenv("MALLETRAIN_CONFIG", raising=False)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "malletrain.toml"
    path.write_text(text)
    return str(path)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", [["status"], ["jobs"], ["nodes"], ["profile", "7"]])
def test_daemon_down_is_one_line_exit_1(tmp_path, capsys, command):
    sock = tmp_path / "api.sock"
    config = write_config(tmp_path, f'[daemon]\napi_socket = "{sock}"\napi_port = 0\n')
    code, out, err = run(capsys, *command, "--config", config)
    assert (code, out) == (1, "")
    assert err == f"malletrain: error: cannot reach malletraind at {sock}{HINT}"


def test_socket_missing_falls_back_to_the_configured_tcp_address(tmp_path, capsys):
    sock, port = tmp_path / "api.sock", closed_port()
    config = write_config(tmp_path, f'[daemon]\napi_socket = "{sock}"\napi_host = "0.0.0.0"\n'
                                    f"api_port = {port}\n")
    code, _, err = run(capsys, "status", "--config", config)
    assert code == 1
    assert err == f"malletrain: error: cannot reach malletraind at {sock} or localhost:{port}{HINT}"


def test_explicit_daemon_address_goes_straight_to_tcp(tmp_path, capsys, monkeypatch):
    port = closed_port()
    monkeypatch.setenv("MALLETRAIN_DAEMON", f"127.0.0.1:{port}")
    config = write_config(tmp_path, "")
    code, _, err = run(capsys, "jobs", "--config", config)
    assert (code, err) == (1, f"malletrain: error: cannot reach malletraind at 127.0.0.1:{port}"
                              f"{HINT}")
    code, _, err = run(capsys, "jobs", "--config", config, "--daemon", "head01:notaport")
    assert code == 1 and "bad daemon address 'head01:notaport'" in err


@pytest.mark.parametrize("text, fragment", [
    ("[daemon]\napi_sockett = \"/x\"\n", "unknown key 'api_sockett'"),
    ("[daemon]\napi_port = \"many\"\n", "daemon.api_port: 'many' is not an int"),
    ("[daemon\n", "not valid TOML"),
])
def test_bad_config_is_one_line_exit_1(tmp_path, capsys, text, fragment):
    config = write_config(tmp_path, text)
    for command in ("status", "jobs", "nodes"):
        code, out, err = run(capsys, command, "--config", config)
        assert (code, out) == (1, "")
        assert err.startswith("malletrain: error: ") and fragment in err
        assert err.count("\n") == 1


def test_missing_config_file_is_one_line_exit_1(tmp_path, capsys):
    code, _, err = run(capsys, "nodes", "--config", str(tmp_path / "nope.toml"))
    assert code == 1 and "nope.toml: no such file" in err and err.count("\n") == 1


def test_debug_shows_the_traceback(tmp_path, capsys):
    config = write_config(tmp_path, f'[daemon]\napi_socket = "{tmp_path / "x.sock"}"\n'
                                    "api_port = 0\n")
    with pytest.raises(Exception, match="cannot reach malletraind"):
        main(["--debug", "status", "--config", config])


def test_usage_errors_keep_exit_code_2(capsys):
    for argv in (["jobs", "--state", "sleeping"], ["nodes", "--format", "node,flavour"],
                 ["profile"], ["admin"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2, argv
        assert "usage:" in capsys.readouterr().err


@pytest.fixture(scope="module")
def munged():
    if shutil.which("munged") is None:
        pytest.skip("munge not installed")
    directory = tempfile.mkdtemp(prefix="mt-cli-")
    Path(directory).chmod(0o755)
    try:
        with PrivateMunged(Path(directory) / "munge") as m:
            yield m
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_login_node_path_over_munge_tcp(tmp_path, capsys, munged):
    daemon, _, _ = build(tmp_path / "state")
    dispatcher = Dispatcher()
    StatusService(daemon).register(dispatcher)
    server = TcpApiServer(("127.0.0.1", 0), dispatcher, munged.client(), idle_timeout_s=5)
    server.start()
    try:
        config = write_config(tmp_path, f'[daemon]\napi_socket = "{tmp_path / "no.sock"}"\n'
                                        f'[munge]\nsocket = "{munged.socket}"\n')
        code, out, err = run(capsys, "jobs", "--json", "--config", config,
                             "--daemon", f"127.0.0.1:{server.port}")
    finally:
        server.close()
    assert (code, err) == (0, "")
    assert [r["job"] for r in json.loads(out)] == ["101", "102", "103"]


def test_daemon_side_refusal_is_one_line_exit_1(tmp_path, capsys):
    daemon, _, _ = build(tmp_path / "state")
    sock = tmp_path / "api.sock"
    config = write_config(tmp_path, f'[daemon]\napi_socket = "{sock}"\napi_port = 0\n')
    with serving(daemon, sock):
        code, out, err = run(capsys, "profile", "", "--config", config)
    assert (code, out) == (1, "")
    assert err == 'malletrain: error: profile needs a job id: {"job": "123"}\n'
