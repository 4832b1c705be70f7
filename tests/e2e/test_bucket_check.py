"""The e2e tier of tests/unit/test_bucket_check.py (the same subject; its helpers are there)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from pathlib import Path

import pytest

from tests.conftest import Lab
from tests.gcs import Emulator
from tests.unit.test_bucket_check import URL

LAB_ADDRESS = "127.0.0.62"


def finding(lab: Lab) -> dict:
    doc = json.loads(lab.fab("check", "--json", timeout=240).stdout)
    return next(f for f in doc["findings"] if f["what"].startswith("bucket of lab"))


@pytest.fixture
def emulator(tmp_path: Path):
    emu = Emulator("ckpt", tmp_path / "emulator.log")
    yield emu
    emu.stop()


@pytest.mark.e2e
def test_the_host_writes_reads_and_deletes_through_the_emulator_and_a_missing_bucket_is_named(tmp_path: Path, emulator: Emulator) -> None:
    lab = Lab(tmp_path, LAB_ADDRESS, setenv=f"STORAGE_EMULATOR_HOST={emulator.url}")  # only the host's login has it
    try:
        stack = lab.stacks / "Pulumi.lab.yaml"
        stack.write_text(stack.read_text() + f"  gpu-train:bucket: {URL}\n")
        f = finding(lab)
        assert f["ok"] is True, f
        assert "wrote, read and deleted gs://ckpt/team/.gpu-train-runs/lab/.gpu-train-check-" in f["detail"]
        assert f"none needed: STORAGE_EMULATOR_HOST={emulator.url}" in f["detail"]
        assert emulator.objects() == {}  # nothing left behind

        stack.write_text(stack.read_text().replace(URL, "gs://nosuch/team"))
        f = finding(lab)
        assert f["ok"] is False and "no bucket nosuch" in f["detail"], f
        assert "gcloud storage buckets create gs://nosuch" in f["fix"]
    finally:
        lab.sshd.stop()


class Listener:
    """A loopback port that takes each connection and closes it, counting them (the metadata server's stand-in:
    none here answers, as on a machine outside Google Cloud)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.server.getsockname()[1]}"
        self.count = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.server.accept()
                self.count += 1
                conn.close()


@pytest.mark.e2e
def test_no_credentials_on_the_host_says_how_to_get_them(tmp_path: Path) -> None:
    metadata = Listener()
    # No emulator, no GOOGLE_APPLICATION_CREDENTIALS, a HOME of the sshd's own (no gcloud files): the real
    # google-auth looks for Application Default Credentials and finds none.
    lab = Lab(tmp_path, LAB_ADDRESS, setenv=f"GCE_METADATA_HOST={metadata.address} GCE_METADATA_IP={metadata.address}")
    try:
        stack = lab.stacks / "Pulumi.lab.yaml"
        stack.write_text(stack.read_text() + f"  gpu-train:bucket: {URL}\n")
        result = lab.fab("check", timeout=240)
        assert result.returncode == 1
        assert "no usable credentials on the host" in result.stdout, result.stdout
        assert "gcloud auth application-default login" in result.stdout
        assert "GOOGLE_APPLICATION_CREDENTIALS=/path/to/key.json" in result.stdout
        assert metadata.count > 0  # google-auth's metadata probe went here, to loopback, and nowhere else
    finally:
        lab.sshd.stop()
        metadata.server.close()
