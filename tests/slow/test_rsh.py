"""The slow tier of tests/unit/test_rsh.py (the same subject; its helpers are there)."""

from __future__ import annotations

import socket
import subprocess
import time

import pytest

from tests.unit.test_rsh import far_side, rsh


@pytest.mark.slow  # waits out rsh's 5 s bound
def test_a_far_side_that_half_closes_and_stops_reading_does_not_hold_rsh_for_good(tmp_path):
    # Its output ended (EOF to rsh) while rsh's send of our data is blocked: rsh gives up waiting for
    # that send's outcome after 5 s rather than hanging rsync with it.
    held: list[socket.socket] = []

    def serve(client: socket.socket) -> None:
        held.append(client)  # open, never read again
        client.recv(64)
        client.shutdown(socket.SHUT_WR)

    started = time.monotonic()
    proc = subprocess.run(rsh(far_side(tmp_path, serve)), input=b"x" * (8 << 20), capture_output=True, timeout=30)
    assert proc.returncode == 0 and proc.stderr == b""  # its command ended: the far side's word
    assert time.monotonic() - started < 15
