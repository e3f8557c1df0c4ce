"""The test harness itself under pytest-xdist: a port that free_port() saw free but another process
bound before blobrefd did must not fail the test (Server.start moves to another free port)."""
import socket

import requests

from conftest import Server


def test_server_start_moves_off_a_port_taken_after_free_port(tmp_path):
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    try:
        srv = Server(tmp_path / "data")
        srv.port, srv.url = taken, f"http://127.0.0.1:{taken}"  # as if another worker won the race
        srv.start()
        try:
            assert srv.port != taken and srv.url == f"http://127.0.0.1:{srv.port}"
            assert requests.get(srv.url + "/readyz", timeout=5).status_code == 200
            log = srv.read_log()
            assert f"cannot listen on 127.0.0.1:{taken}: Address already in use" in log, log
        finally:
            assert srv.stop() == 0, srv.read_log()
    finally:
        squatter.close()


def test_a_server_that_fails_for_another_reason_still_fails(tmp_path):
    srv = Server(tmp_path / "data", config_text="[server]\nno_such_key = 1\n")
    try:
        srv.start()
    except RuntimeError as e:
        assert "no_such_key" in str(e), e
    else:
        srv.stop()
        raise AssertionError("blobrefd started with an unknown config key")
