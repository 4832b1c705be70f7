"""The stand-ins' HTTP server binds without a reverse DNS lookup of its address (tests/loopback_http.py)."""

from __future__ import annotations

import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.loopback_http import LoopbackServer


def test_a_stand_ins_server_binds_without_asking_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    def asked(name: str = "") -> str:
        raise AssertionError(f"asked DNS for the name of {name}")

    monkeypatch.setattr(socket, "getfqdn", asked)
    with pytest.raises(AssertionError, match=r"asked DNS for the name of 127\.0\.36\.1"):
        ThreadingHTTPServer(("127.0.36.1", 0), BaseHTTPRequestHandler)  # http.server's own: a lookup, 5 s when unanswered
    server = LoopbackServer(("127.0.36.1", 0), BaseHTTPRequestHandler)
    try:
        assert (server.server_name, server.server_port) == ("127.0.36.1", server.server_address[1])
    finally:
        server.server_close()
