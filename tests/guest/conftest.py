"""Fixtures of the `guest` tier: a booted systemd guest (tests/guest/harness.py) and its metadata server.

Every test under tests/guest/ is marked `guest` (`pytest -m "not guest"` leaves the tier out) and
skips, saying why, where the tier cannot run (not root, no systemd-nspawn, no root file system).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.guest.harness import Guest, MetadataServer, skip_reason

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.guest)


@pytest.fixture
def metadata_server() -> Iterator[MetadataServer]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    server = MetadataServer().start()
    yield server
    server.stop()


@pytest.fixture
def make_guest(tmp_path: Path, metadata_server: MetadataServer, public_key: Path) -> Iterator[Callable[..., Guest]]:
    """``make_guest(startup_script=..., user=..., nspawn_args=[...])``: a prepared (not yet booted)
    guest whose metadata serves ``startup_script``; every guest made is killed and removed afterwards."""
    guests: list[Guest] = []

    def make(startup_script: str = "", **kwargs) -> Guest:
        if startup_script:
            metadata_server.set("instance/attributes/startup-script", startup_script)
        guest = Guest(tmp_path / f"guest{len(guests)}", public_key.read_text(), metadata_server, **kwargs)
        guests.append(guest)
        return guest.prepare()

    yield make
    for guest in guests:
        guest.cleanup()
