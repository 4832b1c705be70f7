"""The e2e tier of tests/unit/test_config.py (the same subject; its helpers are there)."""

from __future__ import annotations

import pytest

from gpu_train.stack.config import SshHost, parse_host


@pytest.mark.parametrize(
    ("text", "host"),
    [
        ("u@h:2200", SshHost("u", "h", 2200)),
        ("u@10.0.0.1", SshHost("u", "10.0.0.1", 22)),
        ("u@[::1]:2222", SshHost("u", "::1", 2222)),
        ("u@[fe80::1]", SshHost("u", "fe80::1", 22)),
    ],
)
def test_parse_host(text: str, host: SshHost) -> None:
    assert parse_host(text) == host
